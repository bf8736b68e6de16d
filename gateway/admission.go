package gateway

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmpath/warmpath/tenancy"
)

// Admitter decides when a parsed request may be routed: the seam between
// parsing and routing where a fair queue makes requests wait. Routing
// happens only after Admit returns (late binding: a queued turn still goes
// to whichever replica holds its prefix when it leaves the queue).
type Admitter interface {
	// Admit blocks until r may proceed, or returns an error (an
	// *apierror.Error such as a 429, or ctx's error). On success the
	// gateway calls release exactly once, when the request has ended,
	// with what the replica reported (zero when it reported nothing).
	Admit(ctx context.Context, r *Request) (release func(Usage), err error)
}

// admitAll is the pass-through admission: every request at once.
type admitAll struct{}

func (admitAll) Admit(context.Context, *Request) (func(Usage), error) { return releaseNothing, nil }

func releaseNothing(Usage) {}

// admitExchange is the pipeline's admission step: the sender's limits
// (requests, tokens and concurrency per tenant and key: a 429 when over),
// then routing's I/O (prepare), then the Admitter (which may make the
// request wait, and decides where it goes as it leaves). On success the
// exchange holds both, for finish.
func (g *Gateway) admitExchange(ctx context.Context, x *exchange) error {
	r := x.req
	if p := r.principal; p != nil && g.tenants.limit != nil {
		lease, err := g.tenants.limit.Admit(ctx, p, r.model, r.estimatedTokens()+r.maxTokens)
		if err != nil {
			return err
		}
		x.lease = lease
	}
	if _, err := g.prepare(ctx, r); err != nil {
		if x.lease != nil {
			x.lease.Done(-1)
		}
		return err
	}
	x.prepared = time.Now()
	release, err := g.waiting.wait(r.model, func() (func(Usage), error) { return g.admit.Admit(ctx, r) })
	if err != nil {
		r.placement.unclaim()
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
func (g *Gateway) finish(x *exchange, u Usage, have bool) {
	if x.finished {
		return
	}
	x.finished = true
	x.endPending()
	x.req.placement.unclaim()
	x.release(u)
	if x.lease != nil {
		tokens := -1
		if have {
			tokens = u.PromptTokens + u.CompletionTokens
		}
		x.lease.Done(tokens)
	}
	if p := x.req.principal; have && p != nil && g.tenants.usage != nil {
		g.tenants.usage.Record(p, tenancy.Counts{Requests: 1, PromptTokens: int64(u.PromptTokens),
			CachedTokens: int64(u.CachedTokens), CompletionTokens: int64(u.CompletionTokens)})
	}
}

// backlog counts, per model, the requests waiting in the Admitter: the
// queue the warmpath policy prices a decision's replica time against
// (scoring.Input.Backlog). The zero value is empty and ready.
type backlog struct {
	models sync.Map // model → *atomic.Int64
}

// wait runs admit, counting it among model's waiting requests meanwhile.
func (b *backlog) wait(model string, admit func() (func(Usage), error)) (func(Usage), error) {
	n := b.counter(model)
	n.Add(1)
	defer n.Add(-1)
	return admit()
}

// of returns how many of model's requests wait now.
func (b *backlog) of(model string) int {
	if v, ok := b.models.Load(model); ok {
		return int(max(0, v.(*atomic.Int64).Load()))
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
