package gateway

// OpenTelemetry tracing: off by default, and then the gateway neither
// records spans nor touches trace headers (a client's traceparent passes
// to the replica as any other header). It is on when tracing.endpoint is
// set, when Options.Getenv finds OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (warmpath serve passes os.Getenv),
// or when Options.SpanExporter is set (tests). The provider is the
// gateway's own (never otel's global), shut down when Run returns.
//
// Spans (attribute names follow the OpenTelemetry semantic conventions
// v1.41.0, semconv/v1.41.0, whose GenAI conventions are still marked
// "development"):
//
//   - "<METHOD> <route pattern>" (kind server), one per request on every
//     route (e.g. "POST /v1/chat/completions"; a request no route
//     matched is named by its method alone). It continues the client's
//     W3C traceparent/tracestate. Attributes: http.request.method,
//     url.path, http.route, http.response.status_code; status Error for
//     5xx and for a response aborted mid-body.
//   - "warmpath.queue" (internal), a child of the request's span for a
//     request the pipeline (Do) admitted: from the end of routing's I/O
//     before admission to admission (the queue wait). Attributes:
//     gen_ai.request.model, warmpath.queue.wait (seconds), and who sent it
//     (below).
//   - "warmpath.route" (internal): the routing decision and its I/O.
//     Attributes: warmpath.routing.reason, warmpath.routing.policy,
//     warmpath.routing.rebind (why the session left its replica, when it
//     did), warmpath.replica (the first candidate),
//     warmpath.predicted_cached_tokens (on that replica),
//     warmpath.ttft_estimate (its estimate, seconds, for policies that
//     estimate), warmpath.prompt_tokens (the estimate routing used), and
//     who sent it: warmpath.tenant, warmpath.key_id, warmpath.class and
//     warmpath.session (the session key's xxhash in hex, never the key).
//   - "<gen_ai.operation.name> <model>" (kind client, e.g. "chat
//     qwen3-32b"), one per upstream attempt: a retry is a second span. The
//     replica's request carries this span's traceparent. Attributes:
//     gen_ai.operation.name ("chat" or "text_completion"),
//     gen_ai.request.model, warmpath.replica, warmpath.attempt (1, 2),
//     server.address, http.response.status_code; status Error when the
//     attempt failed (refused, timed out, or a 5xx). The attempt that
//     answered ends with the response body, with gen_ai.usage.input_tokens,
//     gen_ai.usage.output_tokens, gen_ai.usage.cache_read.input_tokens
//     and warmpath.cached_tokens (the same figure) when the
//     replica reported usage. A streamed answer's attempt has the event
//     "warmpath.first_token" (warmpath.ttft, seconds from arrival); a body
//     that breaks after the first byte sets status Error and, for a
//     stream, warmpath.stream.cut.
//   - "warmpath.auth" (internal), a child of the server span: the
//     credential check, with warmpath.tenant and warmpath.key_id; a
//     refusal has status Error, http.response.status_code and error.type.
//   - "warmpath.background" (consumer), the root of a background
//     response's run, linked to the server span of the POST that created
//     it (whose context the stored record's headers carry); attributes
//     gen_ai.operation.name, gen_ai.response.id, warmpath.tenant.
//
// The Responses, Conversations and Messages fronts name their server
// spans after their own routes and add gen_ai.operation.name (routes
// that run a model) and gen_ai.response.id or gen_ai.conversation.id
// (tracefront.go).
//
// Probes and scrapes (/healthz, /readyz, /metrics, the status page's
// JSON) start no trace: a load balancer's probe every few seconds would
// fill the backend with one-span traces.
//
// Prompt and completion text are never recorded. Log lines written with
// a request's context carry trace_id and span_id (traceLogHandler).

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/gateway/routing"
)

// untraced are the paths the tracing middleware passes through untouched.
var untraced = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true, "/ui/status.json": true}

// Tracing protocols (tracing.protocol).
const (
	TracingHTTP = "http"
	TracingGRPC = "grpc"
)

// TracingConfig turns on OpenTelemetry tracing, exported over OTLP (see
// tracing.go for the spans). Off unless endpoint is set or the standard
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is
// (the exporter then reads every OTEL_EXPORTER_OTLP_* variable itself:
// headers, certificates, timeout, compression).
type TracingConfig struct {
	// Endpoint is the OTLP collector: a URL (http://collector:4318; for
	// http, a URL without a path gets /v1/traces) or host:port. Empty:
	// the OTEL_EXPORTER_OTLP_* variables decide, and without them
	// tracing is off.
	Endpoint string `yaml:"endpoint"`
	// Protocol is "http" (OTLP/HTTP with protobuf, port 4318) or "grpc"
	// (port 4317). Unset: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or
	// OTEL_EXPORTER_OTLP_PROTOCOL (grpc or http/protobuf), else http.
	Protocol string `yaml:"protocol"`
	// SampleRatio is the fraction of the traces this gateway starts that
	// are sampled; default 1.0 (or OTEL_TRACES_SAMPLER_ARG with a
	// traceidratio sampler); negative samples none. A request whose client
	// sent a traceparent follows the client's sampled flag whatever it is.
	SampleRatio float64 `yaml:"sample_ratio"`
	// Insecure sends without TLS to a host:port endpoint (an endpoint URL
	// says it with its scheme).
	Insecure bool `yaml:"insecure"`
}

// validate checks the tracing section.
func (t TracingConfig) validate() []error {
	var errs []error
	if p := t.Protocol; p != "" && p != TracingHTTP && p != TracingGRPC {
		errs = append(errs, fmt.Errorf("config: tracing.protocol: %q is not %q or %q", p, TracingHTTP, TracingGRPC))
	}
	if t.SampleRatio > 1 {
		errs = append(errs, fmt.Errorf("config: tracing.sample_ratio: %v is above 1", t.SampleRatio))
	}
	if e := t.Endpoint; strings.Contains(e, "://") {
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("config: tracing.endpoint: %q is not an http(s) URL or host:port", e))
		}
	}
	return errs
}

// resolve applies the standard OTEL_* variables read through getenv (nil:
// none) and reports whether tracing is on.
func (t TracingConfig) resolve(getenv func(string) string) (TracingConfig, bool) {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return t, false
	}
	on := t.Endpoint != "" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	if t.Protocol == "" {
		p := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
		if p == "" {
			p = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		t.Protocol = TracingHTTP
		if p == "grpc" {
			t.Protocol = TracingGRPC
		}
	}
	if t.SampleRatio == 0 {
		t.SampleRatio = 1
		if s := getenv("OTEL_TRACES_SAMPLER"); s == "traceidratio" || s == "parentbased_traceidratio" {
			if v, err := strconv.ParseFloat(getenv("OTEL_TRACES_SAMPLER_ARG"), 64); err == nil && v >= 0 && v <= 1 {
				t.SampleRatio = v
			}
		}
	}
	return t, on
}

// exporter builds the OTLP exporter. It connects lazily: a collector that
// is down costs dropped spans, not a failed start.
func (t TracingConfig) exporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	e := t.Endpoint
	if t.Protocol == TracingGRPC {
		var opts []otlptracegrpc.Option
		switch {
		case strings.Contains(e, "://"):
			opts = append(opts, otlptracegrpc.WithEndpointURL(e))
		case e != "":
			opts = append(opts, otlptracegrpc.WithEndpoint(e))
		}
		if t.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		return otlptracegrpc.New(ctx, opts...)
	}
	var opts []otlptracehttp.Option
	switch {
	case strings.Contains(e, "://"):
		if u, err := url.Parse(e); err == nil && (u.Path == "" || u.Path == "/") {
			u.Path = "/v1/traces"
			e = u.String()
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(e))
	case e != "":
		opts = append(opts, otlptracehttp.WithEndpoint(e))
	}
	if t.Insecure {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	return otlptracehttp.New(ctx, opts...)
}

// tracing is the gateway's tracer and propagator; tp is nil when tracing
// is off, and then the tracer records nothing.
type tracing struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// tracerName is the instrumentation scope's name.
const tracerName = "github.com/warmpath/warmpath/gateway"

// newTracing builds the tracer provider when tracing is on: the
// exporter from o.SpanExporter (synchronous, for tests) or from the
// configuration (batched), a parent-based sampler whose root decisions
// are TraceIDRatioBased.
func newTracing(cfg TracingConfig, o Options) (tracing, error) {
	off := tracing{tracer: noop.NewTracerProvider().Tracer(tracerName)}
	tc, on := cfg.resolve(o.Getenv)
	if !on && o.SpanExporter == nil {
		return off, nil
	}
	var export sdktrace.TracerProviderOption
	if o.SpanExporter != nil {
		export = sdktrace.WithSyncer(o.SpanExporter)
	} else {
		exp, err := tc.exporter(context.Background())
		if err != nil {
			return off, fmt.Errorf("config: tracing: %w", err)
		}
		export = sdktrace.WithBatcher(exp)
	}
	// resource.WithFromEnv reads OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES (the SDK's own reading of the standard
	// variables, as the exporters'); the service name defaults to warmpath.
	res, err := resource.New(context.Background(), resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(semconv.ServiceName("warmpath")), resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && res == nil {
		return off, fmt.Errorf("config: tracing: resource: %w", err)
	}
	ratio := max(tc.SampleRatio, 0)
	tp := sdktrace.NewTracerProvider(export, sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))))
	return tracing{tp: tp, tracer: tp.Tracer(tracerName), prop: propagation.TraceContext{}}, nil
}

// on reports whether tracing is on.
func (t *tracing) on() bool { return t.tp != nil }

// tracingShutdownTimeout bounds the export of the last spans at exit.
const tracingShutdownTimeout = 5 * time.Second

// shutdown flushes and stops the provider, within tracingShutdownTimeout.
func (t *tracing) shutdown(log *slog.Logger) {
	if t.tp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), tracingShutdownTimeout)
	defer cancel()
	if err := t.tp.Shutdown(ctx); err != nil {
		log.Warn("tracing: shutdown: the last spans may be lost", "err", err)
	}
}

// middleware starts the server span of every request, continuing the
// client's trace context, and names it after the route chi matched.
func (t *tracing) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if untraced[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := t.tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method), semconv.URLPath(r.URL.Path)))
		note := &frontNote{}
		ctx = context.WithValue(ctx, frontNoteKey{}, note)
		rec := &statusRecorder{ResponseWriter: w}
		defer func() {
			route := note.route
			if rc := chi.RouteContext(r.Context()); rc != nil && route == "" {
				route = rc.RoutePattern()
			}
			if route != "" {
				span.SetName(r.Method + " " + route)
				span.SetAttributes(semconv.HTTPRoute(route))
			}
			span.SetAttributes(note.attrs...)
			code := rec.code()
			p := recover()
			if p != nil && r.Context().Err() == nil {
				span.SetStatus(codes.Error, "response aborted")
			}
			span.SetAttributes(semconv.HTTPResponseStatusCode(code))
			if code >= 500 {
				span.SetStatus(codes.Error, http.StatusText(code))
			}
			span.End()
			if p != nil {
				panic(p)
			}
		}()
		next.ServeHTTP(rec, r.WithContext(ctx))
	})
}

// StartAttempt starts the span of an upstream attempt of r (the n-th,
// from 1) on replica (proxy.Tracer).
func (t *tracing) StartAttempt(ctx context.Context, r *request.R, replica, host string, n int) (context.Context, trace.Span) {
	op := r.API().Operation()
	return t.tracer.Start(ctx, op+" "+r.Model(), trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		semconv.GenAIOperationNameKey.String(op), semconv.GenAIRequestModel(r.Model()),
		attribute.String("warmpath.replica", replica), attribute.Int("warmpath.attempt", n),
		semconv.ServerAddress(host)))
}

// endAnswered ends the span of the attempt that answered, once its body
// is done, with the usage the replica reported.
func endAnswered(span trace.Span, u request.Usage, have bool) {
	if span == nil {
		return
	}
	if have {
		span.SetAttributes(semconv.GenAIUsageInputTokens(u.PromptTokens), semconv.GenAIUsageOutputTokens(u.CompletionTokens),
			semconv.GenAIUsageCacheReadInputTokens(u.CachedTokens), attribute.Int("warmpath.cached_tokens", u.CachedTokens))
	}
	span.End()
}

// recordPhases records the queue wait and the routing decision as spans,
// after the fact, from the exchange's timestamps: no span is open while
// the request waits.
func (t *tracing) recordPhases(ctx context.Context, x *exchange, policy string) {
	if !t.on() || !trace.SpanFromContext(ctx).IsRecording() {
		return
	}
	who := requestAttrs(x.req.R)
	tok := x.req.Tokenized
	if !x.prepared.IsZero() {
		pctx, s := t.tracer.Start(ctx, "warmpath.prepare", trace.WithTimestamp(x.start), trace.WithAttributes(who...))
		if !tok.Start.IsZero() && tok.Start.Before(x.prepared) {
			t.recordTokenize(pctx, tok)
		}
		s.End(trace.WithTimestamp(x.prepared))
	}
	if !x.prepared.IsZero() && !x.admitted.IsZero() {
		_, s := t.tracer.Start(ctx, "warmpath.queue", trace.WithTimestamp(x.prepared),
			trace.WithAttributes(append(who, semconv.GenAIRequestModel(x.req.Model()),
				attribute.Float64("warmpath.queue.wait", x.admitted.Sub(x.prepared).Seconds()))...))
		s.End(trace.WithTimestamp(x.admitted))
	}
	if x.route == nil || x.admitted.IsZero() {
		return
	}
	plan := x.route.Plan
	attrs := append(who, attribute.String("warmpath.routing.reason", plan.Reason),
		attribute.String("warmpath.routing.policy", policy), attribute.Int("warmpath.prompt_tokens", plan.PromptTokens))
	if plan.Rebind != "" {
		attrs = append(attrs, attribute.String("warmpath.routing.rebind", plan.Rebind))
	}
	if len(plan.Order) > 0 {
		rep, predicted := x.route.Candidate(0)
		attrs = append(attrs, attribute.String("warmpath.replica", rep.Spec.Name), attribute.Int("warmpath.predicted_cached_tokens", predicted))
		if len(plan.Estimates) > 0 {
			attrs = append(attrs, attribute.Float64("warmpath.ttft_estimate", plan.Estimates[0].TTFT))
		}
	}
	rctx, s := t.tracer.Start(ctx, "warmpath.route", trace.WithTimestamp(x.admitted), trace.WithAttributes(attrs...))
	if !tok.Start.IsZero() && !tok.Start.Before(x.admitted) {
		t.recordTokenize(rctx, tok)
	}
	s.End(trace.WithTimestamp(x.routed))
}

// recordTokenize records the tokenizer call routing waited for as a
// warmpath.tokenize span under the phase that waited (prepare or route):
// where the ids came from (warmpath.tokenize.source: ids, local, cache,
// replica) and how many.
func (t *tracing) recordTokenize(ctx context.Context, tok routing.Tokenized) {
	_, s := t.tracer.Start(ctx, "warmpath.tokenize", trace.WithTimestamp(tok.Start), trace.WithAttributes(
		attribute.String("warmpath.tokenize.source", tok.Source), attribute.Int("warmpath.prompt_tokens", tok.Tokens)))
	if tok.Err != nil {
		s.SetStatus(codes.Error, tok.Err.Error())
	}
	s.End(trace.WithTimestamp(tok.End))
}

// requestAttrs are who sent a request and which conversation it
// continues: the tenant, the key id, the priority class and the session
// key hashed (xxhash, hex), never the key itself.
func requestAttrs(r *request.R) []attribute.KeyValue {
	attrs := []attribute.KeyValue{attribute.String("warmpath.class", r.Class().String())}
	if p := r.Principal(); p != nil {
		attrs = append(attrs, attribute.String("warmpath.tenant", p.TenantID), attribute.String("warmpath.key_id", p.KeyID))
	}
	if r.Session().Value != "" {
		attrs = append(attrs, attribute.String("warmpath.session", strconv.FormatUint(xxhash.Sum64String(r.Session().Value), 16)))
	}
	return attrs
}

// Inject writes span's trace context into h, replacing the client's
// (proxy.Tracer).
func (t *tracing) Inject(ctx context.Context, h http.Header) {
	if t.on() {
		t.prop.Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// traceLogHandler adds trace_id and span_id to the records logged with a
// context that holds a valid span.
type traceLogHandler struct{ slog.Handler }

func (h traceLogHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceLogHandler{h.Handler.WithAttrs(as)}
}

func (h traceLogHandler) WithGroup(name string) slog.Handler {
	return traceLogHandler{h.Handler.WithGroup(name)}
}
