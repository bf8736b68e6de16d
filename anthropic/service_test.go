package anthropic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/vllmsim"
)

// simChat is a chatapi.Chat that posts every turn to one simulated replica (so a
// conversation's turns share its prefix cache) and records the turns.
type simChat struct {
	url    string
	client *http.Client

	mu    sync.Mutex // guards turns
	turns []chatapi.Turn
}

func newSimChat(t *testing.T) *simChat {
	t.Helper()
	f, err := vllmsim.NewFleet(vllmsim.Config{Speed: 200})
	if err != nil {
		t.Fatalf("vllmsim: %v", err)
	}
	testrun.Start(t, "vllmsim", f.Run)
	return &simChat{url: f.Replicas()[0].Info().URL, client: &http.Client{Timeout: time.Minute}}
}

func (c *simChat) Complete(ctx context.Context, t chatapi.Turn) (*http.Response, error) {
	c.mu.Lock()
	c.turns = append(c.turns, t)
	c.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/chat/completions", bytes.NewReader(t.Body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return c.client.Do(req)
}

func (c *simChat) last() chatapi.Turn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.turns[len(c.turns)-1]
}

func serveMessages(t *testing.T, chat chatapi.Chat, opts Options) *httptest.Server {
	t.Helper()
	svc, err := New(opts, chat)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, url, body string, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// sseEvents parses a Messages stream into its events, checking that each
// frame's event name repeats its data's type (the SDKs dispatch on it).
func sseEvents(t *testing.T, body []byte) []*event {
	t.Helper()
	var evs []*event
	for _, frame := range strings.Split(strings.TrimSpace(string(body)), "\n\n") {
		name, data, _ := strings.Cut(frame, "\n")
		name = strings.TrimPrefix(name, "event: ")
		data = strings.TrimPrefix(data, "data: ")
		if gjson.Get(data, "type").String() != name {
			t.Fatalf("frame %q: event name and type differ", frame)
		}
		if name == "ping" {
			continue
		}
		ev := &event{Type: name}
		raw := gjson.Parse(data)
		if m := raw.Get("message"); m.Exists() {
			ev.Message = &messageJSON{}
			_ = json.Unmarshal([]byte(m.Raw), ev.Message)
		}
		if i := raw.Get("index"); i.Exists() {
			ev.Index = ptr(int(i.Int()))
		}
		if cb := raw.Get("content_block"); cb.Exists() {
			ev.ContentBlock = &contentBlock{}
			_ = json.Unmarshal([]byte(cb.Raw), ev.ContentBlock)
		}
		if d := raw.Get("delta"); d.Exists() {
			if name == "message_delta" {
				md := &messageDelta{}
				_ = json.Unmarshal([]byte(d.Raw), md)
				ev.Delta = md
			} else {
				dd := &delta{}
				_ = json.Unmarshal([]byte(d.Raw), dd)
				ev.Delta = dd
			}
		}
		if u := raw.Get("usage"); u.Exists() {
			ev.Usage = &usageJSON{}
			_ = json.Unmarshal([]byte(u.Raw), ev.Usage)
		}
		if e := raw.Get("error"); e.Exists() {
			ev.Error = &errorDetail{}
			_ = json.Unmarshal([]byte(e.Raw), ev.Error)
		}
		evs = append(evs, ev)
	}
	return evs
}

const readTool = `{"name":"read_file","description":"Read a file","input_schema":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}`

// A tool-use loop against the simulator, the first turn streamed and the
// second not: the model calls the tool, its result goes back, and the
// second turn is served from the first's cached prefix.
func TestMessagesToolLoop(t *testing.T) {
	chat := newSimChat(t)
	srv := serveMessages(t, chat, Options{})
	system := `[{"type":"text","text":"x-anthropic-billing-header: cc_version=1.0.a1; cch=1;"},{"type":"text","text":"` + strings.Repeat("You help. ", 100) + `"}]`
	first := `{"role":"user","content":"Please use the read_file tool on main.go"}`
	resp, body := post(t, srv.URL+"/v1/messages?beta=true",
		`{"model":"`+vllmsim.DefaultModel+`","max_tokens":64,"stream":true,"system":`+system+`,"tools":[`+readTool+`],"messages":[`+first+`]}`,
		map[string]string{"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219", "X-Claude-Code-Session-Id": "s1"})
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || resp.Header.Get("Request-Id") == "" {
		t.Fatalf("status %d, headers %v: %s", resp.StatusCode, resp.Header, body)
	}
	evs := sseEvents(t, body)
	if err := checkSequence(evs); err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	msg := accumulate(t, evs)
	if *msg.StopReason != "tool_use" || len(msg.Content) != 1 || msg.Content[0].Name != "read_file" || !gjson.GetBytes(msg.Content[0].Input, "path").Exists() {
		t.Fatalf("turn 1 answer %s", body)
	}
	if msg.Usage.InputTokens < 200 || msg.Usage.CacheReadInputTokens != 0 {
		t.Errorf("turn 1 usage %+v", msg.Usage)
	}
	turn := chat.last()
	if turn.Header.Get("Anthropic-Beta") != "" || turn.Header.Get("X-Claude-Code-Session-Id") != "s1" {
		t.Errorf("turn header %v: anthropic-* must go, the session header must stay", turn.Header)
	}
	if bytes.Contains(turn.Body, []byte("billing")) {
		t.Error("billing line sent upstream")
	}

	use, _ := json.Marshal(msg.Content)
	second := `{"role":"assistant","content":` + string(use) + `},{"role":"user","content":[{"type":"tool_result","tool_use_id":"` +
		msg.Content[0].ID + `","content":"package main"}]}`
	system2 := strings.Replace(system, "cch=1", "cch=2", 1) // the billing line changes every request
	resp, body = post(t, srv.URL+"/v1/messages",
		`{"model":"`+vllmsim.DefaultModel+`","max_tokens":64,"system":`+system2+`,"tools":[`+readTool+`],"messages":[`+first+`,`+second+`]}`, nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("turn 2: %d %s", resp.StatusCode, body)
	}
	var m2 messageJSON
	if err := json.Unmarshal(body, &m2); err != nil || m2.Type != "message" || m2.Role != "assistant" || !strings.HasPrefix(m2.ID, "msg_") {
		t.Fatalf("turn 2 message %s: %v", body, err)
	}
	if *m2.StopReason != "end_turn" || len(m2.Content) != 1 || m2.Content[0].Type != "text" || *m2.Content[0].Text == "" {
		t.Errorf("turn 2 answer %s", body)
	}
	prompt1 := msg.Usage.InputTokens + msg.Usage.CacheReadInputTokens
	if m2.Usage.CacheReadInputTokens < prompt1-16 {
		t.Errorf("turn 2 read %d tokens from cache; turn 1's prompt was %d", m2.Usage.CacheReadInputTokens, prompt1)
	}
}

func TestMessagesErrors(t *testing.T) {
	var chat chatapi.ChatFunc = func(ctx context.Context, tn chatapi.Turn) (*http.Response, error) {
		switch gjson.GetBytes(tn.Body, "model").String() {
		case "limited":
			return nil, &apierror.Error{Status: 429, Type: apierror.TypeRateLimit, Code: "rate_limit_exceeded", Msg: "Rate limit reached",
				Header: http.Header{"Retry-After": {"7"}, "X-Ratelimit-Remaining-Requests": {"0"}}}
		case "gone":
			return nil, apierror.NotFound("model_not_found", "The model gone does not exist.")
		case "down":
			return nil, &apierror.Error{Status: 503, Type: apierror.TypeServer, Msg: "upstream connect error"}
		case "slow":
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return nil, errors.New("unexpected")
	}
	auth := func(ctx context.Context, h http.Header) (context.Context, error) {
		if h.Get("X-Api-Key") != "good" && h.Get("Authorization") != "Bearer good" {
			return ctx, &apierror.Error{Status: 401, Msg: "Incorrect API key provided."}
		}
		return ctx, nil
	}
	srv := serveMessages(t, chat, Options{Authenticate: auth, MaxBodyBytes: 4096, TurnTimeout: 50 * time.Millisecond})
	key := map[string]string{"x-api-key": "good"}
	msg := func(model string) string {
		return `{"model":"` + model + `","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`
	}
	tests := []struct {
		name, path, method, body string
		header                   map[string]string
		status                   int
		typ                      string
		headers                  map[string]string
	}{
		{"no key", "/v1/messages", "POST", msg("m"), nil, 401, "authentication_error", nil},
		{"bearer works too", "/v1/messages", "POST", `{}`, map[string]string{"Authorization": "Bearer good"}, 400, "invalid_request_error", nil},
		{"bad body", "/v1/messages", "POST", `{"model":1}`, key, 400, "invalid_request_error", nil},
		{"too large", "/v1/messages", "POST", msg(strings.Repeat("m", 5000)), key, 413, "request_too_large", nil},
		{"wrong method", "/v1/messages", "GET", ``, key, 405, "invalid_request_error", nil},
		{"unknown path", "/v1/messages/batches", "POST", msg("m"), key, 404, "not_found_error", nil},
		{"rate limited", "/v1/messages", "POST", msg("limited"), key, 429, "rate_limit_error", map[string]string{"Retry-After": "7", "X-Ratelimit-Remaining-Requests": "0"}},
		{"unknown model", "/v1/messages", "POST", msg("gone"), key, 404, "not_found_error", nil},
		{"overloaded", "/v1/messages", "POST", msg("down"), key, 503, "overloaded_error", map[string]string{"Retry-After": "1"}},
		{"timeout", "/v1/messages", "POST", msg("slow"), key, 504, "timeout_error", nil},
		{"count_tokens needs messages", "/v1/messages/count_tokens", "POST", `{"model":"m"}`, key, 400, "invalid_request_error", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var env errorBody
			if err := json.Unmarshal(b, &env); err != nil || env.Type != "error" || env.Error.Message == "" {
				t.Fatalf("body %s is not Anthropic's error envelope", b)
			}
			if resp.StatusCode != tt.status || env.Error.Type != tt.typ {
				t.Errorf("%d %s; want %d %s (%s)", resp.StatusCode, env.Error.Type, tt.status, tt.typ, env.Error.Message)
			}
			if env.RequestID == "" || env.RequestID != resp.Header.Get("Request-Id") {
				t.Errorf("request_id %q, header %q", env.RequestID, resp.Header.Get("Request-Id"))
			}
			for k, v := range tt.headers {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("%s = %q; want %q", k, got, v)
				}
			}
		})
	}
}

func TestCountTokens(t *testing.T) {
	chat := newSimChat(t)
	body := `{"model":"` + vllmsim.DefaultModel + `","system":"Be brief.","tools":[` + readTool + `],"messages":[{"role":"user","content":"hello there"}]}`
	// Without a tokenizer, by a one-token completion: the engine's count.
	srv := serveMessages(t, chat, Options{})
	resp, b := post(t, srv.URL+"/v1/messages/count_tokens?beta=true", body, nil)
	n := gjson.GetBytes(b, "input_tokens").Int()
	if resp.StatusCode != 200 || n < 50 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	var msgs []vllmsim.Message
	var tools []vllmsim.Tool
	c := chat.last().Body
	_ = json.Unmarshal([]byte(gjson.GetBytes(c, "messages").Raw), &msgs)
	_ = json.Unmarshal([]byte(gjson.GetBytes(c, "tools").Raw), &tools)
	if want := len(vllmsim.TokenizeChat(msgs, tools, true)); int(n) != want {
		t.Errorf("input_tokens %d; the engine renders %d", n, want)
	}
	// With the gateway's tokenizer, which gets the chat body.
	var got []byte
	srv = serveMessages(t, chat, Options{Models: func() []string { return []string{vllmsim.DefaultModel} },
		CountTokens: func(_ context.Context, chatBody []byte) (int, error) { got = chatBody; return 42, nil }})
	if _, b := post(t, srv.URL+"/v1/messages/count_tokens", body, nil); gjson.GetBytes(b, "input_tokens").Int() != 42 {
		t.Errorf("count_tokens %s; want CountTokens' 42", b)
	}
	if gjson.GetBytes(got, "tools.0.function.name").String() != "read_file" || gjson.GetBytes(got, "messages.#").Int() != 2 {
		t.Errorf("CountTokens got %s", got)
	}
	if resp, b := post(t, srv.URL+"/v1/messages/count_tokens", strings.Replace(body, vllmsim.DefaultModel, "nope", 1), nil); resp.StatusCode != 404 {
		t.Errorf("unknown model: %d %s", resp.StatusCode, b)
	}
}

// syncWriter is a ResponseWriter whose body the test may read while the
// handler writes.
type syncWriter struct {
	h    http.Header
	mu   sync.Mutex // guards body
	body bytes.Buffer
}

func (w *syncWriter) Header() http.Header { return w.h }
func (w *syncWriter) WriteHeader(int)     {}
func (w *syncWriter) Flush()              {}
func (w *syncWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.body.Write(b)
}

func (w *syncWriter) count(name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Count(w.body.String(), "event: "+name+"\n")
}

// A stream that stays silent (a long prefill) gets a ping every
// PingInterval, and none once it is over.
func TestStreamPings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pr, pw := io.Pipe()
		var chat chatapi.ChatFunc = func(context.Context, chatapi.Turn) (*http.Response, error) {
			return upstream("text/event-stream", pr), nil
		}
		svc, err := New(Options{PingInterval: 10 * time.Second}, chat)
		if err != nil {
			t.Fatal(err)
		}
		w := &syncWriter{h: http.Header{}}
		req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(`{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"x"}]}`))
		done := make(chan struct{})
		go func() { svc.Handler().ServeHTTP(w, req); close(done) }()
		synctest.Wait()
		if w.count("message_start") != 1 || w.count("ping") != 1 {
			t.Fatalf("at start: %d message_start, %d pings; want 1 and 1", w.count("message_start"), w.count("ping"))
		}
		time.Sleep(25 * time.Second)
		synctest.Wait()
		if got := w.count("ping"); got != 3 {
			t.Errorf("after 25s of silence: %d pings; want 3", got)
		}
		_, _ = io.WriteString(pw, sse(text("hi")))
		time.Sleep(9 * time.Second)
		synctest.Wait()
		if got := w.count("ping"); got != 3 {
			t.Errorf("a delta did not reset the ping timer: %d pings", got)
		}
		_, _ = io.WriteString(pw, sse(finish("stop", ""), "[DONE]"))
		pw.Close() // as vLLM does after [DONE]
		<-done
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := w.count("ping"); got != 3 || w.count("message_stop") != 1 {
			t.Errorf("after the end: %d pings, %d message_stop; want 3 and 1", got, w.count("message_stop"))
		}
	})
}

// A client that goes away mid-stream cancels the upstream turn.
func TestStreamClientGone(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	upCtx := make(chan context.Context, 1)
	var chat chatapi.ChatFunc = func(ctx context.Context, _ chatapi.Turn) (*http.Response, error) {
		upCtx <- ctx
		return upstream("text/event-stream", pr), nil
	}
	srv := serveMessages(t, chat, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/messages",
		strings.NewReader(`{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"x"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufioLine(resp.Body)
	if line != "event: message_start" {
		t.Fatalf("first line %q", line)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-(<-upCtx).Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream turn was not cancelled when the client went away")
	}
}

func bufioLine(r io.Reader) (string, error) {
	var b []byte
	one := make([]byte, 1)
	for {
		if _, err := r.Read(one); err != nil {
			return string(b), err
		}
		if one[0] == '\n' {
			return string(b), nil
		}
		b = append(b, one[0])
	}
}
