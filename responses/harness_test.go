package responses

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
	"github.com/warmpath/warmpath/internal/redistest"
	"github.com/warmpath/warmpath/vllmsim"
)

// startSim runs an in-process simulated vLLM fleet for the test.
func startSim(t testing.TB, cfg vllmsim.Config) *vllmsim.Fleet {
	t.Helper()
	if cfg.Speed == 0 {
		cfg.Speed = 200
	}
	f, err := vllmsim.NewFleet(cfg)
	if err != nil {
		t.Fatalf("vllmsim: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("vllmsim run: %v", err)
		}
	})
	return f
}

// simChat is a chatapi.Chat that posts each turn to a simulated replica: the one
// its session was first sent to (round-robin for new sessions), so
// chained turns land where their prefix is cached. It records every turn.
type simChat struct {
	urls   []string
	client *http.Client

	mu     sync.Mutex // guards turns, bound, next
	turns  []chatapi.Turn
	bound  map[string]int
	next   int
	before func(t chatapi.Turn) // optional hook, called before sending
}

func newSimChat(f *vllmsim.Fleet) *simChat {
	c := &simChat{client: &http.Client{Timeout: time.Minute}, bound: map[string]int{}}
	for _, r := range f.Replicas() {
		c.urls = append(c.urls, r.Info().URL)
	}
	return c
}

func (c *simChat) Complete(ctx context.Context, t chatapi.Turn) (*http.Response, error) {
	c.mu.Lock()
	c.turns = append(c.turns, t)
	i, ok := c.bound[t.Session]
	if !ok || t.Session == "" {
		i = c.next % len(c.urls)
		c.next++
		if t.Session != "" {
			c.bound[t.Session] = i
		}
	}
	hook := c.before
	c.mu.Unlock()
	if hook != nil {
		hook(t)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.urls[i]+"/v1/chat/completions", bytes.NewReader(t.Body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 400 { // the chatapi.Chat contract: refusals are errors
		return nil, apierror.FromResponse(resp)
	}
	return resp, nil
}

func (c *simChat) recorded() []chatapi.Turn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]chatapi.Turn(nil), c.turns...)
}

// tenantKey carries the test tenant, taken from the X-Tenant header.
type tenantKey struct{}

func withTenant(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := context.WithValue(r.Context(), tenantKey{}, r.Header.Get("X-Tenant"))
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

func testTenant(ctx context.Context) string {
	s, _ := ctx.Value(tenantKey{}).(string)
	return s
}

func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

// single is the shared single server, for tests whose subject is not
// Redis (client compatibility).
func single(t testing.TB) *redistest.Topology { return redistest.Shared(t, redistest.Single) }

// env is a running Service over a simulated fleet, served over HTTP.
type env struct {
	svc    *Service
	chat   *simChat
	fleet  *vllmsim.Fleet
	rdb    redis.UniversalClient
	prefix string
	srv    *httptest.Server
	url    string
	// wrap, when set before start, wraps the handler the server serves.
	wrap func(http.Handler) http.Handler
}

type envOpt func(*Options)

// newEnv starts a fleet, a Service (with Run) on the topology tp and an
// HTTP server for it.
func newEnv(t testing.TB, tp *redistest.Topology, cfg vllmsim.Config, opts ...envOpt) *env {
	t.Helper()
	return newEnvWith(t, tp, cfg, func(c *simChat) chatapi.Chat { return c }, opts...)
}

// newEnvWith is newEnv with the Service's chatapi.Chat wrapped around the
// simulator's.
func newEnvWith(t testing.TB, tp *redistest.Topology, cfg vllmsim.Config, wrap func(*simChat) chatapi.Chat, opts ...envOpt) *env {
	t.Helper()
	e := newEnvStopped(t, tp, cfg)
	e.start(t, wrap(e.chat), opts...)
	return e
}

// newEnvStopped is a fleet and a Redis prefix, without a Service yet.
func newEnvStopped(t testing.TB, tp *redistest.Topology, cfg vllmsim.Config) *env {
	t.Helper()
	rdb, prefix := tp.Client(t)
	f := startSim(t, cfg)
	return &env{chat: newSimChat(f), fleet: f, rdb: rdb, prefix: prefix}
}

func (e *env) start(t testing.TB, chat chatapi.Chat, opts ...envOpt) {
	t.Helper()
	o := Options{Redis: e.rdb, KeyPrefix: e.prefix, Tenant: testTenant, Logger: testLogger(t), LeaseTTL: 900 * time.Millisecond}
	for _, fn := range opts {
		fn(&o)
	}
	svc, err := New(o, chat)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.svc = svc
	runService(t, svc)
	h := withTenant(svc.Handler())
	if e.wrap != nil {
		h = e.wrap(h)
	}
	e.srv = httptest.NewServer(h)
	t.Cleanup(e.srv.Close)
	e.url = e.srv.URL
}

func runService(t testing.TB, svc *Service) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Service.Run: %v", err)
		}
	})
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// do sends a request and returns the status and body.
func (e *env) do(t testing.TB, method, path, tenant string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// create posts a non-streaming response and decodes it, failing on a
// status other than 200.
func (e *env) create(t testing.TB, tenant string, body map[string]any) *Response {
	t.Helper()
	if _, ok := body["model"]; !ok {
		body["model"] = vllmsim.DefaultModel
	}
	code, b := e.do(t, "POST", "/v1/responses", tenant, body)
	if code != 200 {
		t.Fatalf("POST /v1/responses: %d %s", code, b)
	}
	var r Response
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("decode response: %v\n%s", err, b)
	}
	return &r
}

// sseEvent is one event read off a Responses stream.
type sseEvent struct {
	Name string // the event: line
	Data []byte
	Type string
	Seq  int
}

// readSSE reads a whole Responses stream.
func readSSE(t testing.TB, r io.Reader) []sseEvent {
	t.Helper()
	var out []sseEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 16<<20)
	var cur sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.Name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.Data = []byte(strings.TrimPrefix(line, "data: "))
		case line == "":
			if cur.Data == nil {
				continue
			}
			var head struct {
				Type string `json:"type"`
				Seq  int    `json:"sequence_number"`
			}
			if err := json.Unmarshal(cur.Data, &head); err != nil {
				t.Fatalf("event data is not JSON: %v: %s", err, cur.Data)
			}
			cur.Type, cur.Seq = head.Type, head.Seq
			out = append(out, cur)
			cur = sseEvent{}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read stream: %v", err)
	}
	return out
}

// stream posts a streaming response and returns its events.
func (e *env) stream(t testing.TB, tenant string, body map[string]any) []sseEvent {
	t.Helper()
	if _, ok := body["model"]; !ok {
		body["model"] = vllmsim.DefaultModel
	}
	body["stream"] = true
	j, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", e.url+"/v1/responses", bytes.NewReader(j))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant", tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type = %q; want text/event-stream", ct)
	}
	return readSSE(t, resp.Body)
}

func types(evs []sseEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// weatherTool is a function tool the simulator calls when a user message
// names it.
var weatherTool = map[string]any{
	"type": "function", "name": "get_weather", "description": "Current weather for a city.",
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}},
		"required": []string{"city"}},
	"strict": false,
}

// envelope decodes an error body, failing unless it is OpenAI's envelope
// with all four keys.
func envelope(t testing.TB, b []byte) (msg, typ string, param, code *string) {
	t.Helper()
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, b)
	}
	e, ok := raw["error"]
	if !ok {
		t.Fatalf("error body has no error key: %s", b)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := e[k]; !ok {
			t.Fatalf("error envelope lacks %q: %s", k, b)
		}
	}
	_ = json.Unmarshal(e["message"], &msg)
	_ = json.Unmarshal(e["type"], &typ)
	_ = json.Unmarshal(e["param"], &param)
	_ = json.Unmarshal(e["code"], &code)
	return msg, typ, param, code
}
