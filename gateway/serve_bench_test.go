package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/vllmsim"
)

// discardSpans is a span exporter that drops every span.
type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }

// BenchmarkServeShort sends short fresh chat completions one at a time
// through a gateway (the warmpath policy, Redis, the in-process
// tokenizer) in front of four simulated replicas answering at once, and
// straight to a replica. Its allocations per request, less direct's, are
// the gateway's own; unlike wall time they hardly move with the machine's
// load, so they track the request path's cost between commits
// (benchstat). Each request is a new prompt (the non-sticky path: a
// tokenization, a prefix match, a new binding). warmpath-traced is the
// same gateway with tracing on at ratio 1.0: its allocations less
// warmpath's are tracing's cost on the request path; warmpath-recorded the
// same gateway recording every request (record.dir): recording's cost.
func BenchmarkServeShort(b *testing.B) {
	sim := startSim(b, vllmsim.Config{Replicas: 4, Speed: 20000})
	cfg := fleetConfig(sim)
	cfg.Routing.Tokenizer = TokenizerSimulator
	rdb := redisFor(b, &cfg)
	gw := startGateway(b, cfg, rdb)
	// The same gateway with tracing on at ratio 1.0: every span recorded
	// and handed to an exporter that drops it (the OTLP encoding and
	// sending of a real exporter, off the request path in its batch
	// processor, are not counted).
	tcfg := fleetConfig(sim)
	tcfg.Routing.Tokenizer = TokenizerSimulator
	trdb := redisFor(b, &tcfg)
	traced, err := New(tcfg, Options{Redis: trdb, Logger: testLogger(b), SpanExporter: discardSpans{}})
	if err != nil {
		b.Fatal(err)
	}
	testrun.Start(b, "traced gateway", traced.Run)
	tg := &testGateway{Gateway: traced, URL: "http://" + traced.Addr()}
	tg.waitHealthy(b)
	rcfg := fleetConfig(sim)
	rcfg.Routing.Tokenizer = TokenizerSimulator
	rcfg.Record.Dir = b.TempDir()
	recorded := startGateway(b, rcfg, redisFor(b, &rcfg))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	for _, target := range []struct{ name, url string }{{"direct", sim.Replicas()[0].Info().URL}, {"warmpath", gw.URL}, {"warmpath-traced", tg.URL}, {"warmpath-recorded", recorded.URL}} {
		b.Run(target.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				body := fmt.Sprintf(`{"model":%q,"max_tokens":8,"messages":[{"role":"user","content":"request %d of the benchmark: %s"}]}`,
					vllmsim.DefaultModel, i, words(fmt.Sprint(i), 40))
				postChat(b, client, target.url, body)
			}
		})
	}
}

// BenchmarkServeLong sends one conversation's turns one at a time, each a
// 100 KB prompt (a long system prompt, a first exchange, then a new
// question), through a gateway (the warmpath policy, Redis, the
// in-process tokenizer) in front of four simulated replicas, and straight
// to a replica. Every turn continues the session, so the gateway's work
// per request includes the sticky path and the miss attribution's
// fingerprint and diff of the whole prompt (misses.BenchmarkTurn: about
// 0.9 ms per 100 KB), the cost that package misses' worker takes off the
// response path.
func BenchmarkServeLong(b *testing.B) {
	sim := startSim(b, vllmsim.Config{Replicas: 4, Speed: 20000})
	cfg := fleetConfig(sim)
	cfg.Routing.Tokenizer = TokenizerSimulator
	gw := startGateway(b, cfg, redisFor(b, &cfg))
	system := words("handbook", 8000) // about 100 KB
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	for _, target := range []struct{ name, url string }{{"direct", sim.Replicas()[0].Info().URL}, {"warmpath", gw.URL}} {
		b.Run(target.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				body := fmt.Sprintf(`{"model":%q,"max_tokens":8,"messages":[{"role":"system","content":%q},{"role":"user","content":"hello"},{"role":"assistant","content":"hi"},{"role":"user","content":"question %d: %s"}]}`,
					vllmsim.DefaultModel, system, i, words(fmt.Sprint(i), 20))
				postChat(b, client, target.url, body)
			}
		})
	}
}

// postChat sends one chat completion to url and reads the answer through,
// failing b on a transport error or a status other than 200.
func postChat(b *testing.B, client *http.Client, url, body string) {
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("status %d", resp.StatusCode)
	}
}
