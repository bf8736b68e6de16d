package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/internal/apierror"
)

// Tracer starts the span of each upstream attempt and passes its trace
// context on to the replica (the gateway's tracing); nil when tracing is
// off.
type Tracer interface {
	// StartAttempt starts the span of the n-th attempt (from 1) of r on
	// replica at host.
	StartAttempt(ctx context.Context, r *request.R, replica, host string, n int) (context.Context, trace.Span)
	// Inject writes ctx's trace context into h.
	Inject(ctx context.Context, h http.Header)
}

// Deps are what a Forwarder needs besides its configuration.
type Deps struct {
	// APIKey is sent to replicas as a bearer token (vLLM's --api-key);
	// empty sends none.
	APIKey string
	// Drain ends when the drain timeout passes: attempts still open end
	// then, and their streams with an error event (ErrDraining).
	Drain context.Context
	// Tracer traces attempts; nil: tracing is off.
	Tracer Tracer
	// UpstreamErrors (labels replica, kind) counts failed attempts, and
	// Retries (label kind) the retries they caused.
	UpstreamErrors, Retries *prometheus.CounterVec
}

// Forwarder is the forwarding stage: it sends a routed request to its
// plan's replicas, one attempt at a time, over one upstream transport,
// and bounds each attempt's silences (header, first byte, idle).
type Forwarder struct {
	cfg       Config
	transport *http.Transport
	deps      Deps
}

// New returns a Forwarder for cfg (defaults filled by the caller). It
// starts no goroutine; Close releases its idle connections.
func New(cfg Config, d Deps) *Forwarder {
	if d.Drain == nil {
		d.Drain = context.Background()
	}
	return &Forwarder{cfg: cfg, deps: d, transport: &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   512,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}}
}

// Transport returns the upstream transport, for the other calls the
// gateway makes to replicas (/tokenize).
func (f *Forwarder) Transport() http.RoundTripper { return f.transport }

// Close closes the transport's idle connections.
func (f *Forwarder) Close() { f.transport.CloseIdleConnections() }

// Plan is what forwarding needs of a routing decision (routing.Route):
// its candidates in order, each with its predicted cached tokens, and the
// prompt's size.
type Plan interface {
	Candidates() int
	Candidate(k int) (*fleet.Replica, int)
	PromptTokens() int
}

// Send is one request to forward.
type Send struct {
	Req  *request.R
	Body []byte // the upstream body
	Plan Plan
	// Begun, when set, is called as each attempt begins (first: the
	// first), once the replica's in-flight count has the request.
	Begun func(first bool)
	// Log returns the request's logger (for the retry's line).
	Log func() *slog.Logger
}

// Answer is the attempt that answered.
type Answer struct {
	Resp      *http.Response
	Replica   *fleet.Replica
	Flight    *fleet.Flight
	Predicted int // cached tokens predicted on Replica
	Attempts  int
	// Retried is set when a later candidate answered with success after
	// the first failed.
	Retried bool
	// Sent and Answered are when the attempt was sent and its headers
	// came.
	Sent, Answered time.Time
	// Span is the attempt's, still open (nil: tracing is off); the
	// caller ends it with the body.
	Span trace.Span
}

// maxAttempts is one try plus one retry on the next-best replica.
const maxAttempts = 2

// Retryable reports upstream statuses that mean the replica, not the
// request, failed.
func Retryable(status int) bool {
	switch status {
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// Forward sends s to its plan's first candidate. A replica that fails
// before answering (connection refused or reset, or a 5xx) is reported
// to the fleet, and the request is retried once on the next candidate; a
// client that goes away cancels the upstream request and is not held
// against the replica. When every attempt answered with an error status,
// the last answer is returned. Errors before any answer are
// *apierror.Error values, or ctx's error.
func (f *Forwarder) Forward(ctx context.Context, s Send) (Answer, error) {
	var lastErr error
	n := min(maxAttempts, s.Plan.Candidates())
	for i := range n {
		rep, predicted := s.Plan.Candidate(i)
		a := Answer{Replica: rep, Predicted: predicted, Attempts: i + 1}
		a.Flight = rep.Begin(int64(max(0, s.Plan.PromptTokens()-predicted)))
		if s.Begun != nil {
			s.Begun(i == 0)
		}
		actx := ctx
		if f.deps.Tracer != nil {
			actx, a.Span = f.deps.Tracer.StartAttempt(ctx, s.Req, rep.Spec.Name, rep.URL().Host, a.Attempts)
		}
		a.Sent = time.Now()
		resp, err := f.attempt(actx, s, rep)
		if err == nil && !Retryable(resp.StatusCode) {
			rep.ReportSuccess()
			a.Retried = i > 0
			return a.answered(resp), nil
		}
		if ctx.Err() != nil {
			endAttempt(a.Span, resp, ctx.Err())
			a.Flight.Done()
			if resp != nil {
				resp.Body.Close()
			}
			return Answer{}, ctx.Err()
		}
		var kind string
		kind, lastErr = f.failed(rep, a.Sent, resp, err)
		if i == n-1 && resp != nil {
			return a.answered(resp), nil // out of replicas: the client gets the replica's own error
		}
		endAttempt(a.Span, resp, err)
		a.Flight.Done()
		if i == n-1 {
			break
		}
		if resp != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		f.deps.Retries.WithLabelValues(kind).Inc()
		if s.Log != nil {
			s.Log().InfoContext(actx, "retrying on next-best replica", "failed", rep.Spec.Name, "err", lastErr)
		}
	}
	return Answer{}, apierror.BadGateway(lastErr, "the upstream replica failed before answering; try again")
}

// answered completes a with the answer resp.
func (a Answer) answered(resp *http.Response) Answer {
	a.Resp, a.Answered = resp, time.Now()
	a.Span = answered(a.Span, resp)
	return a
}

// failed reports a failed attempt on rep (sent at sent) to its health and
// metrics, and returns its kind and error.
func (f *Forwarder) failed(rep *fleet.Replica, sent time.Time, resp *http.Response, err error) (string, error) {
	kind := failureKind(err)
	if err == nil {
		kind = "status_" + strconv.Itoa(resp.StatusCode)
		err = fmt.Errorf("replica %s answered %s", rep.Spec.Name, resp.Status)
	} else {
		err = fmt.Errorf("replica %s: %w", rep.Spec.Name, err)
	}
	rep.ReportFailureOf(sent, err)
	f.deps.UpstreamErrors.WithLabelValues(rep.Spec.Name, kind).Inc()
	return kind, err
}

// ReportBroken reports a body that broke after the first byte (too late
// to retry) against the replica that sent it, sent at sent, unless the
// gateway's drain cut it.
func (f *Forwarder) ReportBroken(rep *fleet.Replica, sent time.Time, err error) {
	if errors.Is(err, ErrDraining) {
		return
	}
	rep.ReportFailureOf(sent, err)
	f.deps.UpstreamErrors.WithLabelValues(rep.Spec.Name, "broken_body").Inc()
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
