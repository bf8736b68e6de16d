package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/internal/redistest"
	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/tenancy"
	"github.com/warmpath/warmpath/tenancy/fairq"
	"github.com/warmpath/warmpath/vllmsim"
)

// startSim runs a simulated fleet for the test's lifetime.
func startSim(t testing.TB, cfg vllmsim.Config) *vllmsim.Fleet {
	t.Helper()
	if cfg.Speed == 0 {
		cfg.Speed = 50
	}
	f, err := vllmsim.NewFleet(cfg)
	if err != nil {
		t.Fatalf("vllmsim: %v", err)
	}
	testrun.Start(t, "vllmsim", f.Run)
	return f
}

// fleetConfig points a gateway configuration at a simulated fleet, with
// fast health checks so tests need not wait.
func fleetConfig(f *vllmsim.Fleet) Config {
	var c Config
	c.Listen = "127.0.0.1:0"
	for _, r := range f.Replicas() {
		in := r.Info()
		c.Replicas = append(c.Replicas, fleet.ReplicaSpec{Name: in.Name, URL: in.URL, Model: in.Model, KVEndpoint: in.KVEndpoint, ReplayEndpoint: in.ReplayEndpoint})
	}
	// Tests run open unless they set up tenants (mode none warns at
	// start); a test that sets DevKey clears the mode for keys.
	c.Auth.Mode = tenancy.ModeNone
	c.Server.PreStop = -1 // no balancer in front of a test gateway
	c.Health = fleet.HealthConfig{Interval: 50 * time.Millisecond, Timeout: 500 * time.Millisecond, Failures: 2, ScrapeInterval: 50 * time.Millisecond, StaleAfter: 2 * time.Second}
	return c
}

// testGateway is a running gateway and its base URL.
type testGateway struct {
	*Gateway
	URL string
}

func startGateway(t testing.TB, cfg Config, rdb redis.UniversalClient) *testGateway {
	t.Helper()
	g, err := New(cfg, Options{Redis: rdb, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("gateway.New: %v", err)
	}
	testrun.Start(t, "gateway", g.Run)
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := g.WaitReady(wctx); err != nil {
		t.Fatalf("gateway not ready: %v", err)
	}
	tg := &testGateway{Gateway: g, URL: "http://" + g.Addr()}
	tg.waitHealthy(t) // so tests see the whole fleet
	return tg
}

// startLoggedGateway starts a gateway on cfg (no Redis) whose log lines
// the returned capture keeps, once every replica is healthy.
func startLoggedGateway(t *testing.T, cfg Config) (*testGateway, *logCapture) {
	t.Helper()
	logs := &logCapture{}
	gw, err := New(cfg, Options{Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "gateway", gw.Run)
	g := &testGateway{Gateway: gw, URL: "http://" + gw.Addr()}
	g.waitHealthy(t)
	return g, logs
}

// waitHealthy waits until every replica in the fleet is healthy.
func (g *testGateway) waitHealthy(t testing.TB) {
	t.Helper()
	testrun.Eventually(t, 10*time.Second, func() bool {
		for _, r := range g.fleet.Snapshot().Replicas {
			if !r.State().Healthy {
				return false
			}
		}
		return true
	}, "every replica healthy")
}

// redisFor returns a client of the shared test Redis with a per-test key
// prefix applied through the gateway's configuration.
func redisFor(t testing.TB, cfg *Config) redis.UniversalClient {
	rdb, prefix := redistest.Client(t)
	cfg.Redis.KeyPrefix = prefix
	// Tests assert the binding protocol, not this machine's load: a
	// loaded CI box under -race must not turn them into timeouts.
	cfg.Redis.Timeout = 5 * time.Second
	return rdb
}

// words returns n distinct-looking words from a seed, one simulator token
// each.
func words(seed string, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s%d", seed, i)
	}
	return b.String()
}

type msg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatResult is what a test learns from one chat completion.
type chatResult struct {
	Status  int
	Header  http.Header
	Body    []byte
	Content string
	Usage   request.Usage
}

func (r chatResult) replica() string { return r.Header.Get("X-Warmpath-Replica") }

func chat(t *testing.T, url string, body map[string]any, header map[string]string) chatResult {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	res := chatResult{Status: resp.StatusCode, Header: resp.Header, Body: raw}
	var parsed struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			CompletionTokens    int `json:"completion_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(raw, &parsed) == nil {
		if len(parsed.Choices) > 0 {
			res.Content = parsed.Choices[0].Message.Content
		}
		res.Usage = request.Usage{PromptTokens: parsed.Usage.PromptTokens, CompletionTokens: parsed.Usage.CompletionTokens, CachedTokens: parsed.Usage.PromptTokensDetails.CachedTokens}
	}
	return res
}

// conversation is one multi-turn chat session driven through the gateway.
type conversation struct {
	model    string
	messages []msg
	header   map[string]string
	extra    map[string]any // more body fields
}

func newConversation(system, first string) *conversation {
	return &conversation{model: "qwen3-32b", messages: []msg{{"system", system}, {"user", first}}}
}

// turn sends the conversation so far, appends the reply and the next user
// message, and returns the result.
func (c *conversation) turn(t *testing.T, url string, next string) chatResult {
	t.Helper()
	body := map[string]any{"model": c.model, "messages": c.messages, "max_tokens": 24}
	for k, v := range c.extra {
		body[k] = v
	}
	r := chat(t, url, body, c.header)
	if r.Status != http.StatusOK {
		t.Fatalf("turn %d: status %d: %s", len(c.messages)/2, r.Status, r.Body)
	}
	c.messages = append(c.messages, msg{"assistant", r.Content}, msg{"user", next})
	return r
}

// counter reads a counter or gauge from the gateway's registry, summed over
// series whose labels include the given ones.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	var sum float64
	eachSeries(t, reg, name, labels, func(m *dto.Metric) { sum += value(m) })
	return sum
}

// histSamples sums the sample counts of a histogram's series whose labels
// include the given ones.
func histSamples(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) uint64 {
	t.Helper()
	var n uint64
	eachSeries(t, reg, name, labels, func(m *dto.Metric) { n += m.GetHistogram().GetSampleCount() })
	return n
}

// eachSeries calls fn for each series of the named metric whose labels
// include the given ones.
func eachSeries(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string, fn func(*dto.Metric)) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			fn(m)
		}
	}
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return 0
}

// parallel runs fn n times concurrently and waits.
func parallel(n int, fn func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { fn(i) })
	}
	wg.Wait()
}

func stringsReader(s string) io.Reader { return strings.NewReader(s) }

// testLogger sends the gateway's warnings to the test log, and everything
// at debug when WARMPATH_TEST_LOG=debug.
func testLogger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("WARMPATH_TEST_LOG") == "debug" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// testTurn is a parsed one-message chat request for model, of class c, as
// the gateway holds it.
func testTurn(t testing.TB, model string, c fairq.Class) *turn {
	t.Helper()
	h := http.Header{fairq.HeaderPriority: {c.String()}}
	r, err := request.Parse(request.Chat, h, []byte(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	return &turn{R: r}
}
