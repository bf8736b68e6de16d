package gateway

import (
	"fmt"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/jaegertest"
	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/vllmsim"
)

// jaegerTrace polls Jaeger's query API until trace tid holds its server
// span (the request's last span to end, so the others are exported
// before or with it) and returns the server span, the attempt spans in
// start order, and the whole trace.
func jaegerTrace(t *testing.T, j *jaegertest.Jaeger, tid string) (server jaegertest.Span, attempts []jaegertest.Span, tr jaegertest.Trace) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var found bool
		var err error
		tr, found, err = j.Trace(t.Context(), tid)
		if err != nil {
			t.Fatalf("jaeger: %v", err)
		}
		server, attempts = jaegertest.Span{}, nil
		for _, s := range tr.Spans {
			switch s.Tag("span.kind") {
			case "server":
				server = s
			case "client":
				attempts = append(attempts, s)
			}
		}
		if found && server.SpanID != "" {
			sort.Slice(attempts, func(a, b int) bool { return attempts[a].StartTime < attempts[b].StartTime })
			return server, attempts, tr
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace %s: no server span in Jaeger within 20s (spans so far: %v)", tid, jaegerNames(tr))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func jaegerNames(tr jaegertest.Trace) []string {
	var out []string
	for _, s := range tr.Spans {
		out = append(out, s.OperationName)
	}
	return out
}

// jaegerChild returns the trace's span named name, checking that it is a
// child of parent.
func jaegerChild(t *testing.T, tr jaegertest.Trace, name string, parent jaegertest.Span) jaegertest.Span {
	t.Helper()
	for _, s := range tr.Spans {
		if s.OperationName == name {
			if s.Parent() != parent.SpanID {
				t.Errorf("%s span's parent %s; want the server span %s", name, s.Parent(), parent.SpanID)
			}
			return s
		}
	}
	t.Errorf("trace %s has no %s span: %v", tr.TraceID, name, jaegerNames(tr))
	return jaegertest.Span{}
}

// wantTags checks a span's tags (Jaeger's JSON carries integers as numbers).
func wantTags(t *testing.T, s jaegertest.Span, want map[string]any) {
	t.Helper()
	for k, w := range want {
		if i, ok := w.(int); ok {
			w = float64(i)
		}
		if got := s.Tag(k); got != w {
			t.Errorf("span %q %s = %v (%T); want %v", s.OperationName, k, got, got, w)
		}
	}
}

// The gateway's traces, exported over OTLP/HTTP to a real Jaeger and read
// back from its query API: a multi-turn conversation, a retry, a queued
// request. The in-memory tests (tracing_test.go) check the spans the SDK
// records; this one checks what reaches a backend: the span tree, the
// attributes as tags, error status, the service name, and that the
// traceparent the replica received names the attempt span Jaeger holds.
func TestTracingJaeger(t *testing.T) {
	j := jaegertest.Start(t)
	// The batch processor's default 5s delay would only slow the polling.
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	t.Setenv("OTEL_SERVICE_NAME", "warmpath-jaeger-test")
	traced := func(cfg Config) Config {
		cfg.Tracing.Endpoint = j.Endpoint
		return cfg
	}

	t.Run("conversation", func(t *testing.T) {
		sim := startSim(t, vllmsim.Config{Replicas: 2})
		cfg := traced(fleetConfig(sim))
		cfg.Debug = true // X-Warmpath-Replica on the responses
		rdb := redisFor(t, &cfg)
		gw := startGateway(t, cfg, rdb)
		c := newConversation("you are a careful assistant", "first question")
		for turn := range 3 {
			tp, tid, sid := clientTrace(100 + turn)
			c.header = map[string]string{"X-Session-ID": "jaeger-conv", "traceparent": tp}
			r := c.turn(t, gw.URL, fmt.Sprintf("question %d", turn+2))
			replica := r.replica()
			server, attempts, tr := jaegerTrace(t, j, tid.String())
			if server.OperationName != "POST /v1/chat/completions" || server.Parent() != sid.String() {
				t.Errorf("turn %d: server span %q under %q; want POST /v1/chat/completions under the client's %s", turn, server.OperationName, server.Parent(), sid)
			}
			wantTags(t, server, map[string]any{"http.route": "/v1/chat/completions", "http.request.method": "POST", "http.response.status_code": 200})
			if p := tr.Processes[server.ProcessID]; p.ServiceName != "warmpath-jaeger-test" {
				t.Errorf("turn %d: service %q; want OTEL_SERVICE_NAME's warmpath-jaeger-test", turn, p.ServiceName)
			}
			if len(attempts) != 1 {
				t.Fatalf("turn %d: %d attempt spans; want 1: %v", turn, len(attempts), jaegerNames(tr))
			}
			a := attempts[0]
			if a.OperationName != "chat qwen3-32b" || a.Parent() != server.SpanID {
				t.Errorf("turn %d: attempt %q under %s; want chat qwen3-32b under the server span %s", turn, a.OperationName, a.Parent(), server.SpanID)
			}
			wantTags(t, a, map[string]any{"warmpath.replica": replica, "warmpath.attempt": 1, "gen_ai.operation.name": "chat",
				"gen_ai.request.model": "qwen3-32b", "gen_ai.usage.input_tokens": r.Usage.PromptTokens,
				"gen_ai.usage.output_tokens": r.Usage.CompletionTokens, "warmpath.cached_tokens": r.Usage.CachedTokens,
				"http.response.status_code": 200})
			if a.Tag("error") != nil {
				t.Errorf("turn %d: attempt span has error tag %v", turn, a.Tag("error"))
			}
			route := jaegerChild(t, tr, "warmpath.route", server)
			wantTags(t, route, map[string]any{"warmpath.replica": replica})
			if route.Tag("warmpath.routing.reason") == nil {
				t.Errorf("turn %d: route span has no warmpath.routing.reason: %v", turn, route.Tags)
			}
			wantTags(t, jaegerChild(t, tr, "warmpath.queue", server), map[string]any{"gen_ai.request.model": "qwen3-32b"})
			if route.Tag("warmpath.key_id") == nil {
				t.Errorf("turn %d: route span has no warmpath.key_id: %v", turn, route.Tags)
			}
			wantTags(t, jaegerChild(t, tr, "warmpath.auth", server), map[string]any{"warmpath.tenant": route.Tag("warmpath.tenant"),
				"warmpath.key_id": route.Tag("warmpath.key_id")})
			var got string
			for _, rep := range sim.Replicas() {
				if rep.Info().Name == replica {
					got = rep.LastTraceparent()
				}
			}
			upTID, upParent := parseTraceparent(t, got)
			if upTID != tid || upParent.String() != a.SpanID {
				t.Errorf("turn %d: replica %s got trace %s parent %s; want %s parent %s (the attempt span in Jaeger)", turn, replica, upTID, upParent, tid, a.SpanID)
			}
			// Later turns extend the session's prefix on the replica
			// that holds it: the span shows the cache hit.
			if c, _ := a.Tag("warmpath.cached_tokens").(float64); turn > 0 && c == 0 {
				t.Errorf("turn %d: attempt span warmpath.cached_tokens = 0; want the session's cached prefix", turn)
			}
		}

		// Without a client traceparent the server span is the root of a
		// new trace, the one the replica's traceparent names.
		r := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 4, "messages": []msg{{"user", "a root trace"}}}, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("status %d: %s", r.Status, r.Body)
		}
		var tp string
		for _, rep := range sim.Replicas() {
			if rep.Info().Name == r.replica() {
				tp = rep.LastTraceparent()
			}
		}
		tid, parent := parseTraceparent(t, tp)
		server, attempts, _ := jaegerTrace(t, j, tid.String())
		if server.Parent() != "" || len(attempts) != 1 || attempts[0].SpanID != parent.String() {
			t.Errorf("root trace: server parent %q, %d attempts; want a root server span and one attempt %s", server.Parent(), len(attempts), parent)
		}
	})

	t.Run("retry", func(t *testing.T) {
		sim := startSim(t, vllmsim.Config{Replicas: 2})
		cfg := traced(fleetConfig(sim))
		cfg.Health.Failures = 100 // keep the failing replica "healthy" to exercise retries
		rdb := redisFor(t, &cfg)
		gw := startGateway(t, cfg, rdb)
		bad, good := sim.Replicas()[0], sim.Replicas()[1]
		bad.SetFaults(vllmsim.Faults{ErrorRate: 1})
		for i := 0; ; i++ {
			if i == 40 {
				t.Fatal("no retry after 40 requests with one failing replica")
			}
			tp, tid, _ := clientTrace(200 + i)
			r := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 4, "messages": []msg{{"user", words("jq", 5+i)}}},
				map[string]string{"traceparent": tp})
			if r.Status != http.StatusOK {
				t.Fatalf("request %d: status %d: %s", i, r.Status, r.Body)
			}
			server, attempts, tr := jaegerTrace(t, j, tid.String())
			if len(attempts) == 1 {
				continue
			}
			if len(attempts) != 2 {
				t.Fatalf("%d attempt spans; want 1 or 2: %v", len(attempts), jaegerNames(tr))
			}
			first, second := attempts[0], attempts[1]
			for n, s := range attempts {
				if s.Parent() != server.SpanID {
					t.Errorf("attempt %d's parent %s; want the server span %s", n+1, s.Parent(), server.SpanID)
				}
			}
			wantTags(t, first, map[string]any{"warmpath.attempt": 1, "warmpath.replica": bad.Info().Name, "otel.status_code": "ERROR", "error": true})
			wantTags(t, second, map[string]any{"warmpath.attempt": 2, "warmpath.replica": good.Info().Name, "http.response.status_code": 200})
			if second.Tag("error") != nil || server.Tag("error") != nil {
				t.Errorf("error tags on the answered attempt (%v) or the server span (%v)", second.Tag("error"), server.Tag("error"))
			}
			wantTags(t, server, map[string]any{"http.response.status_code": 200})
			upTID, upParent := parseTraceparent(t, good.LastTraceparent())
			if upTID != tid || upParent.String() != second.SpanID {
				t.Errorf("good replica got trace %s parent %s; want %s parent %s", upTID, upParent, tid, second.SpanID)
			}
			badTID, badParent := parseTraceparent(t, bad.LastTraceparent())
			if badTID != tid || badParent.String() != first.SpanID {
				t.Errorf("failing replica got trace %s parent %s; want %s parent %s", badTID, badParent, tid, first.SpanID)
			}
			return
		}
	})

	t.Run("queued", func(t *testing.T) {
		clock := newGatedClock()
		sim := queueSim(t, clock, "")
		gw := startGateway(t, traced(queueConfig(sim)), nil)
		blocker := saturate(t, gw, clock)
		defer clock.resume()
		tp, tid, _ := clientTrace(300)
		res := asyncChat(t.Context(), gw.URL, chatBody("waiter", 0, 4), map[string]string{"traceparent": tp})
		testrun.Eventually(t, 10*time.Second, func() bool { return queued(t, gw, nil) == 1 }, "request queued")
		const wait = 300 * time.Millisecond
		time.Sleep(wait)
		clock.resume()
		for _, ch := range []<-chan chatResult{blocker, res} {
			if r := <-ch; r.Status != http.StatusOK {
				t.Fatalf("status %d: %s", r.Status, r.Body)
			}
		}
		server, attempts, tr := jaegerTrace(t, j, tid.String())
		q := jaegerChild(t, tr, "warmpath.queue", server)
		if d := time.Duration(q.Duration) * time.Microsecond; d < wait {
			t.Errorf("queue span lasted %v; the request waited at least %v", d, wait)
		}
		if len(attempts) != 1 || attempts[0].StartTime < q.StartTime+q.Duration {
			t.Errorf("attempts %v; want one, started after the queue span ended", attempts)
		}
	})
}
