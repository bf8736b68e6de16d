package gateway

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/gateway/routing"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/tenancy"
)

// admitFunc decides when a parsed request may be routed: the seam
// between parsing and routing where the fair queue makes requests wait
// (admitter.queued). Routing happens only after it returns (late binding).
// On success the gateway calls release exactly once, when the request has
// ended, with what the replica reported (zero when it reported nothing).
type admitFunc func(ctx context.Context, r *turn) (release func(request.Usage), err error)

// admitAll is the pass-through admission: every request at once.
func admitAll(context.Context, *turn) (func(request.Usage), error) { return releaseNothing, nil }

func releaseNothing(request.Usage) {}

// admitExchange is the pipeline's admission step: the sender's limits
// (requests, tokens and concurrency per tenant and key: a 429 when over),
// then routing's I/O (prepare), then the admission (admitter.admit) (which may make the
// request wait, and decides where it goes as it leaves). On success the
// exchange holds both, for finish.
func (g *Gateway) admitExchange(ctx context.Context, x *exchange) error {
	r := x.req
	if p := r.Principal(); p != nil && g.tenants.limit != nil {
		lease, err := g.tenants.limit.Admit(ctx, p, r.Model(), r.Estimate()+r.MaxTokens())
		if err != nil {
			return err
		}
		x.lease = lease
	}
	if _, err := g.router.Prepare(ctx, r); err != nil {
		if x.lease != nil {
			x.lease.Done(-1)
		}
		return err
	}
	x.prepared = time.Now()
	release, err := g.adm.wait(ctx, r)
	if err != nil {
		r.Placement.Unclaim()
		if x.lease != nil {
			x.lease.Done(-1)
		}
		return err
	}
	x.release, x.admitted = release, time.Now()
	return nil
}

// finish ends an admitted exchange exactly once: it releases the
// admission and the limits (correcting the token estimate from what the
// replica reported) and records the tenant's usage. u is zero and have
// false when the replica reported nothing.
func (g *Gateway) finish(x *exchange, u request.Usage, have bool) {
	if x.finished {
		return
	}
	x.finished = true
	endAnswered(x.span, u, have)
	x.pending.Finish()
	x.req.Placement.Unclaim()
	x.release(u)
	if x.lease != nil {
		tokens := -1
		if have {
			tokens = u.PromptTokens + u.CompletionTokens
		}
		x.lease.Done(tokens)
	}
	if p := x.req.Principal(); have && p != nil && g.tenants.usage != nil {
		g.tenants.usage.Record(p, tenancy.Counts{Requests: 1, PromptTokens: int64(u.PromptTokens),
			CachedTokens: int64(u.CachedTokens), CompletionTokens: int64(u.CompletionTokens)})
	}
}

var _ routing.Backlog = (*backlog)(nil)

// backlog counts, per model, the requests waiting in the admission (admitter.admit): the
// queue the warmpath policy prices a decision's replica time against
// (scoring.Input.Backlog). It also keeps, for each waiting request the
// queue has placed (routing.Placement.Place), the replica its latest plan chose
// and that plan's uncached prefill, while it found no room there: the
// requests held for room on a replica, which reach its engine before any
// request behind them in the queue (scoring.Endpoint.GatewayAhead). The zero value is empty and
// ready.
type backlog struct {
	models sync.Map // model → *atomic.Int64
	seq    atomic.Uint64

	mu sync.Mutex // guards order and plans
	// order holds each waiting request's arrival in the admission (admitter.admit) (the
	// queue's order, but for its tenant fairness and turn priority), and
	// plans the placed ones' latest plans.
	order map[*routing.Placement]arrival
	plans map[*routing.Placement]planned
	// remote is the other gateways' backlog (backlogSync), nil without.
	remote atomic.Pointer[remoteBacklog]
}

// arrival is when a request entered the admission (admitter.admit): its place in this
// gateway's order and the time, to order it among other gateways'.
type arrival struct {
	seq uint64
	at  int64 // Unix nanoseconds
}

// planned is a waiting request's latest plan that found no room: the
// replica it chose and its uncached prompt there.
type planned struct {
	arrival
	rep    *fleet.Replica
	tokens int64
}

// wait runs admit for r, counting it among its model's waiting requests
// meanwhile, and its plans while it is placed.
func (b *backlog) wait(r *turn, admit func() (func(request.Usage), error)) (func(request.Usage), error) {
	n := b.counter(r.Model())
	n.Add(1)
	defer n.Add(-1)
	if p := r.Placement; p != nil {
		b.enter(p)
		defer b.leave(p)
	}
	return admit()
}

func (b *backlog) enter(p *routing.Placement) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.order == nil {
		b.order, b.plans = map[*routing.Placement]arrival{}, map[*routing.Placement]planned{}
	}
	b.order[p] = arrival{seq: b.seq.Add(1), at: time.Now().UnixNano()}
}

func (b *backlog) leave(p *routing.Placement) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.order, p)
	delete(b.plans, p)
}

// Plan records the plan p's placement made while it waits: its chosen
// replica rep, and whether rep had room for it. A request with room is
// being dispatched, and the room it claimed counts it from then on; one
// without is held for rep.
func (b *backlog) Plan(p *routing.Placement, rep *fleet.Replica, plan *scoring.Plan, room bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	a, ok := b.order[p]
	if !ok || room {
		delete(b.plans, p)
		return
	}
	tokens := int64(max(0, plan.PromptTokens-plan.Predicted[0]))
	b.plans[p] = planned{arrival: a, rep: rep, tokens: tokens}
}

// Fill sets, on eps (the endpoints of reps), the other waiting requests
// held for each replica, this gateway's and the others': those ahead of
// p (before it in the admission (admitter.admit), while p waits there; another gateway's
// by the time they arrived) in GatewayAhead and their uncached prefill
// in GatewayAheadTokens, the others in GatewayBehind. Once p has left
// the queue every one is behind it.
func (b *backlog) Fill(p *routing.Placement, reps []*fleet.Replica, eps []scoring.Endpoint) {
	b.mu.Lock()
	mine, waiting := b.order[p]
	for q, pl := range b.plans {
		i := slices.Index(reps, pl.rep)
		if q == p || i < 0 {
			continue
		}
		hold(&eps[i], waiting && pl.seq < mine.seq, pl.tokens)
	}
	b.mu.Unlock()
	r := b.remote.Load()
	if r == nil {
		return
	}
	for i, rep := range reps {
		for _, h := range r.held[rep.Spec.Name] {
			hold(&eps[i], waiting && h.Since < mine.at, h.Tokens)
		}
	}
}

// hold counts a request held for e's replica, ahead of the one being
// decided or behind it.
func hold(e *scoring.Endpoint, ahead bool, tokens int64) {
	if ahead {
		e.GatewayAhead++
		e.GatewayAheadTokens += tokens
	} else {
		e.GatewayBehind++
	}
}

// Of returns how many of model's requests wait now, in this gateway's
// Admitter and, as last exchanged, in the other gateways'.
func (b *backlog) Of(model string) int {
	n := 0
	if v, ok := b.models.Load(model); ok {
		n = int(max(0, v.(*atomic.Int64).Load()))
	}
	if r := b.remote.Load(); r != nil {
		n += r.waiting[model]
	}
	return n
}

// Peers returns how many other gateways the last exchange saw.
func (b *backlog) Peers() int {
	if r := b.remote.Load(); r != nil {
		return r.peers
	}
	return 0
}

func (b *backlog) counter(model string) *atomic.Int64 {
	if v, ok := b.models.Load(model); ok {
		return v.(*atomic.Int64)
	}
	v, _ := b.models.LoadOrStore(model, new(atomic.Int64))
	return v.(*atomic.Int64)
}
