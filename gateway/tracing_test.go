package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/vllmsim"
)

// startTracedGateway starts a gateway on cfg whose spans go to exp, and
// whose log lines (info and up, as JSON) go to logs.
func startTracedGateway(t *testing.T, cfg Config, rdb redis.UniversalClient, exp sdktrace.SpanExporter, logs *syncBuffer) *testGateway {
	t.Helper()
	g, err := New(cfg, Options{Redis: rdb, Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})), SpanExporter: exp})
	if err != nil {
		t.Fatalf("gateway.New: %v", err)
	}
	testrun.Start(t, "gateway", g.Run)
	tg := &testGateway{Gateway: g, URL: "http://" + g.Addr()}
	tg.waitHealthy(t)
	return tg
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines returns the JSON log lines whose message is msg.
func (s *syncBuffer) lines(msg string) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for l := range strings.SplitSeq(s.b.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// clientTrace returns a sampled client traceparent, its trace id and its
// span id, distinct for each n.
func clientTrace(n int) (string, trace.TraceID, trace.SpanID) {
	tid, _ := trace.TraceIDFromHex(fmt.Sprintf("4bf92f3577b34da6a3ce929d%08x", n+1))
	sid, _ := trace.SpanIDFromHex(fmt.Sprintf("00f067aa%08x", n+1))
	return fmt.Sprintf("00-%s-%s-01", tid, sid), tid, sid
}

// traceSpans waits for the server span of trace tid (it ends after the
// client has its response) and returns the trace's server span and its
// attempt spans, in start order.
func traceSpans(t *testing.T, exp *tracetest.InMemoryExporter, tid trace.TraceID) (server tracetest.SpanStub, attempts []tracetest.SpanStub, all tracetest.SpanStubs) {
	t.Helper()
	testrun.Eventually(t, 5*time.Second, func() bool {
		server, attempts, all = tracetest.SpanStub{}, nil, nil
		for _, s := range exp.GetSpans() {
			if s.SpanContext.TraceID() != tid {
				continue
			}
			all = append(all, s)
			switch s.SpanKind {
			case trace.SpanKindServer:
				server = s
			case trace.SpanKindClient:
				attempts = append(attempts, s)
			}
		}
		return server.SpanContext.IsValid()
	}, "the request's server span")
	return server, attempts, all
}

func attr(s tracetest.SpanStub, key string) attribute.Value {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// parseTraceparent splits a version-00 traceparent.
func parseTraceparent(t *testing.T, tp string) (trace.TraceID, trace.SpanID) {
	t.Helper()
	f := strings.Split(tp, "-")
	if len(f) != 4 || f[0] != "00" {
		t.Fatalf("traceparent %q is not version 00", tp)
	}
	tid, err1 := trace.TraceIDFromHex(f[1])
	sid, err2 := trace.SpanIDFromHex(f[2])
	if err1 != nil || err2 != nil {
		t.Fatalf("traceparent %q: %v %v", tp, err1, err2)
	}
	return tid, sid
}

// A traced chat request continues the client's trace: the server span is
// the client span's child, the upstream attempt the server span's, and
// the replica receives the attempt's trace context.
func TestTracingChat(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1})
	cfg := fleetConfig(sim)
	rdb := redisFor(t, &cfg)
	exp := tracetest.NewInMemoryExporter()
	gw := startTracedGateway(t, cfg, rdb, exp, &syncBuffer{})
	tp, tid, sid := clientTrace(0)
	r := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 4, "messages": []msg{{"user", "hello tracing"}}},
		map[string]string{"traceparent": tp, "tracestate": "vendor=abc", "X-Session-ID": "trace-session-secret"})
	if r.Status != http.StatusOK {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	server, attempts, all := traceSpans(t, exp, tid)
	if server.Name != "POST /v1/chat/completions" || server.Parent.SpanID() != sid || !server.Parent.IsRemote() {
		t.Errorf("server span %q, parent %v (remote %v); want POST /v1/chat/completions under the client's %v", server.Name, server.Parent.SpanID(), server.Parent.IsRemote(), sid)
	}
	if got := server.SpanContext.TraceState().Get("vendor"); got != "abc" {
		t.Errorf("tracestate vendor = %q; want the client's abc", got)
	}
	for k, want := range map[string]string{"http.request.method": "POST", "url.path": "/v1/chat/completions", "http.route": "/v1/chat/completions"} {
		if got := attr(server, k).AsString(); got != want {
			t.Errorf("server span %s = %q; want %q", k, got, want)
		}
	}
	if got := attr(server, "http.response.status_code").AsInt64(); got != 200 {
		t.Errorf("server span http.response.status_code = %d; want 200", got)
	}
	if len(attempts) != 1 {
		t.Fatalf("%d attempt spans; want 1 (trace: %v)", len(attempts), names(all))
	}
	a := attempts[0]
	replica := sim.Replicas()[0].Info().Name
	if a.Parent.SpanID() != server.SpanContext.SpanID() || a.Name != "chat qwen3-32b" {
		t.Errorf("attempt span %q with parent %v; want chat qwen3-32b under the server span %v", a.Name, a.Parent.SpanID(), server.SpanContext.SpanID())
	}
	for k, want := range map[string]any{"warmpath.replica": replica, "warmpath.attempt": int64(1), "gen_ai.operation.name": "chat",
		"gen_ai.request.model": "qwen3-32b", "gen_ai.usage.input_tokens": int64(r.Usage.PromptTokens),
		"gen_ai.usage.output_tokens": int64(r.Usage.CompletionTokens), "http.response.status_code": int64(200),
		"gen_ai.usage.cache_read.input_tokens": int64(r.Usage.CachedTokens)} {
		if got := attr(a, k).AsInterface(); got != want {
			t.Errorf("attempt span %s = %v; want %v", k, got, want)
		}
	}
	for _, name := range []string{"warmpath.queue", "warmpath.route"} {
		var found bool
		for _, s := range all {
			if s.Name == name {
				found = true
				if s.Parent.SpanID() != server.SpanContext.SpanID() {
					t.Errorf("%s span's parent %v; want the server span", name, s.Parent.SpanID())
				}
				if name == "warmpath.route" && (attr(s, "warmpath.replica").AsString() != replica || attr(s, "warmpath.routing.reason").AsString() == "") {
					t.Errorf("route span attributes %v; want warmpath.replica %s and a reason", s.Attributes, replica)
				}
				sess := attr(s, "warmpath.session").AsString()
				if attr(s, "warmpath.class").AsString() != "interactive" || attr(s, "warmpath.tenant").AsString() == "" ||
					sess == "" || strings.Contains(sess, "trace-session") {
					t.Errorf("%s span: class %q, tenant %q, session %q; want interactive, a tenant, the session key hashed",
						name, attr(s, "warmpath.class").AsString(), attr(s, "warmpath.tenant").AsString(), sess)
				}
				if name == "warmpath.queue" && attr(s, "warmpath.queue.wait").Type() != attribute.FLOAT64 {
					t.Errorf("queue span has no warmpath.queue.wait: %v", s.Attributes)
				}
			}
		}
		if !found {
			t.Errorf("no %s span in %v", name, names(all))
		}
	}
	for _, s := range all {
		for _, kv := range s.Attributes {
			if strings.Contains(kv.Value.Emit(), "hello tracing") {
				t.Errorf("span %s records the prompt in %s", s.Name, kv.Key)
			}
		}
	}
	upTID, upParent := parseTraceparent(t, sim.Replicas()[0].LastTraceparent())
	if upTID != tid || upParent != a.SpanContext.SpanID() {
		t.Errorf("replica got trace %v parent %v; want %v parent %v (the attempt span)", upTID, upParent, tid, a.SpanContext.SpanID())
	}
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

// A retry is a second attempt span under the same server span, on the
// other replica, and the replica that answered got the second attempt's
// trace context; the retry's log line carries the trace.
func TestTracingRetry(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := fleetConfig(sim)
	cfg.Health.Failures = 100 // keep the failing replica "healthy" to exercise retries
	rdb := redisFor(t, &cfg)
	exp := tracetest.NewInMemoryExporter()
	logs := &syncBuffer{}
	gw := startTracedGateway(t, cfg, rdb, exp, logs)
	bad, good := sim.Replicas()[0], sim.Replicas()[1]
	bad.SetFaults(vllmsim.Faults{ErrorRate: 1})
	// Fresh prompts until one lands on the failing replica first.
	for i := 0; ; i++ {
		if i == 40 {
			t.Fatal("no retry after 40 requests with one failing replica")
		}
		tp, tid, _ := clientTrace(i)
		r := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 4, "messages": []msg{{"user", words("q", 5+i)}}},
			map[string]string{"traceparent": tp})
		if r.Status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, r.Status, r.Body)
		}
		server, attempts, all := traceSpans(t, exp, tid)
		if len(attempts) == 1 {
			continue
		}
		if len(attempts) != 2 {
			t.Fatalf("%d attempt spans; want 1 or 2: %v", len(attempts), names(all))
		}
		first, second := attempts[0], attempts[1]
		if first.StartTime.After(second.StartTime) {
			first, second = second, first
		}
		for n, s := range []tracetest.SpanStub{first, second} {
			if s.Parent.SpanID() != server.SpanContext.SpanID() {
				t.Errorf("attempt %d's parent %v; want the server span %v", n+1, s.Parent.SpanID(), server.SpanContext.SpanID())
			}
			if got := attr(s, "warmpath.attempt").AsInt64(); got != int64(n+1) {
				t.Errorf("attempt %d has warmpath.attempt %d", n+1, got)
			}
		}
		if attr(first, "warmpath.replica").AsString() != bad.Info().Name || first.Status.Code != codes.Error {
			t.Errorf("first attempt on %s with status %v; want %s, Error", attr(first, "warmpath.replica").AsString(), first.Status, bad.Info().Name)
		}
		if attr(second, "warmpath.replica").AsString() != good.Info().Name || second.Status.Code == codes.Error {
			t.Errorf("second attempt on %s with status %v; want %s, not Error", attr(second, "warmpath.replica").AsString(), second.Status, good.Info().Name)
		}
		upTID, upParent := parseTraceparent(t, good.LastTraceparent())
		if upTID != tid || upParent != second.SpanContext.SpanID() {
			t.Errorf("good replica got trace %v parent %v; want %v parent %v", upTID, upParent, tid, second.SpanContext.SpanID())
		}
		badTID, badParent := parseTraceparent(t, bad.LastTraceparent())
		if badTID != tid || badParent != first.SpanContext.SpanID() {
			t.Errorf("failing replica got trace %v parent %v; want %v parent %v", badTID, badParent, tid, first.SpanContext.SpanID())
		}
		var logged bool
		for _, l := range logs.lines("retrying on next-best replica") {
			if l["trace_id"] == tid.String() {
				logged = true
				if l["span_id"] != first.SpanContext.SpanID().String() {
					t.Errorf("retry log span_id %v; want the failed attempt's %v", l["span_id"], first.SpanContext.SpanID())
				}
			}
		}
		if !logged {
			t.Errorf("no retry log line with trace_id %v: %v", tid, logs.lines("retrying on next-best replica"))
		}
		return
	}
}

// With tracing off the gateway sends no trace context of its own: a
// request without one reaches the replica without one, and a client's
// passes through untouched, as any other header.
func TestTracingOff(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1})
	cfg := fleetConfig(sim)
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	if gw.obs.trace.on() {
		t.Fatal("tracing is on without an endpoint or exporter")
	}
	body := map[string]any{"model": "qwen3-32b", "max_tokens": 2, "messages": []msg{{"user", "untraced"}}}
	if r := chat(t, gw.URL, body, nil); r.Status != http.StatusOK {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	if got := sim.Replicas()[0].LastTraceparent(); got != "" {
		t.Errorf("replica got traceparent %q; want none", got)
	}
	tp, _, _ := clientTrace(7)
	if r := chat(t, gw.URL, body, map[string]string{"traceparent": tp}); r.Status != http.StatusOK {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	if got := sim.Replicas()[0].LastTraceparent(); got != tp {
		t.Errorf("replica got traceparent %q; want the client's %q passed through", got, tp)
	}
}

// Tracing is on when tracing.endpoint or a standard OTLP endpoint
// variable is set, and OTEL_SDK_DISABLED turns it off.
func TestTracingConfigResolve(t *testing.T) {
	for _, tt := range []struct {
		name     string
		cfg      TracingConfig
		env      map[string]string
		on       bool
		protocol string
		ratio    float64
	}{
		{name: "off by default", on: false, protocol: TracingHTTP, ratio: 1},
		{name: "endpoint", cfg: TracingConfig{Endpoint: "http://collector:4318"}, on: true, protocol: TracingHTTP, ratio: 1},
		{name: "otel endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, on: true, protocol: TracingGRPC, ratio: 1},
		{name: "otel traces endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}, on: true, protocol: TracingHTTP, ratio: 0.25},
		{name: "config wins", cfg: TracingConfig{Endpoint: "c:4317", Protocol: TracingGRPC, SampleRatio: 0.5}, env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}, on: true, protocol: TracingGRPC, ratio: 0.5},
		{name: "sdk disabled", cfg: TracingConfig{Endpoint: "c:4318"}, env: map[string]string{"OTEL_SDK_DISABLED": "true"}, on: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, on := tt.cfg.resolve(func(k string) string { return tt.env[k] })
			if on != tt.on || (on && (got.Protocol != tt.protocol || got.SampleRatio != tt.ratio)) {
				t.Errorf("resolve = %+v, %v; want on %v, protocol %s, ratio %v", got, on, tt.on, tt.protocol, tt.ratio)
			}
		})
	}
	for _, bad := range []TracingConfig{{Protocol: "udp"}, {SampleRatio: 1.5}, {Endpoint: "ftp://x:1"}} {
		if errs := bad.validate(); len(errs) == 0 {
			t.Errorf("%+v validated", bad)
		}
	}
}

// An OTLP exporter whose collector is unreachable neither fails the
// start nor holds the shutdown past its bound.
func TestTracingUnreachableCollector(t *testing.T) {
	for _, proto := range []string{TracingHTTP, TracingGRPC} {
		tr, err := newTracing(TracingConfig{Endpoint: "127.0.0.1:1", Protocol: proto, Insecure: true}, Options{})
		if err != nil || !tr.on() {
			t.Fatalf("%s: newTracing: on %v, %v", proto, tr.on(), err)
		}
		_, span := tr.tracer.Start(context.Background(), "x")
		span.End()
		start := time.Now()
		tr.shutdown(slog.New(slog.DiscardHandler))
		if d := time.Since(start); d > tracingShutdownTimeout+time.Second {
			t.Errorf("%s: shutdown took %v", proto, d)
		}
	}
}

// The Messages API's requests are traced as the chat ones (the server
// span named after its route, an attempt under it); a request every
// replica fails ends its server span with an error status; a URL no
// route matches is named by its method alone.
func TestTracingMessagesAndErrors(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1})
	cfg := fleetConfig(sim)
	rdb := redisFor(t, &cfg)
	exp := tracetest.NewInMemoryExporter()
	gw := startTracedGateway(t, cfg, rdb, exp, &syncBuffer{})
	send := func(n int, method, path, body string) (trace.TraceID, int) {
		tp, tid, _ := clientTrace(n)
		req, _ := http.NewRequest(method, gw.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", tp)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return tid, resp.StatusCode
	}

	tid, status := send(1, http.MethodPost, "/v1/messages", `{"model":"qwen3-32b","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
	if status != http.StatusOK {
		t.Fatalf("messages: status %d", status)
	}
	server, attempts, all := traceSpans(t, exp, tid)
	if server.Name != "POST /v1/messages" || len(attempts) != 1 || attempts[0].Parent.SpanID() != server.SpanContext.SpanID() {
		t.Errorf("messages trace: server %q, %d attempts: %v", server.Name, len(attempts), names(all))
	}

	tid, status = send(4, http.MethodGet, "/healthz", "")
	if status != http.StatusOK {
		t.Fatalf("healthz: status %d", status)
	}
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID() == tid {
			t.Errorf("a health probe was traced: span %q", s.Name)
		}
	}

	tid, status = send(2, http.MethodGet, "/no/such/route", "")
	if status != http.StatusNotFound {
		t.Fatalf("unknown route: status %d", status)
	}
	if server, _, _ := traceSpans(t, exp, tid); server.Name != "GET" || server.Status.Code == codes.Error {
		t.Errorf("unknown route's span %q with status %v; want GET, not an error", server.Name, server.Status)
	}

	sim.Replicas()[0].SetFaults(vllmsim.Faults{ErrorRate: 1})
	tid, status = send(3, http.MethodPost, "/v1/chat/completions", `{"model":"qwen3-32b","max_tokens":4,"messages":[{"role":"user","content":"x"}]}`)
	if status < 500 {
		t.Fatalf("failing replica: status %d", status)
	}
	server, attempts, _ = traceSpans(t, exp, tid)
	if server.Status.Code != codes.Error || attr(server, "http.response.status_code").AsInt64() != int64(status) {
		t.Errorf("server span status %v, code %v; want Error, %d", server.Status, attr(server, "http.response.status_code").AsInt64(), status)
	}
	if len(attempts) != 1 || attempts[0].Status.Code != codes.Error {
		t.Errorf("attempt spans %v; want one, with an error status", attempts)
	}
}

// Routing's I/O is traced: the prepare phase (before the queue) as a
// span, and the tokenizer call a precise policy waits for as a
// warmpath.tokenize span under the phase that waited, saying where the
// ids came from and how many.
func TestTracingTokenize(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := fleetConfig(sim)
	cfg.Routing.Policy = scoring.PolicyPrecisePrefix
	exp := tracetest.NewInMemoryExporter()
	gw := startTracedGateway(t, cfg, nil, exp, &syncBuffer{})
	tp, tid, _ := clientTrace(1)
	r := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 4, "messages": []msg{{"user", words("tok", 300)}}},
		map[string]string{"traceparent": tp})
	if r.Status != http.StatusOK {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	server, _, all := traceSpans(t, exp, tid)
	byID := map[trace.SpanID]tracetest.SpanStub{}
	for _, s := range all {
		byID[s.SpanContext.SpanID()] = s
	}
	var prepare, tok *tracetest.SpanStub
	for i, s := range all {
		switch s.Name {
		case "warmpath.prepare":
			prepare = &all[i]
		case "warmpath.tokenize":
			tok = &all[i]
		}
	}
	if prepare == nil || prepare.Parent.SpanID() != server.SpanContext.SpanID() {
		t.Fatalf("no warmpath.prepare span under the server span in %v", names(all))
	}
	if tok == nil {
		t.Fatalf("no warmpath.tokenize span in %v", names(all))
	}
	if p := byID[tok.Parent.SpanID()].Name; p != "warmpath.prepare" && p != "warmpath.route" {
		t.Errorf("tokenize span under %q; want warmpath.prepare or warmpath.route", p)
	}
	if src := attr(*tok, "warmpath.tokenize.source").AsString(); src != "replica" && src != "local" && src != "cache" {
		t.Errorf("warmpath.tokenize.source = %q; want replica, local or cache", src)
	}
	if n := attr(*tok, "warmpath.prompt_tokens").AsInt64(); n < 300 {
		t.Errorf("warmpath.prompt_tokens = %d; want the prompt's (300 words and more)", n)
	}
}
