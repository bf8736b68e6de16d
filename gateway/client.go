package gateway

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/tenancy"
)

// exchange is one request on its way through the routed client: admitted,
// routed, forwarded, then finished by the response's accounting. Fields
// after route are written by one attempt at a time, then read by the
// response path.
type exchange struct {
	ctx     context.Context // the caller's
	req     *Request
	start   time.Time
	body    []byte // upstream body
	route   *route
	release func(Usage)    // the Admitter's
	lease   *tenancy.Lease // the sender's limits; nil without them
	// finished is set by finish; only the goroutine that owns the
	// exchange's current step touches it.
	finished bool

	// sent is when the request was first sent to a replica.
	sent time.Time

	replica   *fleet.Replica // the replica that answered
	flight    *fleet.Flight
	predicted int // cached tokens predicted on replica
	attempts  int

	// pending counts the request among its class's requests not started
	// on the replica routed to, until its first byte (queue.go).
	pending      *atomic.Int64
	pendingDone  atomic.Bool
	pendingTimer atomic.Pointer[time.Timer] // ends a non-streaming request's count (startPending)
}

// Do sends one parsed request through the gateway's pipeline: admission
// (which may make it wait), routing (gather → scoring.Decide → I/O),
// forwarding with retry on the next-best replica, and accounting. It
// returns the upstream response, whose body streams; accounting finishes
// when the body has been read to its end or closed, so the caller must
// close it. Errors before any response are *apierror.Error values (or
// ctx's error). Do is the routed client every API surface uses.
func (g *Gateway) Do(ctx context.Context, r *Request) (*http.Response, error) {
	x := &exchange{ctx: ctx, req: r, start: time.Now()}
	r.bytesPerToken = g.ratios.get(r.model)
	var err error
	if x.body, err = r.upstreamBody(); err != nil {
		return nil, fmt.Errorf("gateway: build upstream body: %w", err)
	}
	if x.body, err = g.classBody(x.body, r); err != nil {
		return nil, fmt.Errorf("gateway: build upstream body: %w", err)
	}
	if err = g.admitExchange(ctx, x); err != nil {
		return nil, err
	}
	if x.route, err = g.route(ctx, r); err != nil {
		g.finish(x, Usage{}, false)
		return nil, err
	}
	g.startPending(x)
	resp, err := g.forward(ctx, x)
	if err != nil {
		g.finish(x, Usage{}, false)
		return nil, err
	}
	return g.account(x, resp)
}
