package gateway

// Spans and span details around the routed request (tracing.go has the
// overview): the authentication span, what the API fronts (Responses,
// Conversations, Messages) add to their server spans, the first token of
// a stream, and the span of a background response's run, linked to the
// request that created it.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/warmpath/warmpath/gateway/proxy"
	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
	"github.com/warmpath/warmpath/tenancy"
)

// authenticator is tenancy's check of a request's credentials.
type authenticator = func(context.Context, http.Header) (*tenancy.Principal, error)

// authenticate wraps auth in a "warmpath.auth" span (tracing on): the
// tenant and key id it found, or, for a refusal, status Error with the
// HTTP status and the error code (error.type) the client gets.
func (t *tracing) authenticate(auth authenticator) authenticator {
	if !t.on() {
		return auth
	}
	return func(ctx context.Context, h http.Header) (*tenancy.Principal, error) {
		ctx, span := t.tracer.Start(ctx, "warmpath.auth")
		defer span.End()
		p, err := auth(ctx, h)
		if p != nil {
			span.SetAttributes(attribute.String("warmpath.tenant", p.TenantID), attribute.String("warmpath.key_id", p.KeyID))
		}
		if err != nil {
			he := apierror.From(err)
			typ := he.Code
			if typ == "" {
				typ = http.StatusText(he.Status)
			}
			span.SetAttributes(semconv.HTTPResponseStatusCode(he.Status), semconv.ErrorTypeKey.String(typ))
			span.SetStatus(codes.Error, "refused")
		}
		return p, err
	}
}

// frontNote is what an API front tells the tracing middleware about a
// request it served: its own route pattern (more precise than the
// wildcard it is mounted on) and span attributes. The middleware puts
// one in every traced request's context.
type frontNote struct {
	route string
	attrs []attribute.KeyValue
}

type frontNoteKey struct{}

// front wraps an API front's handler (its own ServeMux, which sets
// r.Pattern): the server span takes the front's route, and op names the
// GenAI operation of a pattern ("" for none) and ids the semconv
// attributes its {id} path value is. A POST to /v1/responses carries the
// server span's context in its headers, which a background response
// keeps with its record for the run's link (backgroundSpan).
func (t *tracing) front(h http.Handler, op func(pattern string) string, id func(pattern string) attribute.Key) http.Handler {
	if !t.on() {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		note, _ := r.Context().Value(frontNoteKey{}).(*frontNote)
		if r.Method == http.MethodPost && r.URL.Path == "/v1/responses" {
			t.prop.Inject(r.Context(), propagation.HeaderCarrier(r.Header))
		}
		h.ServeHTTP(w, r)
		if note == nil || r.Pattern == "" {
			return
		}
		_, route, ok := strings.Cut(r.Pattern, " ")
		if !ok {
			route = r.Pattern
		}
		note.route = route
		if o := op(r.Pattern); o != "" {
			note.attrs = append(note.attrs, semconv.GenAIOperationNameKey.String(o))
		}
		if k := id(r.Pattern); k != "" && r.PathValue("id") != "" {
			note.attrs = append(note.attrs, k.String(r.PathValue("id")))
		}
	})
}

// responsesOp is the GenAI operation of a Responses or Conversations
// route: creating a response is a chat; the others read or change stored
// records, no GenAI operation.
func responsesOp(pattern string) string {
	if pattern == "POST /v1/responses" {
		return semconv.GenAIOperationNameChat.Value.AsString()
	}
	return ""
}

// responsesID is what a Responses or Conversations route's {id} is.
func responsesID(pattern string) attribute.Key {
	switch {
	case strings.Contains(pattern, "/v1/responses/{id}"):
		return semconv.GenAIResponseIDKey
	case strings.Contains(pattern, "/v1/conversations/{id}"):
		return semconv.GenAIConversationIDKey
	}
	return ""
}

// messagesOp is the GenAI operation of a Messages route: a message is a
// chat; counting tokens is none.
func messagesOp(pattern string) string {
	if pattern == "/v1/messages" {
		return semconv.GenAIOperationNameChat.Value.AsString()
	}
	return ""
}

func noID(string) attribute.Key { return "" }

// firstToken marks the first event of a streamed answer on its attempt's
// span (nil: tracing is off): "warmpath.first_token", with the time from
// the request's arrival (warmpath.ttft, seconds), as warmpath_ttft_seconds
// observes it.
func firstToken(span trace.Span, since time.Duration) {
	if span != nil {
		span.AddEvent("warmpath.first_token", trace.WithAttributes(attribute.Float64("warmpath.ttft", since.Seconds())))
	}
}

// bodyBroke marks the answering attempt's span (nil: tracing is off)
// whose body broke after the first byte: status Error, and for a stream
// warmpath.stream.cut, the reason warmpath_streams_cut_total counts.
func bodyBroke(span trace.Span, err error, stream bool) {
	if span == nil {
		return
	}
	if stream {
		span.SetAttributes(attribute.String("warmpath.stream.cut", proxy.CutReason(err)))
	}
	span.SetStatus(codes.Error, err.Error())
}

// backgroundSpan starts the span of a background response's run
// ("warmpath.background", kind consumer: a job taken from the queue) in
// a new trace, linked to the server span of the request that created the
// response, whose context the stored headers carry (front). The caller
// ends it with the response body (endWithBody). ctx is returned as is
// when tracing is off or the turn is not a background run.
func (t *tracing) backgroundSpan(ctx context.Context, turn chatapi.Turn) (context.Context, trace.Span) {
	if !t.on() || !turn.Background || trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, nil
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithNewRoot(), trace.WithAttributes(
		semconv.GenAIOperationNameChat, attribute.String("warmpath.tenant", turn.Tenant))}
	if turn.ResponseID != "" {
		opts = append(opts, trace.WithAttributes(semconv.GenAIResponseID(turn.ResponseID)))
	}
	if sc := trace.SpanContextFromContext(t.prop.Extract(context.Background(), propagation.HeaderCarrier(turn.Header))); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	return t.tracer.Start(ctx, "warmpath.background", opts...)
}

// endWithBody ends span (nil: nothing to end) when resp's body is closed,
// or at once, with err, when there is no response.
func endWithBody(span trace.Span, resp *http.Response, err error) {
	if span == nil {
		return
	}
	if resp == nil {
		if err != nil && !errors.Is(err, context.Canceled) {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		return
	}
	if resp.StatusCode >= 400 {
		span.SetStatus(codes.Error, resp.Status)
	}
	resp.Body = &spanBody{ReadCloser: resp.Body, span: span}
}

// spanBody ends its span when the body is closed.
type spanBody struct {
	io.ReadCloser
	span trace.Span
	once sync.Once
}

func (b *spanBody) Close() error {
	b.once.Do(func() { b.span.End() })
	return b.ReadCloser.Close()
}
