package gateway

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/warmpath/warmpath/gateway/admission"
	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/gateway/routing"
	"github.com/warmpath/warmpath/tenancy"
)

// exchange is one request on its way through the routed client: admitted,
// routed, forwarded, then finished by the response's accounting. Fields
// after route are written by one attempt at a time, then read by the
// response path.
type exchange struct {
	ctx     context.Context // the caller's
	req     *turn
	start   time.Time
	body    []byte // upstream body
	route   *routing.Route
	release func(request.Usage) // admission's
	lease   *tenancy.Lease      // the sender's limits; nil without them
	// finished is set by finish; only the goroutine that owns the
	// exchange's current step touches it.
	finished bool

	replica   *fleet.Replica // the replica that answered
	sent      time.Time      // when its attempt was sent
	flight    *fleet.Flight
	predicted int // cached tokens predicted on replica
	attempts  int
	// span is the answering attempt's (tracing.go), ended by finish;
	// nil when tracing is off.
	span trace.Span

	// pending counts the request among its class's requests not started
	// on the replica routed to, until its first byte (admitter.startPending); nil
	// without a queue.
	pending *admission.Pending

	// prepared, admitted, routed and answered are when routing's I/O
	// before admission ended, admission let the request go, routing was
	// done and the replica that answered sent its headers: the gateway's
	// phases (warmpath_gateway_phase_seconds, and the Server-Timing debug
	// header: serverTiming).
	prepared, admitted, routed, answered time.Time
}

// Do sends one parsed request through the gateway's pipeline: admission
// (which may make it wait), routing (gather → scoring.Decide → I/O),
// forwarding with retry on the next-best replica, and accounting. It
// returns the upstream response, whose body streams; accounting finishes
// when the body has been read to its end or closed, so the caller must
// close it. Errors before any response are *apierror.Error values (or
// ctx's error). Do is the routed client every API surface uses.
func (g *Gateway) Do(ctx context.Context, req *request.R) (*http.Response, error) {
	r := &turn{R: req, BytesPerToken: g.router.BytesPerToken(req.Model())}
	x := &exchange{ctx: ctx, req: r, start: time.Now()}
	var err error
	if x.body, err = r.UpstreamBody(g.cfg.Queue.VLLMPriority); err != nil {
		return nil, fmt.Errorf("gateway: build upstream body: %w", err)
	}
	if err = g.admitExchange(ctx, x); err != nil {
		return nil, err
	}
	if x.route, err = g.router.Route(ctx, r); err != nil {
		g.finish(x, request.Usage{}, false)
		return nil, err
	}
	x.routed = time.Now()
	g.obs.trace.recordPhases(ctx, x, g.router.Policy().Name)
	g.obs.m.observePhases(x)
	x.pending = g.adm.startPending(x.route, x.req)
	resp, err := g.forward(ctx, x)
	x.route.JoinSpeculation()
	if err != nil {
		g.finish(x, request.Usage{}, false)
		return nil, err
	}
	return g.account(x, resp)
}

// serverTiming renders the exchange's phases as a Server-Timing header
// value, in milliseconds: prepare (routing's I/O before admission: the
// session lookup, tokenizing and matching when the decision needs them),
// queue (admission), route (the decision and its I/O: a match left for
// after admission, the binding's write) and upstream (from sending to the
// answering replica's headers, which a streaming engine sends with its
// first token; retries included).
func (x *exchange) serverTiming() string {
	ph := x.phases()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return fmt.Sprintf("prepare;dur=%.2f, queue;dur=%.2f, route;dur=%.2f, upstream;dur=%.2f",
		ms(ph[phasePrepare]), ms(ph[phaseQueue]), ms(ph[phaseRoute]), ms(span(x.routed, x.answered)))
}

// phases returns the time the exchange spent in each of the gateway's
// phases (metrics.go); a phase it has not reached is 0.
func (x *exchange) phases() [numPhases]time.Duration {
	return [numPhases]time.Duration{
		phasePrepare: span(x.start, x.prepared),
		phaseQueue:   span(x.prepared, x.admitted),
		phaseRoute:   span(x.admitted, x.routed),
	}
}

// span is to − from, or 0 when either is unset or they are out of order.
func span(from, to time.Time) time.Duration {
	if from.IsZero() || to.IsZero() || to.Before(from) {
		return 0
	}
	return to.Sub(from)
}
