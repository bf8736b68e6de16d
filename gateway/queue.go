package gateway

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/warmpath/warmpath/gateway/admission"
	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/request"
)

// admitQueued is admission through the fair queue (package admission):
// a request whose placement binds it is routed as the queue considers it
// (routing.Placement.Place), and its wait is kept for routing and the debug
// headers.
func (g *Gateway) admitQueued(ctx context.Context, r *turn) (func(request.Usage), error) {
	var place func(*admission.Capacity) bool
	if p := r.Placement; p != nil && p.Bound() {
		place = p.Place
	}
	gr, err := g.queue.Admit(ctx, r.R, r.Estimate(), place)
	if err != nil {
		return nil, err
	}
	r.QueueWait = gr.Waited()
	return gr.Done, nil
}

// startPending counts a routed request as not started on the replica it
// is first sent to (admission.Capacity.Track).
func (g *Gateway) startPending(x *exchange) {
	if g.queue == nil || len(x.route.Plan.Order) == 0 {
		return
	}
	rep, _ := x.route.Candidate(0)
	x.pending = g.queue.Capacity().Track(rep, x.route.Reps, x.req.Class(), x.req.Stream(), g.cfg.Health.ScrapeInterval)
}

// firstByte is the exchange's first byte from its replica: a streaming
// request there has left the engine's queue, which may give a waiting
// request room.
func (g *Gateway) firstByte(x *exchange) {
	if x.pending.FirstByte(x.replica) {
		g.queue.Kick()
	}
}

// capacity is the queue's judgment of the fleet's room; nil without a
// queue.
func (g *Gateway) capacity() *admission.Capacity {
	if g.queue == nil {
		return nil
	}
	return g.queue.Capacity()
}

// replicaUpdated is the fleet's OnUpdate: a scrape or a recovery may have
// given a saturated model room.
func (g *Gateway) replicaUpdated(*fleet.Replica) {
	if g.queue != nil {
		g.queue.Kick()
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
func (g *Gateway) refill(r *turn) {
	if g.queue != nil && r.QueueWait > 0 && !r.Placement.Placed() {
		g.queue.Refill()
	}
}
