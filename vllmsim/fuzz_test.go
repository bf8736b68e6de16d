package vllmsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"
)

// FuzzHTTP posts arbitrary bodies to a running replica's JSON endpoints,
// the simulator's trust boundary (`warmpath sim` serves them to any
// client). Every answer must be a success or an OpenAI error envelope with
// a 4xx status; the replica must never drop the connection (net/http turns
// a handler panic into exactly that) or answer 5xx without a fault set.
// A request may take longer than the deadline (a large max_tokens); that
// is not a failure.
func FuzzHTTP(f *testing.F) {
	fl := startFleet(f, Config{Replicas: 1, Speed: 100000, KVBlocks: 256, Profile: Profile{MaxModelLen: 4096}})
	base := fl.Replicas()[0].Info().URL
	paths := []string{"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"}
	for _, s := range []struct {
		path uint8
		body string
	}{
		{0, `{"model":"qwen3-32b","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`},
		{0, `{"model":"qwen3-32b","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`},
		{0, `{"model":"qwen3-32b","messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],"tool_choice":"required","max_tokens":4}`},
		{0, `{"model":"qwen3-32b","messages":[{"role":"user","content":[{"type":"text","text":"parts"}]}],"cache_salt":"s","priority":-3,"max_tokens":1}`},
		{0, `{"model":"nope","messages":[]}`},
		{0, `{"messages":[{"role":"user"}],"max_tokens":-1}`},
		{1, `{"model":"qwen3-32b","prompt":"once upon","max_tokens":2}`},
		{1, `{"model":"qwen3-32b","prompt":[1,2,3],"max_tokens":2,"stream":true}`},
		{1, `[]`},
		{2, `{"model":"qwen3-32b","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true}`},
		{2, `{"model":"qwen3-32b","prompt":"tokenize me"}`},
		{2, `null`},
		{3, `{"model":"qwen3-32b","tokens":[1,2,70000]}`},
		{3, `{`},
	} {
		f.Add(s.path, s.body)
	}
	client := &http.Client{}
	f.Fuzz(func(t *testing.T, which uint8, body string) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		path := paths[int(which)%len(paths)]
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return
			}
			t.Fatalf("POST %s %q: %v", path, body, err)
		}
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		if err != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return
			}
			t.Fatalf("POST %s %q: reading the answer: %v", path, body, err)
		}
		switch {
		case resp.StatusCode == http.StatusOK:
		case resp.StatusCode >= 400 && resp.StatusCode < 500:
			var env struct {
				Error *struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if json.Unmarshal(got, &env) != nil || env.Error == nil || env.Error.Message == "" || env.Error.Type == "" {
				t.Fatalf("POST %s %q: %d without an error envelope: %s", path, body, resp.StatusCode, got)
			}
		default:
			t.Fatalf("POST %s %q: status %d: %s", path, body, resp.StatusCode, got)
		}
	})
}
