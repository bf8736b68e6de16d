package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/vllmsim"
)

// The official Go client works against the gateway, streaming and not.
func TestOpenAIGoClient(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := fleetConfig(sim)
	cfg.DevKey, cfg.Auth.Mode = "sk-test-key", ""
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	client := openai.NewClient(option.WithBaseURL(gw.URL+"/v1"), option.WithAPIKey("sk-test-key"), option.WithMaxRetries(0))
	ctx := t.Context()

	params := openai.ChatCompletionNewParams{
		Model:     "qwen3-32b",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(words("rules", 200)), openai.UserMessage("Say hello.")},
		MaxTokens: openai.Int(20),
	}
	resp, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("non-streaming: %v", err)
	}
	if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
		t.Fatalf("non-streaming: empty answer: %+v", resp)
	}
	if resp.Usage.PromptTokens < 200 || resp.Usage.CompletionTokens == 0 {
		t.Errorf("usage = %+v", resp.Usage)
	}

	// Streaming with usage: the usage chunk arrives, with cached tokens
	// (the second request shares the first's prefix on the same replica).
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("streaming: %v", err)
	}
	if chunks < 3 || acc.Choices[0].Message.Content == "" {
		t.Fatalf("streaming: %d chunks, content %q", chunks, acc.Choices[0].Message.Content)
	}
	if acc.Usage.PromptTokens == 0 || acc.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Errorf("streaming usage = %+v; want prompt and cached tokens", acc.Usage)
	}

	// A wrong key is refused in OpenAI's shape.
	bad := openai.NewClient(option.WithBaseURL(gw.URL+"/v1"), option.WithAPIKey("sk-wrong"), option.WithMaxRetries(0))
	_, err = bad.Chat.Completions.New(ctx, params)
	var apiErr *openai.Error
	if !errorsAs(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized || apiErr.Code != "invalid_api_key" {
		t.Errorf("wrong key: err = %v; want 401 invalid_api_key", err)
	}

	// Models lists the fleet's.
	models, err := client.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != "qwen3-32b" {
		t.Errorf("models = %+v, %v", models, err)
	}
	if m, err := client.Models.Get(ctx, "qwen3-32b"); err != nil || m.ID != "qwen3-32b" {
		t.Errorf("model get = %+v, %v", m, err)
	}
}

func errorsAs(err error, target **openai.Error) bool {
	e, ok := err.(*openai.Error)
	if ok {
		*target = e
	}
	return ok
}

// sseEvents reads a chat stream and returns its data payloads.
func sseEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// The gateway always asks replicas for usage, and removes the usage chunk
// again when the client did not ask for it — while still accounting it.
func TestStreamUsageChunk(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1})
	cfg := fleetConfig(sim)
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	for _, want := range []bool{false, true} {
		body := map[string]any{"model": "qwen3-32b", "stream": true, "max_tokens": 8, "messages": []msg{{"user", "count to three"}}}
		if want {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		b, _ := json.Marshal(body)
		resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			t.Fatalf("content type %q", ct)
		}
		events := sseEvents(t, resp.Body)
		resp.Body.Close()
		if len(events) == 0 || events[len(events)-1] != "[DONE]" {
			t.Fatalf("stream does not end with [DONE]: %v", events)
		}
		usageChunks := 0
		for _, e := range events[:len(events)-1] {
			var c struct {
				Choices []any           `json:"choices"`
				Usage   json.RawMessage `json:"usage"`
			}
			if err := json.Unmarshal([]byte(e), &c); err != nil {
				t.Fatalf("bad chunk %q: %v", e, err)
			}
			if len(c.Choices) == 0 && len(c.Usage) > 0 && string(c.Usage) != "null" {
				usageChunks++
			}
		}
		if got := usageChunks == 1; got != want {
			t.Errorf("include_usage=%v: %d usage chunks", want, usageChunks)
		}
	}
	if got := counter(t, gw.obs.reg, "warmpath_prompt_tokens_total", nil); got == 0 {
		t.Error("streams without include_usage were not accounted")
	}
}

// Bad input gets OpenAI's error envelope with the right status, from the
// gateway itself, before anything reaches a replica.
func TestBadInput(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1})
	cfg := fleetConfig(sim)
	cfg.DevKey, cfg.Auth.Mode = "sk-k-test", ""
	cfg.MaxBodyBytes = 4096
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	auth := map[string]string{"Authorization": "Bearer sk-k-test"}
	tests := []struct {
		name   string
		method string
		path   string
		body   string
		header map[string]string
		status int
		code   string
		param  string
	}{
		{"no key", "POST", "/v1/chat/completions", `{}`, nil, 401, "invalid_api_key", ""},
		{"wrong key", "POST", "/v1/chat/completions", `{}`, map[string]string{"Authorization": "Bearer nope"}, 401, "invalid_api_key", ""},
		{"empty body", "POST", "/v1/chat/completions", ``, auth, 400, "", ""},
		{"not json", "POST", "/v1/chat/completions", `{"model":`, auth, 400, "", ""},
		{"not an object", "POST", "/v1/chat/completions", `[1,2]`, auth, 400, "", ""},
		{"no model", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`, auth, 400, "", "model"},
		{"model not a string", "POST", "/v1/chat/completions", `{"model":7,"messages":[{"role":"user","content":"x"}]}`, auth, 400, "", "model"},
		{"no messages", "POST", "/v1/chat/completions", `{"model":"qwen3-32b"}`, auth, 400, "", "messages"},
		{"empty messages", "POST", "/v1/chat/completions", `{"model":"qwen3-32b","messages":[]}`, auth, 400, "", "messages"},
		{"message not object", "POST", "/v1/chat/completions", `{"model":"qwen3-32b","messages":["hi"]}`, auth, 400, "", "messages"},
		{"message without role", "POST", "/v1/chat/completions", `{"model":"qwen3-32b","messages":[{"content":"hi"}]}`, auth, 400, "", "messages"},
		{"content wrong type", "POST", "/v1/chat/completions", `{"model":"qwen3-32b","messages":[{"role":"user","content":5}]}`, auth, 400, "", "messages"},
		{"model twice", "POST", "/v1/chat/completions", `{"model":"qwen3-32b","messages":[{"role":"user","content":"x"}],"model":"other"}`, auth, 400, "", "model"},
		{"stream not bool", "POST", "/v1/chat/completions", `{"model":"qwen3-32b","stream":"yes","messages":[{"role":"user","content":"x"}]}`, auth, 400, "", "stream"},
		{"tools not array", "POST", "/v1/chat/completions", `{"model":"qwen3-32b","tools":{},"messages":[{"role":"user","content":"x"}]}`, auth, 400, "", "tools"},
		{"bad cache_salt", "POST", "/v1/chat/completions", `{"model":"qwen3-32b","cache_salt":"","messages":[{"role":"user","content":"x"}]}`, auth, 400, "", "cache_salt"},
		{"completions without prompt", "POST", "/v1/completions", `{"model":"qwen3-32b"}`, auth, 400, "", "prompt"},
		{"completions bad prompt", "POST", "/v1/completions", `{"model":"qwen3-32b","prompt":[{}]}`, auth, 400, "", "prompt"},
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, auth, 404, "model_not_found", ""},
		{"unknown model get", "GET", "/v1/models/gpt-9", ``, auth, 404, "model_not_found", ""},
		{"too large", "POST", "/v1/chat/completions", `{"model":"qwen3-32b","messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`, auth, 413, "request_too_large", ""},
		{"wrong method", "GET", "/v1/chat/completions", ``, auth, 405, "method_not_allowed", ""},
		{"unknown path", "POST", "/v1/nothing", `{}`, auth, 404, "unknown_url", ""},
		{"upstream rejects", "POST", "/v1/chat/completions", `{"model":"qwen3-32b","n":2,"messages":[{"role":"user","content":"x"}]}`, auth, 400, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, gw.URL+tt.path, strings.NewReader(tt.body))
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.status {
				t.Fatalf("status = %d; want %d (%s)", resp.StatusCode, tt.status, raw)
			}
			checkEnvelope(t, raw, tt.code, tt.param)
		})
	}
}

// checkEnvelope asserts an OpenAI error envelope: all four keys, code and
// param strings or null.
func checkEnvelope(t *testing.T, raw []byte, code, param string) {
	t.Helper()
	var env map[string]map[string]json.RawMessage
	if err := json.Unmarshal(raw, &env); err != nil {
		t.Fatalf("not JSON: %s", raw)
	}
	e, ok := env["error"]
	if !ok {
		t.Fatalf("no error key: %s", raw)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		v, ok := e[k]
		if !ok {
			t.Fatalf("error lacks %q: %s", k, raw)
		}
		if (k == "param" || k == "code") && string(v) != "null" && v[0] != '"' {
			t.Errorf("error.%s = %s; want a string or null", k, v)
		}
	}
	if code != "" && string(e["code"]) != `"`+code+`"` {
		t.Errorf("code = %s; want %q", e["code"], code)
	}
	if param != "" && string(e["param"]) != `"`+param+`"` {
		t.Errorf("param = %s; want %q", e["param"], param)
	}
}

// A replica that errors is retried once on the next-best replica; when all
// fail, the client gets the upstream's error in OpenAI's shape (vLLM's
// integer code normalized).
func TestUpstreamErrors(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := fleetConfig(sim)
	cfg.Health.Failures = 100 // keep the failing replicas "healthy" to exercise retries
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	sim.Replicas()[0].SetFaults(vllmsim.Faults{ErrorRate: 1})
	// Fresh prompts until one lands on the failing replica first (the
	// policy picks either; six in a row on the good one did happen).
	for i := 0; counter(t, gw.obs.reg, "warmpath_upstream_retries_total", nil) == 0; i++ {
		if i == 40 {
			t.Fatal("no retries counted after 40 requests with one failing replica")
		}
		r := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 4, "messages": []msg{{"user", words("q", 5+i)}}}, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("request %d with one failing replica: status %d: %s", i, r.Status, r.Body)
		}
	}
	sim.Replicas()[1].SetFaults(vllmsim.Faults{ErrorRate: 1})
	r := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "messages": []msg{{"user", "x"}}}, nil)
	if r.Status != http.StatusInternalServerError {
		t.Fatalf("all failing: status %d; want 500: %s", r.Status, r.Body)
	}
	checkEnvelope(t, r.Body, "", "")
}

// A client that disconnects mid-stream cancels the upstream request: the
// replica stops generating and the gateway's in-flight count returns to 0.
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1, Speed: 1})
	cfg := fleetConfig(sim)
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	ctx, cancel := context.WithCancel(context.Background())
	body := `{"model":"qwen3-32b","stream":true,"max_tokens":5000,"ignore_eos":true,"messages":[{"role":"user","content":"write a lot"}]}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatalf("no first event: %v", err)
	}
	rep := sim.Replicas()[0]
	if rep.Stats().Running != 1 {
		t.Fatalf("replica running = %d; want 1", rep.Stats().Running)
	}
	cancel()
	resp.Body.Close()
	testrun.Eventually(t, 5*time.Second, func() bool {
		st := rep.Stats()
		return st.Running == 0 && st.Aborted == 1
	}, "the replica to abort the request")
	testrun.Eventually(t, 5*time.Second, func() bool {
		return gw.fleet.Snapshot().Replicas[0].InflightRequests() == 0
	}, "in-flight count back to 0")
	if got := counter(t, gw.obs.reg, "warmpath_requests_total", map[string]string{"code": "499"}); got != 1 {
		t.Errorf("499s counted = %v; want 1", got)
	}
}

// Every policy serves requests, streaming and not, with debug headers on.
func TestEveryPolicyServes(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	for _, policy := range scoring.Policies() {
		t.Run(policy, func(t *testing.T) {
			cfg := fleetConfig(sim)
			cfg.Debug = true
			cfg.Routing.Policy = policy
			rdb := redisFor(t, &cfg)
			gw := startGateway(t, cfg, rdb)
			c := newConversation(words("p", 100), "hello")
			for range 3 {
				if r := c.turn(t, gw.URL, "next"); r.replica() == "" {
					t.Fatalf("no X-Warmpath-Replica header: %v", r.Header)
				}
			}
			resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"qwen3-32b","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"stream"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			events := sseEvents(t, resp.Body)
			resp.Body.Close()
			if len(events) < 2 || events[len(events)-1] != "[DONE]" {
				t.Fatalf("stream: %v", events)
			}
			if got := counter(t, gw.obs.reg, "warmpath_requests_total", map[string]string{"policy": policy, "code": "200"}); got != 4 {
				t.Errorf("requests_total{policy=%q,code=200} = %v; want 4", policy, got)
			}
		})
	}
}
