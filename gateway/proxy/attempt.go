package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/warmpath/warmpath/gateway/fleet"
)

// attempt sends one attempt to rep under its own context: it ends when the
// client's does, when the headers take longer than header_timeout, or when
// rep stops being healthy before answering (a hung replica releases its
// requests as soon as health checks notice). Once the headers are in, the
// body is watched for first_byte_timeout and idle_timeout, and the context
// ends with the body.
func (f *Forwarder) attempt(ctx context.Context, s Send, rep *fleet.Replica) (*http.Response, error) {
	actx, cancel := context.WithCancelCause(ctx)
	timer := time.AfterFunc(f.cfg.HeaderTimeout, func() { cancel(errHeaderTimeout) })
	unwatch := context.AfterFunc(rep.Up(), func() { cancel(errReplicaDown) })
	resp, err := f.transport.RoundTrip(f.upstreamRequest(actx, s, rep.URL().String()))
	timer.Stop()
	unwatch()
	if err != nil {
		if cause := context.Cause(actx); ctx.Err() == nil && cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause
		}
		cancel(nil)
		return nil, err
	}
	w := newWatchdog(resp.Body, actx, cancel, f.cfg.FirstByteTimeout, f.cfg.IdleTimeout)
	// Past the drain timeout the attempt ends, and its stream with an
	// error event.
	w.undrain = context.AfterFunc(f.deps.Drain, func() { cancel(ErrDraining) })
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
	w.timer = time.AfterFunc(first, func() { cancel(ErrFirstByte) })
	return w
}

func (w *watchdog) Read(p []byte) (int, error) {
	n, err := w.src.Read(p)
	if n > 0 {
		if !w.began {
			w.began = true
			w.timer.Stop()
			w.timer = time.AfterFunc(w.idle, func() { w.cancel(ErrIdle) })
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
func (f *Forwarder) upstreamRequest(ctx context.Context, s Send, base string) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+s.Req.API().Path(), bytes.NewReader(s.Body))
	h := upstreamHeader(s.Req.Header())
	h.Set("Content-Type", "application/json")
	if f.deps.APIKey != "" {
		h.Set("Authorization", "Bearer "+f.deps.APIKey)
	}
	if f.deps.Tracer != nil {
		// The attempt's span is the replica's parent, not the client's.
		h.Del("Traceparent")
		h.Del("Tracestate")
		f.deps.Tracer.Inject(ctx, h)
	}
	req.Header = h
	req.ContentLength = int64(len(s.Body))
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
