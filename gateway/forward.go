package gateway

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/warmpath/warmpath/gateway/proxy"
)

// forward hands the routed exchange to the forwarding stage
// (proxy.Forwarder) and keeps what it learns of the answering attempt.
func (g *Gateway) forward(ctx context.Context, x *exchange) (*http.Response, error) {
	a, err := g.fwd.Forward(ctx, proxy.Send{Req: x.req.R, Body: x.body, Plan: x.route,
		Begun: func(first bool) {
			x.req.Placement.Unclaim() // the replica's in-flight count has it now
			if first {
				g.adm.refill(x.req)
			}
		},
		Log: func() *slog.Logger { return g.logFor(x) }})
	x.attempts = a.Attempts
	if err != nil {
		return nil, err
	}
	if a.Retried {
		g.router.Retried()
	}
	x.replica, x.flight, x.predicted, x.sent, x.answered, x.span = a.Replica, a.Flight, a.Predicted, a.Sent, a.Answered, a.Span
	return a.Resp, nil
}
