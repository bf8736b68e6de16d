package gateway

import (
	"context"
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
	release, err := g.admit.Admit(ctx, r)
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
