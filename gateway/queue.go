package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/tenancy"
	"github.com/warmpath/warmpath/tenancy/fairq"
)

// QueueConfig configures the gateway's admission queue (package
// tenancy/fairq): while every replica serving a model is saturated,
// requests wait in the gateway, in per-tenant weighted fair queues with
// turn priority, and are routed only when they leave. The zero value is
// the default: the queue on, policy fair.
type QueueConfig struct {
	// Disabled turns the queue off: every request is routed at once and
	// the engines see arrival order (the fifo baseline).
	Disabled bool `yaml:"disabled"`
	// Policy is fair (default: class priority with a guaranteed
	// background share, weighted fair sharing across tenants, turns in
	// progress first) or strict (interactive strictly before background,
	// first come first served, no tenant fairness).
	Policy string `yaml:"policy"`
	// BackgroundShare is the share of the dispatches made while both
	// classes wait that goes to background, so it always progresses;
	// default 0.1. Negative means 0.
	BackgroundShare float64 `yaml:"background_share"`
	// MaxQueued bounds the requests waiting in this gateway; default
	// 5000. Past it a request is refused with 429 and Retry-After.
	MaxQueued int `yaml:"max_queued"`
	// MaxQueuedPerTenant bounds one tenant's waiting requests; default
	// 1000.
	MaxQueuedPerTenant int `yaml:"max_queued_per_tenant"`
	// Timeout is the longest a request waits before a 429; default 60s.
	Timeout time.Duration `yaml:"timeout"`
	// OutputWeight is what an output token costs in a tenant's virtual
	// counter relative to a prompt token that is not a cache hit; default
	// 2.
	OutputWeight float64 `yaml:"output_weight"`
	// AgeCredit is the tokens of attained service one second of waiting
	// forgives when ordering a tenant's turns; default 1000. Negative
	// means 0.
	AgeCredit float64 `yaml:"age_credit"`
	// ScanDepth is how many waiting requests, in the queue's order, a
	// dispatch considers when the first cannot start at once on the
	// replica its routing chooses (that replica has no room while another
	// has): the first whose replica has room goes; default 8.
	ScanDepth int `yaml:"scan_depth"`
	// SyncInterval is how often the virtual counters are exchanged with
	// Redis (one round trip for all), so shares hold across gateways;
	// default 100ms.
	SyncInterval time.Duration `yaml:"sync_interval"`
	// RecheckInterval is how often capacity is re-checked besides the
	// checks on every scrape, every finished request and every streaming
	// request's first token; default 100ms.
	RecheckInterval time.Duration `yaml:"recheck_interval"`
	// VLLMPriority sends a background request's class to vLLM as
	// "priority": 1 (interactive is vLLM's default 0), so interactive
	// turns also go first inside an engine. Only for engines run with
	// --scheduling-policy priority: others answer 400. Default off.
	VLLMPriority bool `yaml:"vllm_priority"`
	// Saturation says when a model's replicas have room.
	Saturation QueueSaturation `yaml:"saturation"`
}

// QueueSaturation judges, per model and class, whether its replicas can
// start another request. A replica is available unless it is unhealthy,
// failing (a request sent to it or its health check failed since its last
// success, before health.failures marks it unhealthy), its metrics are
// stale (stale metrics count as saturated) or it is past routing's
// thresholds (routing.max_waiting, max_kv_usage,
// max_inflight_prefill_tokens). The model has room for a request when
// Σ max(0, room_r) over its available replicas exceeds the requests
// already admitted but not routed yet, where
//
//	room_r = EngineWaiting − queued_r                          interactive
//	room_r = EngineWaiting − pending_r                         interactive, with vllm_priority
//	room_r = BackgroundEngineWaiting − waiting'_r              background, while kv_r < BackgroundMaxKVUsage (else 0)
//	queued_r = max(waiting'_r, notstarted_r)
//	waiting'_r = waiting_r + sent_r − started_r (started_r taking it to 0 at most)
//
// waiting_r and kv_r are the replica's engine queue and KV-cache use as
// last scraped; sent_r is what this gateway sent it since that scrape net
// of what finished since (negative when more finished: each finished
// request freed a place a waiting one takes, so dispatch follows
// completions rather than the next scrape); started_r is this gateway's
// streaming requests on it whose first token came since that scrape and
// that are still running (they have left its engine queue, so room opens
// at a first token rather than at the next scrape); notstarted_r is this
// gateway's requests on it that have not started (no first byte yet),
// which a scrape taken before the engine saw them would miss (a
// non-streaming answer's first byte is its end, so a non-streaming
// request counts for two scrape intervals at most, after which a scrape
// taken since the engine saw it tells: counting it until it finished
// capped a replica at EngineWaiting such requests in flight, however
// many the engine could run); pending_r
// is the interactive ones among them: an engine that schedules by
// priority serves those before any background work, so only they are
// ahead. With MaxRunning set, room_r is also at
// most MaxRunning − (running_r + sent_r). Background sees less room so
// that interactive turns find an engine able to start them at once: KV
// blocks free (few background requests sit in an engine queue, where the
// engine would hand them the blocks it frees) and a short queue. And
// while interactive traffic lasts, InteractiveReserve replicas take no
// background at all (their room is not counted for it, and routing does
// not offer them to it): an engine steps through every running request's
// prefill chunk before a newly arrived one, whatever its priority (vLLM
// preempts only for KV blocks, never for a waiting request), so an
// interactive turn that lands beside a long background prefill waits out
// that prefill; on a reserved replica there is none.
type QueueSaturation struct {
	// EngineWaiting is the engine queue a replica may have and still take
	// more; default 4. Higher keeps engines busier through scrape lag,
	// lower leaves more of the order to the gateway.
	EngineWaiting int `yaml:"engine_waiting"`
	// BackgroundEngineWaiting is EngineWaiting for background requests;
	// default 1.
	BackgroundEngineWaiting int `yaml:"background_engine_waiting"`
	// BackgroundMaxKVUsage is the KV-cache use (0..1] at or above which a
	// replica takes no background requests, keeping the rest for
	// interactive turns; default 0.9. Negative disables the headroom
	// (background sees the same room as interactive).
	BackgroundMaxKVUsage float64 `yaml:"background_max_kv_usage"`
	// MaxRunning, when positive, is the batch size (vLLM's
	// --max-num-seqs) at which a replica has no room; default 0, not
	// judged (a full batch shows as a waiting queue anyway).
	MaxRunning int `yaml:"max_running"`
	// InteractiveReserve is how many of a model's replicas are kept for
	// interactive turns while interactive traffic lasts: a replica joins
	// the reserve when this gateway sends it an interactive request and
	// fewer are reserved (never all of the model's replicas), and leaves
	// it ReserveIdle after its last one. Background requests are not
	// routed to a reserved replica (unless no other is healthy), so an
	// interactive turn there never waits behind a background prefill;
	// default 1. Negative disables the reserve.
	InteractiveReserve int `yaml:"interactive_reserve"`
	// ReserveIdle is how long a reserved replica stays reserved after
	// the last interactive request this gateway sent it; default 60s.
	ReserveIdle time.Duration `yaml:"reserve_idle"`
}

// Defaults of QueueSaturation.
const (
	DefaultEngineWaiting           = 4
	DefaultBackgroundEngineWaiting = 1
	DefaultBackgroundMaxKVUsage    = 0.9
	DefaultInteractiveReserve      = 1
	DefaultReserveIdle             = 60 * time.Second
)

// withDefaults returns q with every zero field at its default.
func (q QueueConfig) withDefaults() QueueConfig {
	if q.Policy == "" {
		q.Policy = fairq.DefaultPolicy
	}
	if q.BackgroundShare == 0 {
		q.BackgroundShare = fairq.DefaultBackgroundShare
	}
	if q.MaxQueued == 0 {
		q.MaxQueued = fairq.DefaultMaxQueued
	}
	if q.MaxQueuedPerTenant == 0 {
		q.MaxQueuedPerTenant = fairq.DefaultMaxQueuedPerTenant
	}
	if q.Timeout == 0 {
		q.Timeout = fairq.DefaultTimeout
	}
	if q.OutputWeight == 0 {
		q.OutputWeight = fairq.DefaultOutputWeight
	}
	if q.AgeCredit == 0 {
		q.AgeCredit = fairq.DefaultAgeCredit
	}
	if q.ScanDepth == 0 {
		q.ScanDepth = fairq.DefaultScanDepth
	}
	if q.SyncInterval == 0 {
		q.SyncInterval = fairq.DefaultSyncInterval
	}
	if q.RecheckInterval == 0 {
		q.RecheckInterval = fairq.DefaultRecheckInterval
	}
	if q.Saturation.EngineWaiting == 0 {
		q.Saturation.EngineWaiting = DefaultEngineWaiting
	}
	if q.Saturation.BackgroundEngineWaiting == 0 {
		q.Saturation.BackgroundEngineWaiting = DefaultBackgroundEngineWaiting
	}
	if q.Saturation.BackgroundMaxKVUsage == 0 {
		q.Saturation.BackgroundMaxKVUsage = DefaultBackgroundMaxKVUsage
	}
	if q.Saturation.InteractiveReserve == 0 {
		q.Saturation.InteractiveReserve = DefaultInteractiveReserve
	}
	if q.Saturation.ReserveIdle == 0 {
		q.Saturation.ReserveIdle = DefaultReserveIdle
	}
	return q
}

// validate checks a defaulted queue configuration; errors name the field.
func (q *QueueConfig) validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("config: queue.%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if q.Policy != fairq.PolicyFair && q.Policy != fairq.PolicyStrict {
		bad("policy", "%q is not %s or %s", q.Policy, fairq.PolicyFair, fairq.PolicyStrict)
	}
	if !(q.BackgroundShare <= 1) {
		bad("background_share", "%v is not a fraction", q.BackgroundShare)
	}
	if !(q.OutputWeight >= 0) {
		bad("output_weight", "%v is negative", q.OutputWeight)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"max_queued", q.MaxQueued}, {"max_queued_per_tenant", q.MaxQueuedPerTenant}, {"scan_depth", q.ScanDepth}, {"saturation.max_running", q.Saturation.MaxRunning}} {
		if f.v < 0 {
			bad(f.name, "%d is negative", f.v)
		}
	}
	if q.Saturation.EngineWaiting < 1 {
		bad("saturation.engine_waiting", "%d is below 1", q.Saturation.EngineWaiting)
	}
	if w := q.Saturation.BackgroundEngineWaiting; w < 1 || w > q.Saturation.EngineWaiting {
		bad("saturation.background_engine_waiting", "%d is not in [1, engine_waiting]", w)
	}
	if kv := q.Saturation.BackgroundMaxKVUsage; kv > 1 || math.IsNaN(kv) {
		bad("saturation.background_max_kv_usage", "%v is not in (0, 1] (negative disables)", kv)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"timeout", q.Timeout}, {"sync_interval", q.SyncInterval}, {"recheck_interval", q.RecheckInterval}, {"saturation.reserve_idle", q.Saturation.ReserveIdle}} {
		if d.v < 0 {
			bad(d.name, "%v is negative", d.v)
		}
	}
	return errs
}

// fairqConfig translates the configuration for fairq.New.
func (q *QueueConfig) fairqConfig(keyPrefix string, label func(string) string) fairq.Config {
	return fairq.Config{
		Policy:             q.Policy,
		BackgroundShare:    q.BackgroundShare,
		MaxQueued:          q.MaxQueued,
		MaxQueuedPerTenant: q.MaxQueuedPerTenant,
		Timeout:            q.Timeout,
		OutputWeight:       q.OutputWeight,
		AgeCredit:          q.AgeCredit,
		ScanDepth:          q.ScanDepth,
		KeyPrefix:          keyPrefix,
		SyncInterval:       q.SyncInterval,
		RecheckInterval:    q.RecheckInterval,
		Label:              label,
	}
}

// queueAdmitter is the Admitter backed by the fair queue. The queue's
// Capacity is the fleet's (fleetCapacity); its Run goroutine is started by
// the gateway's Run.
type queueAdmitter struct {
	q        *fairq.Queue
	capacity *fleetCapacity
	fleet    *fleet.Fleet
	labels   *tenancy.Labeler
	names    sync.Map // tenant ID → tenant name, for metric labels
}

var _ Admitter = (*queueAdmitter)(nil)

// newQueueAdmitter builds the queue over the fleet. rdb, when not nil,
// shares the tenants' virtual counters with the other gateways; labels
// bounds the tenant label of the queue's metrics.
func newQueueAdmitter(cfg *Config, fl *fleet.Fleet, rdb redis.UniversalClient, labels *tenancy.Labeler, reg prometheus.Registerer, log *slog.Logger) (*queueAdmitter, error) {
	a := &queueAdmitter{fleet: fl, labels: labels, capacity: &fleetCapacity{fleet: fl, sat: cfg.Queue.Saturation, priority: cfg.Queue.VLLMPriority, log: log.With("component", "queue")}}
	label := func(id string) string {
		name := id
		if v, ok := a.names.Load(id); ok {
			name = v.(string)
		}
		return labels.Label(name)
	}
	q, err := fairq.New(cfg.Queue.fairqConfig(cfg.Redis.KeyPrefix, label), a.capacity, rdb, reg, log.With("component", "fairq"))
	if err != nil {
		return nil, fmt.Errorf("config: queue: %w", err)
	}
	a.q = q
	if reg != nil && cfg.Queue.Saturation.InteractiveReserve > 0 {
		if err := reg.Register(reserveCollector{a.capacity}); err != nil {
			return nil, fmt.Errorf("queue: metrics: %w", err)
		}
	}
	return a, nil
}

// Admit waits, if the request's model is saturated, until the queue
// dispatches it. A model that no healthy replica serves skips the queue,
// so routing answers 404 or 503 at once rather than the queue a 429 after
// its timeout (and no client-chosen name becomes queue state).
func (a *queueAdmitter) Admit(ctx context.Context, r *turn) (func(Usage), error) {
	if !a.serves(r.Model()) {
		return releaseNothing, nil
	}
	if p := r.Principal(); p != nil {
		if _, ok := a.names.Load(p.TenantID); !ok {
			// First sight: the queue labels the tenant now, before its
			// first request has finished and been counted.
			a.names.Store(p.TenantID, p.TenantName)
			a.labels.Observe(p.TenantName, 0)
		}
	}
	t := r.ticket()
	if p := r.placement; p != nil && p.bound() {
		t.Place = func() bool { return p.place(a.capacity) }
	}
	gr, err := a.q.Admit(ctx, t)
	if err != nil {
		return nil, err
	}
	r.queueWait = gr.Waited()
	return func(u Usage) { settle(gr, u) }, nil
}

// serves reports whether a healthy replica serves model.
func (a *queueAdmitter) serves(model string) bool {
	for _, rep := range a.fleet.Snapshot().Replicas {
		if st := rep.State(); st.Healthy && st.Serves(model) {
			return true
		}
	}
	return false
}

// settle ends a grant with what the replica reported: output tokens are
// charged and the predicted prompt cost replaced by the actual one. A
// request that reported nothing (it failed, or its client left) keeps the
// prediction.
func settle(gr *fairq.Grant, u Usage) {
	if u != (Usage{}) {
		gr.Charge(float64(u.CompletionTokens))
		gr.Settle(float64(u.PromptTokens), float64(u.CachedTokens))
	}
	gr.Done()
}

// ticket is what the queue knows of r. The session's progress comes from
// the conversation itself, so admission needs no Redis: a chat request
// carrying assistant messages continues a session (Turn is their count),
// the prompt up to the last of them is predicted cached on the replica
// serving the session (sticky routing keeps it there), and that prefix is
// also the service the session has received (Attained). Cost is the
// prompt net of that prediction; Settle corrects it from the usage.
func (r *turn) ticket() fairq.Ticket {
	t := fairq.Ticket{Class: r.Class(), Model: r.Model(), Session: r.Session().Value, Turn: r.Turns()}
	if p := r.Principal(); p != nil {
		t.Tenant, t.Weight = p.TenantID, float64(p.Weight)
	}
	prompt := r.estimatedTokens()
	held := min(prompt, r.HeldBytes()/4)
	t.Attained, t.Cost = float64(held), float64(prompt-held)
	return t
}

// fleetCapacity is the queue's Capacity: the fleet's replicas judged by
// QueueSaturation. It reads the fleet's published state only (atomics and
// a snapshot), so it never blocks.
type fleetCapacity struct {
	fleet *fleet.Fleet
	sat   QueueSaturation
	// priority: the class reaches the engines (queue.vllm_priority), so
	// an interactive request waits in an engine behind interactive ones
	// only.
	priority bool
	// loads holds each replica's *replicaLoad. Entries of replicas that
	// left stay (a few bytes per departed replica).
	loads sync.Map
	// joinMu serializes joining the interactive reserve, so that no more
	// than InteractiveReserve replicas join it.
	joinMu sync.Mutex
	// down holds, per model that has lost every answering replica since
	// start, whether it has none now that answers (*atomic.Bool), for
	// noteDown's log.
	down sync.Map
	log  *slog.Logger // nil: noteDown logs nothing
}

// replicaLoad is this gateway's admission bookkeeping for one replica.
type replicaLoad struct {
	// pending counts, per class, this gateway's requests routed to the
	// replica that have not started there (no first byte yet): waiting
	// in its engine or prefilling.
	pending [2]atomic.Int64
	// lastInteractive is when this gateway last sent the replica an
	// interactive request (Unix nanoseconds); reserved whether it joined
	// the interactive reserve since (it holds until ReserveIdle after
	// lastInteractive).
	lastInteractive atomic.Int64
	reserved        atomic.Bool
	// started counts this gateway's streaming requests on the replica
	// whose first byte came after the scrape taken at startedAt and that
	// have not finished: they left the engine's queue since that scrape
	// counted them waiting (or since they were sent), so room opens at a
	// request's first token rather than at the next scrape.
	startedMu sync.Mutex
	startedAt time.Time
	started   int
	// claimed counts the requests the queue dispatched to the replica
	// (placement.place) that have not been sent yet: room they hold
	// before the replica's in-flight count shows them; claimedTokens is
	// their uncached prompt tokens, the prefill they bring.
	claimed, claimedTokens atomic.Int64
}

func (c *fleetCapacity) loadFor(rep *fleet.Replica) *replicaLoad {
	if v, ok := c.loads.Load(rep); ok {
		return v.(*replicaLoad)
	}
	v, _ := c.loads.LoadOrStore(rep, new(replicaLoad))
	return v.(*replicaLoad)
}

// startPending counts a routed request as not started on the replica it
// is first sent to, until its first byte or its end (endPending), and a
// non-streaming one for two scrape intervals at most; an
// interactive request also renews (or makes) the replica's place in the
// interactive reserve.
func (g *Gateway) startPending(x *exchange) {
	if g.queue == nil || len(x.route.plan.Order) == 0 {
		return
	}
	c := g.queue.capacity
	rep, _ := x.route.candidate(0)
	class := min(x.req.Class(), fairq.Background)
	x.pendingLoad = c.loadFor(rep)
	x.pending = &x.pendingLoad.pending[class]
	x.pending.Add(1)
	if !x.req.Stream() {
		// A non-streaming answer's first byte is its end: after two
		// scrape intervals a scrape taken since the engine saw the
		// request says whether it waits (QueueSaturation).
		iv := g.cfg.Health.ScrapeInterval
		if iv <= 0 {
			iv = fleet.DefaultScrapeInterval
		}
		x.pendingTimer.Store(time.AfterFunc(2*iv, x.endPending))
	}
	if class == fairq.Interactive {
		c.noteInteractive(rep, x.route.reps, time.Now())
	}
}

// startedSince is how many of started count under the scrape taken at
// scrapedAt (none after a newer scrape, which saw them start).
func (l *replicaLoad) startedSince(scrapedAt time.Time) int {
	l.startedMu.Lock()
	defer l.startedMu.Unlock()
	if !l.startedAt.Equal(scrapedAt) {
		return 0
	}
	return l.started
}

// noteStarted counts a streaming request's first byte under the scrape
// taken at scrapedAt and returns it, for unnoteStarted.
func (l *replicaLoad) noteStarted(scrapedAt time.Time) time.Time {
	l.startedMu.Lock()
	defer l.startedMu.Unlock()
	if !l.startedAt.Equal(scrapedAt) {
		l.startedAt, l.started = scrapedAt, 0
	}
	l.started++
	return scrapedAt
}

// unnoteStarted takes a finished request out of started, if it still
// counts there: once it has finished, the in-flight count nets it out.
func (l *replicaLoad) unnoteStarted(scrapedAt time.Time) {
	l.startedMu.Lock()
	defer l.startedMu.Unlock()
	if l.startedAt.Equal(scrapedAt) && l.started > 0 {
		l.started--
	}
}

// firstByte is the exchange's first byte from its replica: a streaming
// request there has left the engine's queue. Before the replica's first
// scrape there is no scraped queue to correct (its metrics are stale, so
// it has no room anyway), and a zero startedAt means "not counted".
func (g *Gateway) firstByte(x *exchange) {
	rep, _ := x.route.candidate(0)
	count := x.pendingLoad != nil && x.req.Stream() && !x.pendingDone.Load() && x.replica == rep
	x.endPending() // before the re-check, which then sees it started
	if !count {
		return
	}
	if at := rep.State().ScrapedAt; !at.IsZero() {
		x.startedAt = x.pendingLoad.noteStarted(at)
		g.queue.q.Kick()
	}
}

// endPending ends startPending's count, once.
func (x *exchange) endPending() {
	if x.pending != nil && x.pendingDone.CompareAndSwap(false, true) {
		x.pending.Add(-1)
		if t := x.pendingTimer.Load(); t != nil {
			t.Stop()
		}
	}
}

// noteInteractive records an interactive request sent to rep, one of the
// model's replicas reps, at now; rep joins the reserve if it has room.
func (c *fleetCapacity) noteInteractive(rep *fleet.Replica, reps []*fleet.Replica, now time.Time) {
	l := c.loadFor(rep)
	l.lastInteractive.Store(now.UnixNano())
	if c.sat.InteractiveReserve <= 0 || l.reserved.Load() {
		return
	}
	c.joinMu.Lock()
	defer c.joinMu.Unlock()
	n := 0
	for _, o := range reps {
		if o != rep && c.reserved(o, now) {
			n++
		}
	}
	if n < min(c.sat.InteractiveReserve, len(reps)-1) && l.reserved.CompareAndSwap(false, true) && c.log != nil {
		c.log.Info("queue: replica joins the interactive reserve (no background requests while interactive traffic lasts)",
			"replica", rep.Spec.Name, "reserve_idle", c.sat.ReserveIdle)
	}
}

// reserved reports whether rep is in the interactive reserve at now. A
// replica idle for ReserveIdle leaves it here.
func (c *fleetCapacity) reserved(rep *fleet.Replica, now time.Time) bool {
	l := c.loadFor(rep)
	if !l.reserved.Load() {
		return false
	}
	last := l.lastInteractive.Load()
	if now.UnixNano()-last < int64(c.sat.ReserveIdle) {
		return true
	}
	if !l.reserved.CompareAndSwap(true, false) {
		return false
	}
	if last = l.lastInteractive.Load(); now.UnixNano()-last < int64(c.sat.ReserveIdle) {
		// noteInteractive renewed it meanwhile (and, seeing it reserved,
		// left the flag to this): it stays.
		l.reserved.Store(true)
		return true
	}
	if c.log != nil {
		c.log.Info("queue: replica leaves the interactive reserve (no interactive request for reserve_idle); background may use it",
			"replica", rep.Spec.Name, "last_interactive", time.Unix(0, last))
	}
	return false
}

// reserveCollector exports the interactive reserve's membership:
// warmpath_queue_interactive_reserve{replica} is 1 for a replica that
// takes no background requests now, else 0.
type reserveCollector struct{ c *fleetCapacity }

var reserveDesc = prometheus.NewDesc("warmpath_queue_interactive_reserve",
	"1 while the replica is in the interactive reserve (queue.saturation.interactive_reserve): it takes no background requests unless no other replica is healthy.",
	[]string{"replica"}, nil)

func (r reserveCollector) Describe(ch chan<- *prometheus.Desc) { ch <- reserveDesc }

func (r reserveCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, rep := range r.c.fleet.Snapshot().Replicas {
		v := 0.0
		if r.c.reserved(rep, now) {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(reserveDesc, prometheus.GaugeValue, v, rep.Spec.Name)
	}
}

// keepReserve hides the reserved replicas from a background request's
// routing (as unable to take traffic), unless no other replica is
// healthy; eps are the endpoints of reps.
func (g *Gateway) keepReserve(r *turn, reps []*fleet.Replica, eps []scoring.Endpoint) {
	if g.queue == nil || r.Class() < fairq.Background {
		return
	}
	c, now := g.queue.capacity, time.Now()
	res := make([]bool, len(reps))
	other := false
	for i, rep := range reps {
		res[i] = c.reserved(rep, now)
		other = other || (!res[i] && !eps[i].Unhealthy)
	}
	if !other {
		return
	}
	for i := range eps {
		eps[i].Reserved = res[i]
	}
}

var _ fairq.ClassCapacity = (*fleetCapacity)(nil)

// Saturated implements fairq.Capacity: saturated for interactive
// requests.
func (c *fleetCapacity) Saturated(model string, inflight int) bool {
	return c.SaturatedFor(model, inflight, fairq.Interactive)
}

// SaturatedFor implements fairq.ClassCapacity; inflight is the queue's
// requests for model admitted and not finished. Background counts no
// room on reserved replicas while another replica is healthy (routing
// sends it none there).
func (c *fleetCapacity) SaturatedFor(model string, inflight int, class fairq.Class) bool {
	now := time.Now()
	room, reservedRoom, routed := 0, 0, 0
	other, up := false, false
	for _, rep := range c.fleet.Snapshot().Replicas {
		st := rep.State()
		if !st.Serves(model) {
			continue
		}
		n := int(rep.InflightRequests())
		claimed := int(c.loadFor(rep).claimed.Load())
		routed += n + claimed
		res := class == fairq.Background && c.reserved(rep, now)
		other = other || (!res && st.Healthy)
		up = up || (st.Healthy && !rep.Failing())
		if usable(rep, now) {
			if r := max(0, c.room(rep, st, n, class)-claimed); res {
				reservedRoom += r
			} else {
				room += r
			}
		}
	}
	if !other {
		room += reservedRoom
	}
	c.noteDown(model, !up)
	return room-max(0, inflight-routed) <= 0
}

// usable reports whether the queue may send rep a request at now: routing
// finds it available (healthy, fresh metrics, under routing's thresholds)
// and nothing sent to it, nor its health check, failed since its last
// success (fleet.Replica.Failing). A replica that fails but is not yet
// marked unhealthy (health.failures, and calls in flight together count
// as one failure) has no room: the requests that failed there freed
// places in this gateway's count of what it sent but none in an engine,
// and a waiting request sent there would fail too, or find by the time it
// is routed that no replica is healthy. So waiting requests stay queued
// until a request or health check succeeds there again.
func usable(rep *fleet.Replica, now time.Time) bool {
	sat, _ := rep.Saturated(now)
	return !sat && !rep.Failing()
}

// noteDown logs when model, which has requests reaching the queue, loses
// its last replica that is healthy and not failing (down) and when it has
// one again: meanwhile its waiting requests stay queued, until a replica
// answers again or queue.timeout passes. A nil log logs nothing.
func (c *fleetCapacity) noteDown(model string, down bool) {
	if c.log == nil {
		return
	}
	v, ok := c.down.Load(model)
	if !ok {
		if !down {
			return
		}
		v, _ = c.down.LoadOrStore(model, new(atomic.Bool))
	}
	if v.(*atomic.Bool).Swap(down) == down {
		return
	}
	if down {
		c.log.Warn("queue: no replica of the model is answering (every one unhealthy or failing); waiting requests stay queued until one answers again (at most queue.timeout)", "model", model)
		return
	}
	c.log.Info("queue: a replica of the model answers again; waiting requests dispatch", "model", model)
}

// claim takes a place for a request of class with tokens of uncached
// prompt on rep, the replica its routing chose, if rep has room for it by
// the rule SaturatedFor sums (a usable replica, room less what the
// queue dispatched to it and has not sent yet), and returns the load to
// give the place back to (replicaLoad.unclaim).
func (c *fleetCapacity) claim(rep *fleet.Replica, class fairq.Class, tokens int64, now time.Time) (*replicaLoad, bool) {
	if !usable(rep, now) {
		return nil, false
	}
	l := c.loadFor(rep)
	if c.room(rep, rep.State(), int(rep.InflightRequests()), class)-int(l.claimed.Load()) <= 0 {
		return nil, false
	}
	l.claimed.Add(1)
	l.claimedTokens.Add(tokens)
	return l, true
}

// unclaim gives back a place claim took for tokens.
func (l *replicaLoad) unclaim(tokens int64) {
	l.claimed.Add(-1)
	l.claimedTokens.Add(-tokens)
}

// addClaims counts, in eps (the endpoints of reps), the requests claimed
// on each replica and not sent yet as this gateway's in flight, with
// their prefill: routing then sees the load the queue has just sent
// there, so that the requests a dispatch considers one after another do
// not all pick the replica that looked least loaded before the first.
func (c *fleetCapacity) addClaims(reps []*fleet.Replica, eps []scoring.Endpoint) {
	for i, rep := range reps {
		l := c.loadFor(rep)
		eps[i].InflightRequests += l.claimed.Load()
		eps[i].InflightPrefillTokens += l.claimedTokens.Load()
	}
}

// room is an available replica's room for class (negative when its queue
// is longer than allowed); inflight is its requests from this gateway.
func (c *fleetCapacity) room(rep *fleet.Replica, st *fleet.State, inflight int, class fairq.Class) int {
	sent := inflight - st.InflightAtScrape
	pend := &c.loadFor(rep).pending
	// For interactive, this gateway's requests not started on rep are in
	// its queue (or prefilling) whatever the last scrape says: a scrape
	// taken after a request was sent but before the engine saw it would
	// hide it. Background keeps the scraped count: there one long prefill
	// would hold all background off the replica (measured: 40 s waits with
	// capacity idle, and timeouts).
	queued := st.Waiting + sent
	if queued > 0 { // those that started since the scrape wait no more
		queued -= min(queued, c.loadFor(rep).startedSince(st.ScrapedAt))
	}
	if class == fairq.Interactive {
		queued = max(queued, int(pend[fairq.Interactive].Load()+pend[fairq.Background].Load()))
	}
	var room int
	switch {
	case class == fairq.Interactive && c.priority:
		// The engine runs interactive requests first: only those are
		// ahead of this one.
		room = c.sat.EngineWaiting - int(pend[fairq.Interactive].Load())
	case class == fairq.Background && c.sat.BackgroundMaxKVUsage >= 0:
		if st.KVUsage >= c.sat.BackgroundMaxKVUsage {
			return 0
		}
		room = c.sat.BackgroundEngineWaiting - queued
	default:
		room = c.sat.EngineWaiting - queued
	}
	if c.sat.MaxRunning > 0 {
		room = min(room, c.sat.MaxRunning-(st.Running+sent))
	}
	return room
}

// replicaUpdated is the fleet's OnUpdate: a scrape or a recovery may have
// given a saturated model room.
func (g *Gateway) replicaUpdated(*fleet.Replica) {
	if g.queue != nil {
		g.queue.q.Kick()
	}
}

// queueHeaders are the debug headers of admission: the class the request
// ran in and how long it waited in the queue, in milliseconds.
func queueHeaders(h http.Header, r *turn) {
	h.Set("X-Warmpath-Class", r.Class().String())
	h.Set("X-Warmpath-Queue-Ms", strconv.FormatFloat(float64(r.queueWait)/float64(time.Millisecond), 'f', 1, 64))
}
