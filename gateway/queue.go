package gateway

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/warmpath/warmpath/gateway/admission"
	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/gateway/routing"
	"github.com/warmpath/warmpath/tenancy"
)

// admitter is the gateway's admission wiring: the fair queue (package
// admission; nil with queue.disabled), the backlog of the requests
// waiting in it (which routing prices), and the backlog's exchange with
// the other gateways.
type admitter struct {
	admit   admitFunc        // admitAll, or queued
	queue   *admission.Queue // nil: no fair queue (queue.disabled)
	waiting backlog          // requests waiting in admit, by model
	share   *backlogSync     // shares waiting with the other gateways; nil without a queue or Redis
	// scrape is the fleet's scrape interval (admission.Capacity.Track).
	scrape time.Duration
}

// newAdmitter returns the pass-through admission (every request at
// once); build adds the fair queue.
func newAdmitter() *admitter { return &admitter{admit: admitAll} }

// build builds the fair queue (unless cfg.Queue.Disabled) over fl and,
// with rdb, the backlog exchange with the other gateways.
func (a *admitter) build(cfg *Config, fl *fleet.Fleet, rdb redis.UniversalClient, labels *tenancy.Labeler,
	reg prometheus.Registerer, redisErrors *prometheus.CounterVec, log *slog.Logger) error {
	a.scrape = cfg.Health.ScrapeInterval
	if cfg.Queue.Disabled {
		return nil
	}
	var err error
	if a.queue, err = admission.New(cfg.Queue, fl, admission.Options{KeyPrefix: cfg.Redis.KeyPrefix, Redis: rdb,
		Labels: labels, Registerer: reg, Logger: log}); err != nil {
		return err
	}
	a.admit = admitFunc(a.queued)
	if rdb != nil {
		a.share = &backlogSync{b: &a.waiting, rdb: rdb, key: cfg.Redis.KeyPrefix + backlogHash, id: rand.Text(),
			every: cfg.Queue.SyncInterval, limit: cfg.Redis.Timeout, log: log.With("component", "backlog"),
			failed: func() { redisErrors.WithLabelValues("backlog").Inc() }}
	}
	return nil
}

// run starts the queue's and the backlog exchange's loops under eg.
func (a *admitter) run(ctx context.Context, eg *errgroup.Group) {
	if a.queue != nil {
		eg.Go(func() error { return a.queue.Run(ctx) })
	}
	if a.share != nil {
		eg.Go(func() error { return a.share.Run(ctx) })
	}
}

// wait admits r, counted among the waiting requests while it waits.
func (a *admitter) wait(ctx context.Context, r *turn) (func(request.Usage), error) {
	return a.waiting.wait(r, func() (func(request.Usage), error) { return a.admit(ctx, r) })
}

// queued is admission through the fair queue (package admission):
// a request whose placement binds it is routed as the queue considers it
// (routing.Placement.Place), and its wait is kept for routing and the debug
// headers.
func (a *admitter) queued(ctx context.Context, r *turn) (func(request.Usage), error) {
	var place func(*admission.Capacity) bool
	if p := r.Placement; p != nil && p.Bound() {
		place = p.Place
	}
	gr, err := a.queue.Admit(ctx, r.R, r.Estimate(), place)
	if err != nil {
		return nil, err
	}
	r.QueueWait = gr.Waited()
	return gr.Done, nil
}

// startPending counts the routed request r (routed by rt) as not
// started on the replica it is first sent to (admission.Capacity.Track);
// nil without a queue.
func (a *admitter) startPending(rt *routing.Route, r *turn) *admission.Pending {
	if a.queue == nil || len(rt.Plan.Order) == 0 {
		return nil
	}
	rep, _ := rt.Candidate(0)
	return a.queue.Capacity().Track(rep, rt.Reps, r.Class(), r.Stream(), a.scrape)
}

// firstByte is a pending request's first byte from rep: a streaming
// request there has left the engine's queue, which may give a waiting
// request room.
func (a *admitter) firstByte(p *admission.Pending, rep *fleet.Replica) {
	if p.FirstByte(rep) {
		a.queue.Kick()
	}
}

// capacity is the queue's judgment of the fleet's room; nil without a
// queue.
func (a *admitter) capacity() *admission.Capacity {
	if a.queue == nil {
		return nil
	}
	return a.queue.Capacity()
}

// waitingNow is the queue's waiting requests by model (the status
// page); nil without a queue.
func (a *admitter) waitingNow() map[string]int {
	if a.queue == nil {
		return nil
	}
	return a.queue.Waiting()
}

// replicaUpdated is the fleet's OnUpdate: a scrape or a recovery may have
// given a saturated model room.
func (a *admitter) replicaUpdated(*fleet.Replica) {
	if a.queue != nil {
		a.queue.Kick()
	}
}

// queueHeaders are the debug headers of admission: the class the request
// ran in and how long it waited in the queue, in milliseconds.
func queueHeaders(h http.Header, r *turn) {
	h.Set("X-Warmpath-Class", r.Class().String())
	h.Set("X-Warmpath-Queue-Ms", strconv.FormatFloat(float64(r.QueueWait)/float64(time.Millisecond), 'f', 1, 64))
}

// refill re-checks the queue (fairq.Queue.Refill) once a request it
// dispatched without a place has reached its replica: until then the
// request held the model's room (counted in the queue's inflight, not yet
// in the replica's), and where it went may have had none (the fallback
// goes to a replica without room), so the room it held may still be free,
// on a replica no candidate's routing chose when it left. Nothing else
// would look again before the next scrape, finished request or recheck.
func (a *admitter) refill(r *turn) {
	if a.queue != nil && r.QueueWait > 0 && !r.Placement.Placed() {
		a.queue.Refill()
	}
}
