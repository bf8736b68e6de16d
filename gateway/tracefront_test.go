package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/warmpath/warmpath/gateway/proxy"
	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/vllmsim"
)

// tracedSender sends requests with the dev key (or another) and a
// distinct client traceparent each.
type tracedSender struct {
	t   *testing.T
	url string
	n   int
}

// send returns the request's trace, its status and its body.
func (s *tracedSender) send(method, path, body, key string) (trace.TraceID, int, []byte) {
	s.t.Helper()
	s.n++
	tp, tid, _ := clientTrace(100 + s.n)
	req, _ := http.NewRequest(method, s.url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("traceparent", tp)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return tid, resp.StatusCode, b
}

// named returns the spans called name among spans.
func named(spans tracetest.SpanStubs, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// idOf reads the "id" of a JSON object.
func idOf(t *testing.T, b []byte) string {
	t.Helper()
	var v struct{ ID string }
	if err := json.Unmarshal(b, &v); err != nil || v.ID == "" {
		t.Fatalf("no id in %s (%v)", b, err)
	}
	return v.ID
}

const testTraceKey = "sk-trace-key"

func startTracedKeyGateway(t *testing.T) (*tracedSender, *tracetest.InMemoryExporter) {
	sim := startSim(t, vllmsim.Config{Replicas: 1})
	cfg := fleetConfig(sim)
	cfg.DevKey, cfg.Auth.Mode = testTraceKey, ""
	rdb := redisFor(t, &cfg)
	exp := tracetest.NewInMemoryExporter()
	gw := startTracedGateway(t, cfg, rdb, exp, &syncBuffer{})
	return &tracedSender{t: t, url: gw.URL}, exp
}

// Authentication is a "warmpath.auth" span under the server span: the
// tenant and key id it found, the same as the routing span's; a refused
// key ends it with an error status, the 401 and the error's code.
func TestTracingAuth(t *testing.T) {
	s, exp := startTracedKeyGateway(t)
	tid, status, body := s.send(http.MethodPost, "/v1/chat/completions", `{"model":"qwen3-32b","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, testTraceKey)
	if status != http.StatusOK {
		t.Fatalf("chat: status %d: %s", status, body)
	}
	server, _, all := traceSpans(t, exp, tid)
	auth, route := named(all, "warmpath.auth"), named(all, "warmpath.route")
	if len(auth) != 1 || len(route) != 1 || auth[0].Parent.SpanID() != server.SpanContext.SpanID() {
		t.Fatalf("want one warmpath.auth under the server span and one warmpath.route: %v", names(all))
	}
	for _, k := range []string{"warmpath.tenant", "warmpath.key_id"} {
		if got, want := attr(auth[0], k).AsString(), attr(route[0], k).AsString(); got == "" || got != want {
			t.Errorf("auth span %s = %q; want the routing span's %q", k, got, want)
		}
	}
	if auth[0].Status.Code == codes.Error {
		t.Errorf("accepted key: auth span status %v", auth[0].Status)
	}

	tid, status, _ = s.send(http.MethodPost, "/v1/chat/completions", `{}`, "sk-wrong")
	if status != http.StatusUnauthorized {
		t.Fatalf("wrong key: status %d", status)
	}
	_, _, all = traceSpans(t, exp, tid)
	auth = named(all, "warmpath.auth")
	if len(auth) != 1 || auth[0].Status.Code != codes.Error || attr(auth[0], "http.response.status_code").AsInt64() != 401 ||
		attr(auth[0], "error.type").AsString() != "invalid_api_key" || attr(auth[0], "warmpath.tenant").AsString() != "" {
		t.Errorf("refused key: auth spans %+v; want one, Error, 401, error.type invalid_api_key, no tenant", auth)
	}
}

// The Responses, Conversations and Messages fronts name their server
// spans after their own routes, with gen_ai.operation.name on the
// routes that run a model and the response or conversation id of the
// routes that name one; the Messages API authenticates under its own
// warmpath.auth span.
func TestTracingFronts(t *testing.T) {
	s, exp := startTracedKeyGateway(t)
	server := func(method, path, body string) (tracetest.SpanStub, tracetest.SpanStubs, []byte) {
		t.Helper()
		tid, status, b := s.send(method, path, body, testTraceKey)
		if status != http.StatusOK {
			t.Fatalf("%s %s: status %d: %s", method, path, status, b)
		}
		span, _, all := traceSpans(t, exp, tid)
		return span, all, b
	}
	check := func(span tracetest.SpanStub, name, route, op, key, id string) {
		t.Helper()
		if span.Name != name || attr(span, "http.route").AsString() != route || attr(span, "gen_ai.operation.name").AsString() != op {
			t.Errorf("span %q route %q op %q; want %q, %q, %q", span.Name, attr(span, "http.route").AsString(),
				attr(span, "gen_ai.operation.name").AsString(), name, route, op)
		}
		if key != "" && attr(span, key).AsString() != id {
			t.Errorf("span %q: %s = %q; want %q", span.Name, key, attr(span, key).AsString(), id)
		}
	}
	span, _, b := server(http.MethodPost, "/v1/responses", `{"model":"qwen3-32b","input":"hi","max_output_tokens":16}`)
	check(span, "POST /v1/responses", "/v1/responses", "chat", "", "")
	rid := idOf(t, b)
	span, _, _ = server(http.MethodGet, "/v1/responses/"+rid, "")
	check(span, "GET /v1/responses/{id}", "/v1/responses/{id}", "", "gen_ai.response.id", rid)
	span, _, b = server(http.MethodPost, "/v1/conversations", `{}`)
	check(span, "POST /v1/conversations", "/v1/conversations", "", "", "")
	cid := idOf(t, b)
	span, _, _ = server(http.MethodGet, "/v1/conversations/"+cid+"/items", "")
	check(span, "GET /v1/conversations/{id}/items", "/v1/conversations/{id}/items", "", "gen_ai.conversation.id", cid)
	span, all, _ := server(http.MethodPost, "/v1/messages", `{"model":"qwen3-32b","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
	check(span, "POST /v1/messages", "/v1/messages", "chat", "", "")
	if auth := named(all, "warmpath.auth"); len(auth) != 1 || auth[0].Parent.SpanID() != span.SpanContext.SpanID() {
		t.Errorf("messages: want one warmpath.auth under the server span: %v", names(all))
	}
}

// A streamed answer's attempt span carries a "warmpath.first_token"
// event between its start and its end (the end of the body), with the
// time from arrival; an answer that is not streamed has none.
func TestTracingFirstToken(t *testing.T) {
	s, exp := startTracedKeyGateway(t)
	for _, stream := range []bool{true, false} {
		body := `{"model":"qwen3-32b","max_tokens":8,"stream":` + map[bool]string{true: "true", false: "false"}[stream] +
			`,"messages":[{"role":"user","content":"first token"}]}`
		tid, status, b := s.send(http.MethodPost, "/v1/chat/completions", body, testTraceKey)
		if status != http.StatusOK {
			t.Fatalf("stream %v: status %d: %s", stream, status, b)
		}
		_, attempts, all := traceSpans(t, exp, tid)
		if len(attempts) != 1 {
			t.Fatalf("stream %v: %d attempt spans: %v", stream, len(attempts), names(all))
		}
		a := attempts[0]
		var events []string
		for _, e := range a.Events {
			events = append(events, e.Name)
			if e.Name != "warmpath.first_token" {
				continue
			}
			ttft := -1.0
			for _, kv := range e.Attributes {
				if kv.Key == "warmpath.ttft" {
					ttft = kv.Value.AsFloat64()
				}
			}
			if e.Time.Before(a.StartTime) || e.Time.After(a.EndTime) || ttft <= 0 {
				t.Errorf("first_token at %v (ttft %v) outside the attempt %v..%v", e.Time, ttft, a.StartTime, a.EndTime)
			}
		}
		if got := strings.Join(events, ","); (got == "warmpath.first_token") != stream {
			t.Errorf("stream %v: attempt events %q", stream, got)
		}
	}
}

// A background response runs in a trace of its own: a
// "warmpath.background" consumer span linked to the server span of the
// POST that created it, with the response's id, and the upstream attempt
// under it.
func TestTracingBackgroundLink(t *testing.T) {
	s, exp := startTracedKeyGateway(t)
	tid, status, b := s.send(http.MethodPost, "/v1/responses", `{"model":"qwen3-32b","input":"later","max_output_tokens":16,"background":true}`, testTraceKey)
	if status != http.StatusOK {
		t.Fatalf("background create: status %d: %s", status, b)
	}
	id := idOf(t, b)
	creator, _, _ := traceSpans(t, exp, tid)
	var bg tracetest.SpanStub
	testrun.Eventually(t, 10*time.Second, func() bool {
		for _, sp := range named(exp.GetSpans(), "warmpath.background") {
			if attr(sp, "gen_ai.response.id").AsString() == id {
				bg = sp
				return true
			}
		}
		return false
	}, "the background run's span")
	if bg.SpanKind != trace.SpanKindConsumer || bg.Parent.IsValid() || bg.SpanContext.TraceID() == tid {
		t.Errorf("background span kind %v, parent %v, trace %v; want a consumer root in a trace of its own", bg.SpanKind, bg.Parent, bg.SpanContext.TraceID())
	}
	if len(bg.Links) != 1 || bg.Links[0].SpanContext.SpanID() != creator.SpanContext.SpanID() || bg.Links[0].SpanContext.TraceID() != tid {
		t.Errorf("background span links %+v; want one, to the creating request's server span %v", bg.Links, creator.SpanContext.SpanID())
	}
	var under int
	for _, sp := range exp.GetSpans() {
		if sp.SpanKind == trace.SpanKindClient && sp.Parent.SpanID() == bg.SpanContext.SpanID() {
			under++
		}
	}
	if under != 1 {
		t.Errorf("%d attempt spans under the background span; want 1", under)
	}
}

// A body that breaks after the first byte ends the answering attempt's
// span with an error status and, for a stream, the cut's reason.
func TestTracingBodyBroke(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	for _, stream := range []bool{true, false} {
		_, span := tp.Tracer("test").Start(context.Background(), "attempt")
		bodyBroke(span, fmt.Errorf("read: %w", proxy.ErrIdle), stream)
		span.End()
	}
	bodyBroke(nil, proxy.ErrIdle, true) // tracing off: nothing to mark
	got := exp.GetSpans()
	if len(got) != 2 {
		t.Fatalf("%d spans", len(got))
	}
	for i, want := range []string{"idle_timeout", ""} {
		if got[i].Status.Code != codes.Error || attr(got[i], "warmpath.stream.cut").AsString() != want {
			t.Errorf("span %d: status %v, warmpath.stream.cut %q; want Error, %q", i, got[i].Status, attr(got[i], "warmpath.stream.cut").AsString(), want)
		}
	}
}
