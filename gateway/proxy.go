package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httputil"
	"strconv"
	"sync"
	"time"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/internal/apierror"
)

type ctxKey int

const exchangeKey ctxKey = 0

// exchange is one client request on its way through the proxy: set up by
// the inference handler, routed and forwarded by the transport, finished by
// the response observer. Fields after plan are written by one attempt at a
// time, then read by the response path.
type exchange struct {
	req   *request
	start time.Time
	body  []byte // upstream body
	plan  *plan

	replica   *fleet.Replica // the replica that answered
	flight    *fleet.Flight
	predicted int // cached tokens predicted on replica
	attempts  int
	err       error // set by the proxy's ErrorHandler
}

func exchangeFrom(ctx context.Context) *exchange {
	x, _ := ctx.Value(exchangeKey).(*exchange)
	return x
}

// inference handles POST /v1/chat/completions and /v1/completions: read and
// parse the body once, then hand it to the proxy, whose transport routes.
func (g *Gateway) inference(kind apiKind) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		start := time.Now()
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.cfg.MaxBodyBytes))
		if err != nil {
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				return err
			}
			return apierror.BadRequest("", "reading request body: %v", err)
		}
		// The Content-Type is not checked: a bare `curl -d` sends form
		// encoding, and the body either parses as JSON or is rejected.
		req, err := parseRequest(kind, r.Header, body, g.scope(r))
		if err != nil {
			return err
		}
		ub, err := req.upstreamBody()
		if err != nil {
			return fmt.Errorf("gateway: build upstream body: %w", err)
		}
		x := &exchange{req: req, start: start, body: ub}
		g.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), exchangeKey, x)))
		return x.err
	}
}

// scope is what session keys are scoped by: one tenant for now.
func (g *Gateway) scope(*http.Request) string { return "" }

// tenant labels accounting metrics; every request is the default tenant
// until tenancy lands.
func (g *Gateway) tenant(*exchange) string { return "default" }

func (g *Gateway) newProxy() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// The transport picks the replica per attempt.
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "replica.invalid"
			pr.Out.Body, pr.Out.ContentLength = http.NoBody, 0
			pr.Out.Header.Del("Authorization") // the client's key is ours, not vLLM's
			pr.Out.Header.Del("Cookie")
			// Let the transport negotiate (and transparently undo)
			// compression, so the stream filter sees plain SSE.
			pr.Out.Header.Del("Accept-Encoding")
			if g.upstreamKey != "" {
				pr.Out.Header.Set("Authorization", "Bearer "+g.upstreamKey)
			}
			pr.SetXForwarded()
		},
		Transport:      g,
		ModifyResponse: g.modifyResponse,
		ErrorHandler: func(_ http.ResponseWriter, r *http.Request, err error) {
			if x := exchangeFrom(r.Context()); x != nil {
				x.err = err
			}
		},
		BufferPool: bufferPool{},
	}
}

// bufferPool lends the proxy 32 KiB copy buffers.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }

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

// RoundTrip routes the proxied request and forwards it. A replica that
// fails before answering (connection refused or reset, or a 5xx) is reported
// to the fleet, and the request is retried once on the next-best replica; a
// client that goes away cancels the upstream request and is not held
// against the replica.
func (g *Gateway) RoundTrip(out *http.Request) (*http.Response, error) {
	ctx := out.Context()
	x := exchangeFrom(ctx)
	if x == nil {
		return nil, errors.New("gateway: proxied request without routing state")
	}
	if x.plan == nil {
		p, err := g.route(ctx, x.req)
		if err != nil {
			return nil, err
		}
		x.plan = p
	}
	var lastErr error
	n := min(maxAttempts, len(x.plan.order))
	for i := range n {
		c := x.plan.order[i]
		rep := c.replica
		attempt := out.Clone(ctx)
		u := *c.url
		u.Path = c.url.Path + x.req.kind.path()
		u.RawQuery = out.URL.RawQuery
		attempt.URL, attempt.Host = &u, ""
		attempt.Body = io.NopCloser(bytes.NewReader(x.body))
		attempt.ContentLength = int64(len(x.body))
		attempt.Header.Set("Content-Type", "application/json")
		attempt.Header.Set("Content-Length", strconv.Itoa(len(x.body)))
		fl := rep.Begin(int64(max(0, x.plan.promptTokens-c.predicted)))
		x.attempts++
		resp, err := g.upstream.RoundTrip(attempt)
		if err == nil && !retryable(resp.StatusCode) {
			rep.ReportSuccess()
			x.replica, x.flight, x.predicted = rep, fl, c.predicted
			if i > 0 {
				g.m.decisions.WithLabelValues("retry").Inc()
			}
			return resp, nil
		}
		fl.Done()
		if ctx.Err() != nil {
			if resp != nil {
				resp.Body.Close()
			}
			return nil, ctx.Err()
		}
		kind := "connect"
		if err == nil {
			kind = "status_" + strconv.Itoa(resp.StatusCode)
			lastErr = fmt.Errorf("replica %s answered %s", rep.Spec.Name, resp.Status)
		} else {
			lastErr = fmt.Errorf("replica %s: %w", rep.Spec.Name, err)
		}
		rep.ReportFailure(lastErr)
		g.m.upstreamErrors.WithLabelValues(rep.Spec.Name, kind).Inc()
		if i == n-1 {
			if resp != nil {
				// Out of replicas: the client gets the replica's own
				// error (normalized by modifyResponse).
				x.replica, x.flight, x.predicted = rep, rep.Begin(0), c.predicted
				return resp, nil
			}
			break
		}
		if resp != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		g.m.retries.WithLabelValues(kind).Inc()
		g.log.Info("retrying on next-best replica", "failed", rep.Spec.Name, "err", lastErr)
	}
	return nil, apierror.BadGateway(lastErr, "the upstream replica failed before answering; try again")
}

// modifyResponse attaches the stream filter and the accounting to a
// replica's answer, and normalizes error bodies.
func (g *Gateway) modifyResponse(resp *http.Response) error {
	x := exchangeFrom(resp.Request.Context())
	if x == nil {
		return nil
	}
	if g.cfg.Debug {
		g.debugHeaders(resp.Header, x)
	}
	if resp.StatusCode >= 400 {
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		x.flight.Done()
		if err != nil {
			return fmt.Errorf("gateway: read upstream error: %w", err)
		}
		if fixed := normalizeErrorBody(resp.StatusCode, body); fixed != nil {
			body = fixed
			resp.Header.Set("Content-Type", "application/json")
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	var (
		got  usage
		have bool
	)
	obs := observer{
		firstByte: func() {
			x.flight.FirstByte()
			if x.req.stream {
				g.m.ttft.WithLabelValues(x.req.model).Observe(time.Since(x.start).Seconds())
			}
		},
		usage: func(u usage) { got, have = u, true },
		done: func(err error) {
			x.flight.Done()
			if have {
				g.m.account(g.tenant(x), x.req.model, got, x.predicted, g.cfg.Routing.BlockSize)
				if err == nil {
					g.rememberCompleted(x.plan, x.replica.Spec.Name, got)
				}
			}
			if err != nil && !errors.Is(err, context.Canceled) && resp.Request.Context().Err() == nil {
				// The stream broke after the first byte: too late to
				// retry, but the replica is suspect.
				x.replica.ReportFailure(err)
				g.m.upstreamErrors.WithLabelValues(x.replica.Spec.Name, "broken_body").Inc()
			}
		},
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt == "text/event-stream" {
		resp.Body = newSSEFilter(resp.Body, x.req.stream && !x.req.wantUsage, obs)
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
	} else {
		resp.Body = &jsonTap{src: resp.Body, obs: obs}
	}
	return nil
}
