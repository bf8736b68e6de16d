package gateway

import (
	"context"
	"errors"
	"log/slog"
	"mime"
	"net/http"
	"time"

	"github.com/warmpath/warmpath/gateway/proxy"
	"github.com/warmpath/warmpath/gateway/request"
)

// account attaches the stream filter and the accounting to a replica's
// answer, and normalizes error bodies.
func (g *Gateway) account(x *exchange, resp *http.Response) (*http.Response, error) {
	if g.cfg.Debug {
		g.debugHeaders(resp.Header, x)
		queueHeaders(resp.Header, x.req)
		resp.Header.Set("Server-Timing", x.serverTiming())
	}
	if x.lease != nil {
		for k, v := range x.lease.Header() {
			resp.Header[k] = v
		}
	}
	if resp.StatusCode >= 400 {
		return g.upstreamError(x, resp)
	}
	var (
		got  request.Usage
		have bool
	)
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	stream := mt == "text/event-stream"
	obs := proxy.Observer{
		FirstByte: func() { g.answerStarted(x, stream || resp.ContentLength < 0) },
		Usage:     func(u request.Usage) { got, have = u, true },
		Done:      func(err error) { g.answerDone(x, resp.StatusCode, stream, got, have, err) },
	}
	if stream {
		resp.Body = proxy.NewSSEFilter(resp.Body, x.req.Stream() && !x.req.WantUsage(), obs)
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
	} else {
		resp.Body = proxy.NewJSONTap(resp.Body, resp.ContentLength, obs)
	}
	return resp, nil
}

// answerStarted accounts for an answer's first byte: the replica's
// in-flight count, the pending count, the binding (publish: unless the
// answer is whole and of declared length), the TTFT and its estimate.
func (g *Gateway) answerStarted(x *exchange, publish bool) {
	x.flight.FirstByte()
	g.adm.firstByte(x.pending, x.replica)
	if publish {
		// A whole answer of declared length ends (done, which
		// writes the binding) before its last bytes are passed
		// on: one write, not two, and none later than before.
		g.router.PublishBinding(x.route)
	}
	if x.req.Stream() {
		since := time.Since(x.start)
		g.obs.m.ttft.WithLabelValues(x.req.Model()).Observe(since.Seconds())
		firstToken(x.span, since)
	}
	g.checkEstimate(x)
}

// answerDone accounts for an answer whose body ended (err: how it broke,
// nil at its end): admission's release and the limits (finish), the
// session's cached tokens, the metrics, and a broken body against the
// replica. got is the usage the replica reported, if have.
func (g *Gateway) answerDone(x *exchange, status int, stream bool, got request.Usage, have bool, err error) {
	x.flight.Done()
	if err != nil && !errors.Is(err, context.Canceled) && x.ctx.Err() == nil {
		bodyBroke(x.span, err, stream)
	}
	g.finish(x, got, have)
	if g.log.Enabled(context.Background(), slog.LevelDebug) {
		g.logFor(x).DebugContext(x.ctx, "request", "model", x.req.Model(), "status", status, "stream", stream,
			"prompt_tokens", got.PromptTokens, "cached_tokens", got.CachedTokens, "predicted_cached", x.predicted,
			"attempts", x.attempts, "duration_ms", time.Since(x.start).Milliseconds(), "err", err)
	}
	completed := got
	if !have || err != nil {
		completed = request.Usage{}
	}
	g.router.RememberCompleted(x.route, x.replica.Spec.Name, completed)
	if have {
		g.served(x, got)
	}
	if err != nil && !errors.Is(err, context.Canceled) && x.ctx.Err() == nil {
		// The body broke after the first byte: too late to retry.
		// A stream was ended with an error event (proxy.NewSSEFilter).
		if stream {
			g.obs.m.streamsCut.WithLabelValues(proxy.CutReason(err)).Inc()
		}
		g.fwd.ReportBroken(x.replica, x.sent, err) // unless the drain cut it
	}
}

// served accounts for the usage got of an answered request: metrics,
// the status page, the recording, the miss attribution and the
// bytes-per-token ratio.
func (g *Gateway) served(x *exchange, got request.Usage) {
	g.obs.m.account(g.tenant(x), x.req.Model(), got, x.predicted, g.cfg.Routing.BlockSize)
	g.obs.activity.served(time.Now(), g.tenant(x), got)
	g.recordExchange(x, got) // first: it may fill in the block keys
	g.missed(x, got)
	if !x.req.TokenIDs() {
		g.router.ObserveTokens(x.req.R, got.PromptTokens)
	}
}

// checkEstimate compares the answering replica's TTFT estimate with the
// time from the routing decision to the first byte: the error goes to the
// per-replica histogram and the observation to the model's calibration.
// Retried requests are left out (their time includes the failed attempt).
func (g *Gateway) checkEstimate(x *exchange) {
	e, ok := x.route.Estimate(x.replica.Spec.Name)
	if !ok || x.attempts != 1 {
		return
	}
	observed := time.Since(x.route.At).Seconds()
	g.obs.m.ttftError.WithLabelValues(x.replica.Spec.Name).Observe(e.TTFT - observed)
	g.router.ObserveTTFT(x.req.Model(), e, observed)
}

// upstreamError finishes the exchange of a replica's error answer, whose
// body is read (bounded) and rewritten into OpenAI's envelope
// (proxy.ReadErrorAnswer).
func (g *Gateway) upstreamError(x *exchange, resp *http.Response) (*http.Response, error) {
	err := proxy.ReadErrorAnswer(resp)
	x.flight.Done()
	g.finish(x, request.Usage{}, false)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// tenant labels accounting metrics: the sender's tenant name while it is
// among the busiest (tenancy.Labeler), "other" beyond them.
func (g *Gateway) tenant(x *exchange) string {
	if p := x.req.Principal(); p != nil {
		return g.tenants.labels.Label(p.TenantName)
	}
	return "default"
}
