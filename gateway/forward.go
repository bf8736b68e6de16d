package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/proxy"
	"github.com/warmpath/warmpath/internal/apierror"
)

// retryable reports upstream statuses that mean the replica, not the
// request, failed.
func retryable(status int) bool {
	switch status {
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// maxAttempts is one try plus one retry on the next-best replica.
const maxAttempts = 2

// forward sends the routed request to its plan's first candidate. A
// replica that fails before answering (connection refused or reset, or a
// 5xx) is reported to the fleet, and the request is retried once on the
// next candidate; a client that goes away cancels the upstream request and
// is not held against the replica. When every attempt answered with an
// error status, the last answer is returned (and normalized by account).
func (g *Gateway) forward(ctx context.Context, x *exchange) (*http.Response, error) {
	var lastErr error
	n := min(maxAttempts, len(x.route.Plan.Order))
	for i := range n {
		rep, predicted := x.route.Candidate(i)
		fl := rep.Begin(int64(max(0, x.route.Plan.PromptTokens-predicted)))
		x.req.Placement.Unclaim() // the replica's in-flight count has it now
		if i == 0 {
			g.refill(x.req)
		}
		x.attempts++
		actx, span := ctx, trace.Span(nil)
		if g.trace.on() {
			actx, span = g.trace.startAttempt(ctx, x, rep.Spec.Name, rep.URL().Host, x.attempts)
		}
		sent := time.Now()
		resp, err := g.attempt(actx, x, rep)
		if err == nil && !retryable(resp.StatusCode) {
			rep.ReportSuccess()
			x.replica, x.flight, x.predicted, x.sent, x.answered = rep, fl, predicted, sent, time.Now()
			x.span = answered(span, resp)
			if i > 0 {
				g.router.Retried()
			}
			return resp, nil
		}
		if ctx.Err() != nil {
			endAttempt(span, resp, ctx.Err())
			fl.Done()
			if resp != nil {
				resp.Body.Close()
			}
			return nil, ctx.Err()
		}
		kind := failureKind(err)
		if err == nil {
			kind = "status_" + strconv.Itoa(resp.StatusCode)
			lastErr = fmt.Errorf("replica %s answered %s", rep.Spec.Name, resp.Status)
		} else {
			lastErr = fmt.Errorf("replica %s: %w", rep.Spec.Name, err)
		}
		rep.ReportFailureOf(sent, lastErr)
		g.m.upstreamErrors.WithLabelValues(rep.Spec.Name, kind).Inc()
		if i == n-1 && resp != nil {
			// Out of replicas: the client gets the replica's own error.
			x.replica, x.flight, x.predicted, x.sent, x.answered = rep, fl, predicted, sent, time.Now()
			x.span = answered(span, resp)
			return resp, nil
		}
		endAttempt(span, resp, err)
		fl.Done()
		if i == n-1 {
			break
		}
		if resp != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		g.m.retries.WithLabelValues(kind).Inc()
		g.logFor(x).InfoContext(actx, "retrying on next-best replica", "failed", rep.Spec.Name, "err", lastErr)
	}
	return nil, apierror.BadGateway(lastErr, "the upstream replica failed before answering; try again")
}

// Causes that end an attempt's context.
var (
	errHeaderTimeout = errors.New("no response headers within upstream.header_timeout")
	errReplicaDown   = errors.New("the replica was marked down while the request waited")
)

// failureKind labels a failed attempt in warmpath_upstream_errors_total.
func failureKind(err error) string {
	switch {
	case errors.Is(err, errHeaderTimeout):
		return "header_timeout"
	case errors.Is(err, errReplicaDown):
		return "replica_down"
	}
	return "connect"
}

// attempt sends one attempt to rep under its own context: it ends when the
// client's does, when the headers take longer than header_timeout, or when
// rep stops being healthy before answering (a hung replica releases its
// requests as soon as health checks notice). Once the headers are in, the
// body is watched for first_byte_timeout and idle_timeout, and the context
// ends with the body.
func (g *Gateway) attempt(ctx context.Context, x *exchange, rep *fleet.Replica) (*http.Response, error) {
	actx, cancel := context.WithCancelCause(ctx)
	timer := time.AfterFunc(g.cfg.Upstream.HeaderTimeout, func() { cancel(errHeaderTimeout) })
	unwatch := context.AfterFunc(rep.Up(), func() { cancel(errReplicaDown) })
	resp, err := g.upstream.RoundTrip(g.upstreamRequest(actx, x, rep.URL().String()))
	timer.Stop()
	unwatch()
	if err != nil {
		if cause := context.Cause(actx); ctx.Err() == nil && cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause
		}
		cancel(nil)
		return nil, err
	}
	w := newWatchdog(resp.Body, actx, cancel, g.cfg.Upstream.FirstByteTimeout, g.cfg.Upstream.IdleTimeout)
	// Past the drain timeout the attempt ends, and its stream with an
	// error event.
	w.undrain = context.AfterFunc(g.drainCtx, func() { cancel(proxy.ErrDraining) })
	resp.Body = w
	return resp, nil
}

// watchdog bounds the silences of a response body: the first read that
// returns data must come within first, each later one within idle of the
// one before. When a bound passes it ends the attempt's context, so the
// read in progress fails with the cause. Close ends the context too.
type watchdog struct {
	src    io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	idle   time.Duration
	began  bool
	// undrain unregisters the attempt from the drain; nil until set.
	undrain func() bool
}

func newWatchdog(src io.ReadCloser, ctx context.Context, cancel context.CancelCauseFunc, first, idle time.Duration) *watchdog {
	w := &watchdog{src: src, ctx: ctx, cancel: cancel, idle: idle}
	w.timer = time.AfterFunc(first, func() { cancel(proxy.ErrFirstByte) })
	return w
}

func (w *watchdog) Read(p []byte) (int, error) {
	n, err := w.src.Read(p)
	if n > 0 {
		if !w.began {
			w.began = true
			w.timer.Stop()
			w.timer = time.AfterFunc(w.idle, func() { w.cancel(proxy.ErrIdle) })
		} else {
			w.timer.Reset(w.idle)
		}
	}
	if err != nil && err != io.EOF {
		if cause := context.Cause(w.ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			err = fmt.Errorf("%w (%v)", cause, err) // not the context's Canceled: the client is still there
		}
	}
	return n, err
}

func (w *watchdog) Close() error {
	w.timer.Stop()
	if w.undrain != nil {
		w.undrain()
	}
	err := w.src.Close()
	w.cancel(nil)
	return err
}

// upstreamRequest builds one attempt's request to the replica at base: the
// client's headers minus hop-by-hop ones and its credentials, the
// upstream body, and the client's context, so a disconnect cancels it.
func (g *Gateway) upstreamRequest(ctx context.Context, x *exchange, base string) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+x.req.API().Path(), bytes.NewReader(x.body))
	h := upstreamHeader(x.req.Header())
	h.Set("Content-Type", "application/json")
	if g.upstreamKey != "" {
		h.Set("Authorization", "Bearer "+g.upstreamKey)
	}
	if g.trace.on() {
		// The attempt's span is the replica's parent, not the client's.
		h.Del("Traceparent")
		h.Del("Tracestate")
		g.trace.inject(ctx, h)
	}
	req.Header = h
	req.ContentLength = int64(len(x.body))
	return req
}

// hopHeaders are the hop-by-hop headers of RFC 9110 §7.6.1, plus what the
// gateway never passes on: the client's credentials (the key is
// warmpath's, not vLLM's), cookies, the body's framing, and
// Accept-Encoding, so the transport negotiates (and transparently undoes)
// compression and the stream filter sees plain SSE.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
	"Authorization", "X-Api-Key", "Cookie", "Content-Length", "Accept-Encoding",
}

// upstreamHeader copies the client's headers for the replica.
func upstreamHeader(in http.Header) http.Header {
	out := make(http.Header, len(in)+2)
	for k, vv := range in {
		out[k] = vv
	}
	for _, f := range in.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			out.Del(textproto.TrimString(name))
		}
	}
	for _, h := range hopHeaders {
		out.Del(h)
	}
	return out
}

// setForwarded adds X-Forwarded-For, -Host and -Proto for a request that
// arrived as in (the proxy's conventions).
func setForwarded(h http.Header, in *http.Request) {
	if ip, _, err := net.SplitHostPort(in.RemoteAddr); err == nil {
		if prior := in.Header.Values("X-Forwarded-For"); len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		h.Set("X-Forwarded-For", ip)
	}
	h.Set("X-Forwarded-Host", in.Host)
	proto := "http"
	if in.TLS != nil {
		proto = "https"
	}
	h.Set("X-Forwarded-Proto", proto)
}

// copyResponse writes the routed client's response to the HTTP client:
// headers minus hop-by-hop ones, the status, then the body as it arrives,
// flushing after every write of an event stream. A body that breaks after
// the headers went out aborts the connection (net/http's ErrAbortHandler),
// the honest signal once a status has been sent.
func copyResponse(w http.ResponseWriter, resp *http.Response) {
	defer resp.Body.Close()
	h := w.Header()
	for k, vv := range resp.Header {
		h[k] = vv
	}
	for _, k := range []string{"Connection", "Keep-Alive", "Te", "Trailer", "Transfer-Encoding", "Upgrade"} {
		h.Del(k)
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	stream := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	for {
		n, err := resp.Body.Read(*buf)
		if n > 0 {
			if _, werr := w.Write((*buf)[:n]); werr != nil {
				return // the client went away; closing the body cancels upstream
			}
			if stream {
				_ = rc.Flush()
			}
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			panic(http.ErrAbortHandler)
		}
	}
}

// copyBuffers lends copyResponse 32 KiB buffers.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
