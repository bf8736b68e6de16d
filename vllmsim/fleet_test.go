package vllmsim

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	zmq "github.com/pebbe/zmq4"
	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/kvevents"
)

// startFleet runs a fleet until the test ends.
func startFleet(t testing.TB, cfg Config) *Fleet {
	t.Helper()
	if cfg.Speed == 0 {
		cfg.Speed = 1000
	}
	f, err := NewFleet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "vllmsim fleet", f.Run)
	return f
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func post(t *testing.T, url string, body any, header ...string) response {
	t.Helper()
	var rd io.Reader
	if s, ok := body.(string); ok {
		rd = strings.NewReader(s)
	} else {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(http.MethodPost, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header, b}
}

func get(t *testing.T, url string) response {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, b}
}

type usageResp struct {
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens *int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		TokenIDs []uint32 `json:"token_ids"`
	} `json:"choices"`
	PromptTokenIDs []uint32 `json:"prompt_token_ids"`
}

// chat posts a chat completion and decodes the usage.
func chat(t *testing.T, base string, body map[string]any, header ...string) (usageResp, response) {
	t.Helper()
	r := post(t, base+"/v1/chat/completions", body, header...)
	if r.status != http.StatusOK {
		t.Fatalf("chat: %d %s", r.status, r.body)
	}
	var u usageResp
	if err := json.Unmarshal(r.body, &u); err != nil {
		t.Fatal(err)
	}
	if u.Usage.PromptTokensDetails.CachedTokens == nil {
		t.Fatalf("cached_tokens missing: %s", r.body)
	}
	return u, r
}

func userMsg(text string) []map[string]any {
	return []map[string]any{{"role": "user", "content": text}}
}

func longText(tag string, n int) string {
	ws := make([]string, n)
	for i := range ws {
		ws[i] = tag + strconv.Itoa(i)
	}
	return strings.Join(ws, " ")
}

func TestOpenAIClient(t *testing.T) {
	f := startFleet(t, Config{})
	client := openai.NewClient(option.WithBaseURL(f.Replicas()[0].Info().URL+"/v1"), option.WithAPIKey("x"))
	ctx := t.Context()
	params := openai.ChatCompletionNewParams{
		Model:     DefaultModel,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be nice"), openai.UserMessage(longText("oa", 100))},
		MaxTokens: openai.Int(30),
	}
	c1, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(c1.Choices) != 1 || c1.Choices[0].Message.Content == "" || c1.Usage.PromptTokens == 0 || c1.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("first completion: %+v", c1)
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	var text strings.Builder
	chunks := 0
	for stream.Next() {
		ch := stream.Current()
		acc.AddChunk(ch)
		chunks++
		if len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks < 3 || text.String() != c1.Choices[0].Message.Content {
		t.Errorf("stream: %d chunks, text %q, want %q", chunks, text.String(), c1.Choices[0].Message.Content)
	}
	if acc.Usage.PromptTokens != c1.Usage.PromptTokens || acc.Usage.PromptTokensDetails.CachedTokens == 0 ||
		acc.Usage.CompletionTokens != c1.Usage.CompletionTokens {
		t.Errorf("stream usage %+v", acc.Usage)
	}

	// A forced tool call, plain and streamed.
	tools := []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
		Name: "get_weather",
		Parameters: openai.FunctionParameters{"type": "object",
			"properties": map[string]any{"city": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer"}},
			"required":   []string{"city", "days"}},
	})}
	tp := openai.ChatCompletionNewParams{
		Model:      DefaultModel,
		Messages:   []openai.ChatCompletionMessageParamUnion{openai.UserMessage("what's the weather?")},
		Tools:      tools,
		ToolChoice: openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_weather"}),
	}
	c2, err := client.Chat.Completions.New(ctx, tp)
	if err != nil {
		t.Fatal(err)
	}
	if c2.Choices[0].FinishReason != "tool_calls" || len(c2.Choices[0].Message.ToolCalls) != 1 {
		t.Fatalf("tool call: %+v", c2.Choices[0])
	}
	call := c2.Choices[0].Message.ToolCalls[0]
	var args struct {
		City string `json:"city"`
		Days int    `json:"days"`
	}
	if call.Function.Name != "get_weather" || json.Unmarshal([]byte(call.Function.Arguments), &args) != nil || args.City == "" || args.Days != 1 {
		t.Errorf("tool call %+v", call)
	}
	stream = client.Chat.Completions.NewStreaming(ctx, tp)
	acc = openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 1 || len(acc.Choices[0].Message.ToolCalls) != 1 || acc.Choices[0].FinishReason != "tool_calls" ||
		acc.Choices[0].Message.ToolCalls[0].Function.Arguments != call.Function.Arguments {
		t.Errorf("streamed tool call: %+v", acc.Choices)
	}

	// The agent loop goes on: the tool result comes back and the reply is text.
	tp.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{}
	tp.Messages = append(tp.Messages, c2.Choices[0].Message.ToParam(), openai.ToolMessage("sunny", call.ID))
	c3, err := client.Chat.Completions.New(ctx, tp)
	if err != nil {
		t.Fatal(err)
	}
	if c3.Choices[0].FinishReason != "stop" || c3.Choices[0].Message.Content == "" || c3.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Errorf("after tool result: %+v usage %+v", c3.Choices[0], c3.Usage)
	}
}

func TestCachedTokensPerReplica(t *testing.T) {
	f := startFleet(t, Config{Replicas: 2})
	r0, r1 := f.Replicas()[0].Info().URL, f.Replicas()[1].Info().URL
	body := map[string]any{"model": DefaultModel, "messages": userMsg(longText("cache", 2000)), "max_tokens": 5}
	u, resp := chat(t, r0, body)
	if u.Usage.PromptTokens < 2000 || *u.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("first: %+v", u.Usage)
	}
	cold, _ := strconv.ParseFloat(resp.header.Get("X-Sim-TTFT-Ms"), 64)
	u, resp = chat(t, r0, body)
	if got, want := *u.Usage.PromptTokensDetails.CachedTokens, (u.Usage.PromptTokens-1)/16*16; got != want {
		t.Errorf("second on replica 0: cached %d, want %d", got, want)
	}
	warm, _ := strconv.ParseFloat(resp.header.Get("X-Sim-TTFT-Ms"), 64)
	if !(warm > 0 && warm*3 < cold) {
		t.Errorf("simulated TTFT warm %.3f ms vs cold %.3f ms", warm, cold)
	}
	if u, _ = chat(t, r1, body); *u.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("replica 1 cached %d", *u.Usage.PromptTokensDetails.CachedTokens)
	}
	if r := post(t, r0+"/reset_prefix_cache", ""); r.status != 200 {
		t.Errorf("/reset_prefix_cache: %d", r.status)
	}
	if u, _ = chat(t, r0, body); *u.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("after /reset_prefix_cache cached %d", *u.Usage.PromptTokensDetails.CachedTokens)
	}
	if st := f.Replicas()[0].Stats(); st.Requests != 3 || st.CachedTokens == 0 {
		t.Errorf("replica 0 stats %+v", st)
	}
}

func TestMultiTurnReusesDecodeBlocks(t *testing.T) {
	f := startFleet(t, Config{})
	base := f.Replicas()[0].Info().URL
	msgs := []map[string]any{{"role": "system", "content": longText("sys", 300)}, {"role": "user", "content": "hello"}}
	u, _ := chat(t, base, map[string]any{"messages": msgs, "max_tokens": 200, "min_tokens": 100, "return_token_ids": true})
	if len(u.PromptTokenIDs) != u.Usage.PromptTokens || len(u.Choices[0].TokenIDs) != u.Usage.CompletionTokens {
		t.Fatalf("return_token_ids: %d prompt IDs, %d output IDs, usage %+v", len(u.PromptTokenIDs), len(u.Choices[0].TokenIDs), u.Usage)
	}
	msgs = append(msgs, map[string]any{"role": "assistant", "content": u.Choices[0].Message.Content},
		map[string]any{"role": "user", "content": "more"})
	u2, _ := chat(t, base, map[string]any{"messages": msgs, "max_tokens": 5, "return_token_ids": true})
	turn1 := append(slices.Clone(u.PromptTokenIDs), u.Choices[0].TokenIDs...)
	if !slices.Equal(u2.PromptTokenIDs[:len(turn1)], turn1) {
		t.Fatal("turn 2's prompt does not start with turn 1's prompt and output")
	}
	// Everything computed in turn 1 (all but its last token) is cached, in
	// whole blocks.
	if got, want := *u2.Usage.PromptTokensDetails.CachedTokens, (len(turn1)-1)/16*16; got != want {
		t.Errorf("turn 2 cached %d tokens, want %d", got, want)
	}
}

// subscriber is a raw SUB socket on one replica's KV events.
type subscriber struct {
	sock *zmq.Socket
	zctx *zmq.Context
}

func subscribe(t *testing.T, endpoint, topic string) *subscriber {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	sock, err := zctx.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	_ = sock.SetLinger(0)
	_ = sock.SetRcvtimeo(100 * time.Millisecond)
	if err := sock.SetSubscribe(topic); err != nil {
		t.Fatal(err)
	}
	if err := sock.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	s := &subscriber{sock, zctx}
	t.Cleanup(func() {
		_ = sock.Close()
		_ = zctx.Term()
	})
	return s
}

type message struct {
	topic string
	seq   uint64
	batch kvevents.Batch
}

// recv returns the next message, or false after the socket's timeout.
func (s *subscriber) recv(t *testing.T) (message, bool) {
	frames, err := s.sock.RecvMessageBytes(0)
	if err != nil {
		return message{}, false
	}
	if len(frames) != 3 {
		t.Fatalf("%d frames", len(frames))
	}
	seq, err := kvevents.ParseSeq(frames[1])
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := kvevents.Decode(frames[2])
	if err != nil {
		t.Fatal(err)
	}
	return message{string(frames[0]), seq, b}, true
}

// warmUp sends requests until the subscriber receives something (the PUB
// drops messages until the SUB's connection is up), then drains.
func (s *subscriber) warmUp(t *testing.T, base string) {
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		if time.Now().After(deadline) {
			t.Fatal("no KV events reached the subscriber")
		}
		chat(t, base, map[string]any{"messages": userMsg(longText("warm"+strconv.Itoa(i), 40)), "max_tokens": 2})
		if _, ok := s.recv(t); ok {
			break
		}
	}
	for {
		if _, ok := s.recv(t); !ok {
			return
		}
	}
}

func TestKVEventsEndToEnd(t *testing.T) {
	for _, format := range []kvevents.Format{kvevents.FormatMap, kvevents.FormatArray} {
		t.Run(format.String(), func(t *testing.T) {
			f := startFleet(t, Config{EventFormat: format})
			rep := f.Replicas()[0]
			info := rep.Info()
			sub := subscribe(t, info.KVEndpoint, info.Topic)
			sub.warmUp(t, info.URL)

			msgs := []Message{{Role: "user", Content: longText("kv", 100)}}
			prompt := TokenizeChat(msgs, nil, true)
			u, _ := chat(t, info.URL, map[string]any{"messages": msgs, "max_tokens": 40, "ignore_eos": true,
				"cache_salt": "tenant-a", "return_token_ids": true}, "X-Session-ID", "sess-9")
			if !slices.Equal(u.PromptTokenIDs, prompt) {
				t.Fatal("server's prompt tokens differ from TokenizeChat")
			}
			all := append(slices.Clone(prompt), u.Choices[0].TokenIDs...)
			wantBlocks := (len(all) - 1) / 16

			var stored []*kvevents.BlockStored
			var lastSeq uint64
			seqs := 0
			for n := 0; n < wantBlocks; {
				m, ok := sub.recv(t)
				if !ok {
					t.Fatalf("got %d of %d blocks", n, wantBlocks)
				}
				if m.topic != info.Topic || m.batch.DPRank == nil || *m.batch.DPRank != 0 || m.batch.TS < 1e9 {
					t.Fatalf("message topic %q dp %v ts %v", m.topic, m.batch.DPRank, m.batch.TS)
				}
				if seqs > 0 && m.seq != lastSeq+1 {
					t.Errorf("seq %d after %d", m.seq, lastSeq)
				}
				lastSeq = m.seq
				seqs++
				for _, ev := range m.batch.Events {
					if s, ok := ev.(*kvevents.BlockStored); ok {
						stored = append(stored, s)
						n += len(s.BlockHashes)
					}
				}
			}
			var toks []uint32
			var prev *uint64
			for i, s := range stored {
				if (prev == nil) != (s.ParentBlockHash == nil) || prev != nil && *prev != *s.ParentBlockHash {
					t.Errorf("event %d: parent chain broken", i)
				}
				prev = &s.BlockHashes[len(s.BlockHashes)-1]
				if s.SessionID != "sess-9" && format == kvevents.FormatMap {
					t.Errorf("event %d: session %q", i, s.SessionID)
				}
				toks = append(toks, s.TokenIDs...)
			}
			if stored[0].CacheSalt != "tenant-a" {
				t.Errorf("block 0 salt %q, extra keys %v", stored[0].CacheSalt, stored[0].ExtraKeys)
			}
			if !slices.Equal(toks, all[:wantBlocks*16]) {
				t.Error("stored token_ids are not the prompt and output in 16-token blocks")
			}
			if wantBlocks*16 <= len(prompt) {
				t.Fatal("test too small to cover decode blocks")
			}

			// The replay endpoint serves the same batches from seq 0.
			if got := replay(t, info.ReplayEndpoint, 0); len(got) == 0 || got[0] != 0 || got[len(got)-1] != lastSeq {
				t.Errorf("replay from 0 returned seqs %v, want 0..%d", got, lastSeq)
			}

			// A restart: the next batch has sequence number 0.
			rep.Restart()
			chat(t, info.URL, map[string]any{"messages": userMsg(longText("after", 40)), "max_tokens": 2})
			m, ok := sub.recv(t)
			if !ok || m.seq != 0 {
				t.Errorf("after restart: got message %v, seq %d; want seq 0", ok, m.seq)
			}
		})
	}
}

func TestEvictionOverHTTP(t *testing.T) {
	f := startFleet(t, Config{KVBlocks: 40})
	info := f.Replicas()[0].Info()
	sub := subscribe(t, info.KVEndpoint, info.Topic)
	sub.warmUp(t, info.URL)
	a := map[string]any{"messages": userMsg(longText("ea", 300)), "max_tokens": 1}
	chat(t, info.URL, a)
	chat(t, info.URL, map[string]any{"messages": userMsg(longText("eb", 500)), "max_tokens": 1})
	removed := 0
	for {
		m, ok := sub.recv(t)
		if !ok {
			break
		}
		for _, ev := range m.batch.Events {
			if r, ok := ev.(*kvevents.BlockRemoved); ok {
				removed += len(r.BlockHashes)
			}
		}
	}
	if removed == 0 {
		t.Error("no BlockRemoved under capacity pressure")
	}
	if u, _ := chat(t, info.URL, a); *u.Usage.PromptTokensDetails.CachedTokens >= u.Usage.PromptTokens-16 {
		t.Errorf("evicted prompt still fully cached: %+v", u.Usage)
	}
}

func TestRestartFailsInFlight(t *testing.T) {
	f := startFleet(t, Config{Speed: 100})
	rep := f.Replicas()[0]
	base := rep.Info().URL
	warm := map[string]any{"messages": userMsg(longText("rs", 200)), "max_tokens": 2}
	chat(t, base, warm)
	if u, _ := chat(t, base, warm); *u.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatal("not cached before restart")
	}

	client := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	stream := client.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model: DefaultModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("long one")},
		MaxTokens: openai.Int(100000),
	}, option.WithJSONSet("ignore_eos", true))
	if !stream.Next() {
		t.Fatalf("no first chunk: %v", stream.Err())
	}
	// A non-streaming request in flight too.
	nonStream := make(chan response, 1)
	go func() {
		nonStream <- post(t, base+"/v1/chat/completions", map[string]any{"messages": userMsg("another long one"), "max_tokens": 100000, "ignore_eos": true})
	}()
	testrun.Eventually(t, 10*time.Second, func() bool { return rep.Stats().Running == 2 }, "two requests running")
	rep.Restart()
	for stream.Next() {
	}
	if stream.Err() == nil {
		t.Error("stream ended without error after restart")
	}
	r := <-nonStream
	var e struct {
		Error struct {
			Type string `json:"type"`
			Code int    `json:"code"`
		} `json:"error"`
	}
	if r.status != 500 || json.Unmarshal(r.body, &e) != nil || e.Error.Code != 500 {
		t.Errorf("non-streaming request after restart: %d %s", r.status, r.body)
	}
	if u, _ := chat(t, base, warm); *u.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("cache survived restart: cached %d", *u.Usage.PromptTokensDetails.CachedTokens)
	}
}

type errorShape struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Param   any    `json:"param"`
		Code    int    `json:"code"`
	} `json:"error"`
}

func checkError(t *testing.T, name string, r response, status int, typ string) {
	t.Helper()
	var e errorShape
	if r.status != status || json.Unmarshal(r.body, &e) != nil || e.Error.Code != status || e.Error.Type != typ || e.Error.Message == "" {
		t.Errorf("%s: %d %s; want %d %s", name, r.status, r.body, status, typ)
	}
}

func TestFaults(t *testing.T) {
	f := startFleet(t, Config{})
	rep := f.Replicas()[0]
	base := rep.Info().URL
	body := map[string]any{"messages": userMsg("hi"), "max_tokens": 3}

	rep.SetFaults(Faults{ErrorRate: 1})
	checkError(t, "error rate 1", post(t, base+"/v1/chat/completions", body), 500, "InternalServerError")
	rep.SetFaults(Faults{ExtraLatency: 2 * time.Second})
	if _, r := chat(t, base, body); msHeader(t, r, "X-Sim-Queue-Ms") < 2000 || msHeader(t, r, "X-Sim-TTFT-Ms") < 2000 {
		t.Errorf("extra latency: queue %s ms", r.header.Get("X-Sim-Queue-Ms"))
	}

	// A stream in flight stops while the replica hangs and resumes after.
	stream, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"s"}],"stream":true,"ignore_eos":true,"max_tokens":100000}`))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	var got sync.Mutex
	received := 0
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := stream.Body.Read(buf)
			got.Lock()
			received += n
			got.Unlock()
			if err != nil {
				return
			}
		}
	}()
	bytesSoFar := func() int { got.Lock(); defer got.Unlock(); return received }
	testrun.Eventually(t, 10*time.Second, func() bool { return bytesSoFar() > 0 }, "first stream bytes")
	rep.SetFaults(Faults{Hang: true})
	testrun.Eventually(t, 10*time.Second, func() bool { return rep.hung.Load() == 1 }, "stream held")
	// Bytes written before the hang may still be in flight: wait until
	// the count stops moving, then nothing more may arrive.
	prev, stable := -1, 0
	testrun.Eventually(t, 10*time.Second, func() bool {
		n := bytesSoFar()
		if n == prev {
			stable++
		} else {
			prev, stable = n, 0
		}
		return stable >= 25 // 25 ms without a byte
	}, "stream bytes to settle")
	before := bytesSoFar()

	client := &http.Client{Timeout: 300 * time.Millisecond}
	if _, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"messages":[{"role":"user","content":"x"}]}`)); err == nil {
		t.Error("hung replica answered")
	}
	if _, err := client.Get(base + "/health"); err == nil {
		t.Error("hung replica answered /health")
	}
	held := make(chan response, 1)
	go func() { held <- post(t, base+"/v1/chat/completions", body) }()
	testrun.Eventually(t, 10*time.Second, func() bool { return rep.hung.Load() == 2 }, "request held")
	if r := get(t, base+"/sim/faults"); r.status != 200 || !strings.Contains(string(r.body), `"hang":true`) {
		t.Errorf("admin endpoint while hung: %d %s", r.status, r.body)
	}
	if after := bytesSoFar(); after != before {
		t.Errorf("stream went on while hung: %d → %d bytes", before, after)
	}
	rep.SetFaults(Faults{})
	select {
	case r := <-held:
		if r.status != 200 {
			t.Errorf("held request: %d %s", r.status, r.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("held request not released by un-hang")
	}
	testrun.Eventually(t, 10*time.Second, func() bool { return bytesSoFar() > before }, "stream resumed")
	stream.Body.Close()

	if err := rep.SetDown(true); err != nil {
		t.Fatal(err)
	}
	_, err = http.Get(base + "/health")
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("down replica: err %v, want connection refused", err)
	}
	if err := rep.SetDown(false); err != nil {
		t.Fatal(err)
	}
	if r := get(t, base+"/health"); r.status != 200 {
		t.Errorf("back up: %d", r.status)
	}
	chat(t, base, body)

	// Faults over HTTP.
	if r := post(t, base+"/sim/faults", map[string]any{"error_rate": 1}); r.status != 200 {
		t.Fatalf("POST /sim/faults: %d %s", r.status, r.body)
	}
	checkError(t, "error rate via admin", post(t, base+"/v1/completions", map[string]any{"prompt": "x"}), 500, "InternalServerError")
	post(t, base+"/sim/faults", map[string]any{})
}

func TestHTTPSurface(t *testing.T) {
	f := startFleet(t, Config{Profile: Profile{MaxModelLen: 4096}})
	base := f.Replicas()[0].Info().URL

	var models struct {
		Data []struct {
			ID          string `json:"id"`
			Root        string `json:"root"`
			OwnedBy     string `json:"owned_by"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	r := get(t, base+"/v1/models")
	if json.Unmarshal(r.body, &models) != nil || len(models.Data) != 1 || models.Data[0].ID != DefaultModel ||
		models.Data[0].Root != DefaultModel || models.Data[0].OwnedBy != "vllm" || models.Data[0].MaxModelLen != 4096 {
		t.Errorf("/v1/models: %s", r.body)
	}
	if r := get(t, base+"/health"); r.status != 200 {
		t.Errorf("/health: %d", r.status)
	}

	var tok struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
		TokenStrs   []string `json:"token_strs"`
	}
	r = post(t, base+"/tokenize", map[string]any{"prompt": "hello big world", "return_token_strs": true})
	if json.Unmarshal(r.body, &tok) != nil || tok.Count != 3 || tok.MaxModelLen != 4096 || !slices.Equal(tok.Tokens, Tokenize("hello big world")) ||
		!slices.Equal(tok.TokenStrs, []string{Word(tok.Tokens[0]), Word(tok.Tokens[1]), Word(tok.Tokens[2])}) {
		t.Errorf("/tokenize prompt: %s", r.body)
	}
	msgs := []Message{{Role: "system", Content: "s"}, {Role: "user", Content: "u"}}
	r = post(t, base+"/tokenize", map[string]any{"messages": msgs})
	if json.Unmarshal(r.body, &tok) != nil || !slices.Equal(tok.Tokens, TokenizeChat(msgs, nil, true)) {
		t.Errorf("/tokenize chat: %s", r.body)
	}
	r = post(t, base+"/tokenize", map[string]any{"messages": msgs, "add_generation_prompt": false})
	if json.Unmarshal(r.body, &tok) != nil || !slices.Equal(tok.Tokens, TokenizeChat(msgs, nil, false)) {
		t.Errorf("/tokenize chat without generation prompt: %s", r.body)
	}
	// TokenizeBody (the gateway's in-process tokenizer) answers as /tokenize.
	for _, body := range []string{
		`{"prompt":"hello <|im_start|> big, world\n"}`,
		`{"model":"` + DefaultModel + `","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
		`{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"q\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"42"}],` +
			`"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"}}}],"add_generation_prompt":true}`,
		`{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"partial"}],"add_generation_prompt":false,"continue_final_message":true}`,
	} {
		r = post(t, base+"/tokenize", body)
		got, err := TokenizeBody([]byte(body))
		if json.Unmarshal(r.body, &tok) != nil || err != nil || len(got) == 0 || !slices.Equal(got, tok.Tokens) {
			t.Errorf("TokenizeBody(%s) = %v, %v; /tokenize answered %s", body, got, err, r.body)
		}
		// A gateway that parsed the request passes its arrays (with
		// add_generation_prompt, as it asks): the same ids.
		if b := gjson.Parse(body); b.Get("messages").Exists() && b.Get("add_generation_prompt").Type != gjson.False {
			if v, err := TokenizeChatJSON(b.Get("messages").Raw, b.Get("tools").Raw); err != nil || !slices.Equal(v, got) {
				t.Errorf("TokenizeChatJSON of %s = %v, %v; TokenizeBody %v", body, v, err, got)
			}
		}
	}
	for _, body := range []string{`{"messages":[],"continue_final_message":true}`, `{"model":"m"}`, `[`} {
		if r := post(t, base+"/tokenize", body); r.status == 200 {
			t.Errorf("/tokenize %s answered 200", body)
		}
		if _, err := TokenizeBody([]byte(body)); err == nil {
			t.Errorf("TokenizeBody(%s) succeeded", body)
		}
	}
	r = post(t, base+"/detokenize", map[string]any{"tokens": TokenizeChat(msgs, nil, true)})
	var detok struct {
		Prompt string `json:"prompt"`
	}
	if json.Unmarshal(r.body, &detok) != nil || !slices.Equal(Tokenize(detok.Prompt), TokenizeChat(msgs, nil, true)) {
		t.Errorf("/detokenize: %s", r.body)
	}

	// Completions, plain and streamed.
	r = post(t, base+"/v1/completions", map[string]any{"prompt": "once upon a time", "max_tokens": 7, "ignore_eos": true})
	var cmpl struct {
		Object  string `json:"object"`
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(r.body, &cmpl) != nil || cmpl.Object != "text_completion" || cmpl.Usage.CompletionTokens != 7 ||
		cmpl.Choices[0].FinishReason != "length" || len(Tokenize(cmpl.Choices[0].Text)) != 7 {
		t.Errorf("/v1/completions: %s", r.body)
	}
	r = post(t, base+"/v1/completions", map[string]any{"prompt": []int{1001, 1002, 1003}, "max_tokens": 7, "ignore_eos": true,
		"stream": true, "stream_options": map[string]any{"include_usage": true}})
	sse := string(r.body)
	if !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") || !strings.HasSuffix(sse, "data: [DONE]\n\n") ||
		!strings.Contains(sse, `"choices":[],"usage":{"prompt_tokens":3,"total_tokens":10,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":0}}`) {
		t.Errorf("streamed completion:\n%s", sse)
	}

	// Metrics.
	r = get(t, base+"/metrics")
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
		"vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket", `num_gpu_blocks="19208"`,
		`vllm:cache_config_info{block_size="16"`, `model_name="qwen3-32b"`} {
		if !strings.Contains(string(r.body), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if !strings.Contains(string(r.body), `vllm:generation_tokens_total{engine="0",model_name="qwen3-32b"} 14`) {
		t.Errorf("generation tokens not counted:\n%s", r.body)
	}
	// vLLM's per-request queue and prefill histograms, one sample per
	// request scheduled.
	for _, name := range []string{"vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds"} {
		if !strings.Contains(string(r.body), name+`_count{engine="0",model_name="qwen3-32b"} 2`) {
			t.Errorf("/metrics lacks %s with 2 requests:\n%s", name, r.body)
		}
	}

	// Errors in vLLM's shape.
	chatURL := base + "/v1/chat/completions"
	checkError(t, "bad JSON", post(t, chatURL, `{"messages":`), 400, "BadRequestError")
	checkError(t, "unknown model", post(t, chatURL, map[string]any{"model": "gpt-9", "messages": userMsg("x")}), 404, "NotFoundError")
	checkError(t, "too long", post(t, chatURL, map[string]any{"messages": userMsg(longText("l", 5000))}), 400, "BadRequestError")
	checkError(t, "max_tokens too large", post(t, chatURL, map[string]any{"messages": userMsg("x"), "max_tokens": 5000}), 400, "BadRequestError")
	checkError(t, "empty salt", post(t, chatURL, map[string]any{"messages": userMsg("x"), "cache_salt": ""}), 400, "BadRequestError")
	checkError(t, "numeric salt", post(t, chatURL, map[string]any{"messages": userMsg("x"), "cache_salt": 5}), 400, "BadRequestError")
	checkError(t, "priority under fcfs", post(t, chatURL, map[string]any{"messages": userMsg("x"), "priority": 1}), 400, "BadRequestError")
	checkError(t, "no messages", post(t, chatURL, map[string]any{"messages": []any{}}), 400, "BadRequestError")
	checkError(t, "unknown tool", post(t, chatURL, map[string]any{"messages": userMsg("x"),
		"tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "nope"}}}), 400, "BadRequestError")
	checkError(t, "tokenize unknown model", post(t, base+"/tokenize", map[string]any{"model": "m", "prompt": "x"}), 404, "NotFoundError")

	// Stop strings and the chat stream shape.
	r = post(t, chatURL, map[string]any{"messages": userMsg("x"), "stream": true, "max_tokens": 3, "ignore_eos": true})
	if !strings.HasPrefix(string(r.body), `data: {"id":"chatcmpl-`) || strings.Contains(string(r.body), `"usage"`) ||
		strings.Contains(string(r.body), `"error"`) || !strings.Contains(string(r.body), `"finish_reason":"length"`) {
		t.Errorf("chat stream:\n%s", r.body)
	}
}

func TestPrioritySchedulingOverHTTP(t *testing.T) {
	f := startFleet(t, Config{SchedulingPolicy: "priority"})
	base := f.Replicas()[0].Info().URL
	chat(t, base, map[string]any{"messages": userMsg("x"), "priority": -5, "max_tokens": 2})
	if _, err := NewFleet(Config{SchedulingPolicy: "lottery"}); err == nil {
		t.Error("unknown policy accepted")
	}
}

func TestRunPrintsReplicas(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- Run(ctx, Config{Replicas: 2, ReplayPort: -1, Speed: 100}, &out) }()
	testrun.Eventually(t, 10*time.Second, func() bool { return strings.Count(out.String(), "\n") >= 2 }, "replica lines")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("output:\n%s", out.String())
	}
	for i, l := range lines {
		var http, kv, topic string
		if _, err := fmt.Sscanf(l, "replica "+strconv.Itoa(i)+"  http=%s  kv=%s  replay=none  topic=%s", &http, &kv, &topic); err != nil {
			t.Errorf("line %q: %v", l, err)
		}
		if !strings.HasPrefix(topic, "kv@127.0.0.1:") || !strings.HasSuffix(topic, "@"+DefaultModel) || !strings.HasPrefix(kv, "tcp://127.0.0.1:") {
			t.Errorf("line %q", l)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestConfigPorts(t *testing.T) {
	cfg, err := Config{Replicas: 3, HTTPPort: 8100, KVPort: 5557}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	pub, replay := kvEndpoints(cfg, 2, 0)
	if h := httpAddr(cfg, 2); h != "127.0.0.1:8102" || pub != "tcp://*:5559" || replay != "tcp://127.0.0.1:5659" {
		t.Errorf("endpoints %s %s %s", h, pub, replay)
	}
	cfg.ReplayPort = 7000
	if _, replay = kvEndpoints(cfg, 1, 0); replay != "tcp://127.0.0.1:7001" {
		t.Errorf("replay %s", replay)
	}
	if _, err := (Config{Replicas: 2, HTTPPort: 65535}).resolve(); err == nil {
		t.Error("port overflow accepted")
	}

	// Data parallelism: each replica's ranks at its base port + rank.
	cfg, err = Config{Replicas: 2, KVPort: 5557, DataParallelSize: 2}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		i, rank     int
		pub, replay string
	}{{0, 0, "tcp://*:5557", "tcp://127.0.0.1:5657"}, {0, 1, "tcp://*:5558", "tcp://127.0.0.1:5658"},
		{1, 0, "tcp://*:5559", "tcp://127.0.0.1:5659"}, {1, 1, "tcp://*:5560", "tcp://127.0.0.1:5660"}} {
		if pub, replay := kvEndpoints(cfg, tt.i, tt.rank); pub != tt.pub || replay != tt.replay {
			t.Errorf("replica %d rank %d: %s %s; want %s %s", tt.i, tt.rank, pub, replay, tt.pub, tt.replay)
		}
	}
	cfg.KVConnect = "tcp://10.0.0.9:5557"
	if pub, _ := kvEndpoints(cfg, 1, 1); pub != "tcp://10.0.0.9:5558" {
		t.Errorf("connecting rank 1 dials %s; want port + 1", pub)
	}
	for _, bad := range []Config{
		{Replicas: 2, KVPort: 5557, ReplayPort: 5558},                      // replica 1's events on replica 0's replay port
		{Replicas: 1, KVPort: 5557, ReplayPort: 5558, DataParallelSize: 2}, // rank 1's events on rank 0's replay port
		{Replicas: 60, KVPort: 5557, DataParallelSize: 2},                  // 120 ranks reach KVPort+100
		{DataParallelSize: -1},
		{CPUBlocks: -1},
	} {
		if _, err := bad.resolve(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func msHeader(t *testing.T, r response, name string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(r.header.Get(name), 64)
	if err != nil {
		t.Fatalf("header %s: %v", name, err)
	}
	return v
}

// replay asks a replica's replay ROUTER for the batches from start and
// returns their sequence numbers.
func replay(t *testing.T, endpoint string, start uint64) []uint64 {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	sock, err := zctx.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	_ = sock.SetLinger(0)
	_ = sock.SetRcvtimeo(5 * time.Second)
	if err := sock.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	if _, err := sock.SendMessage("", binary.BigEndian.AppendUint64(nil, start)); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for {
		frames, err := sock.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		if len(frames) != 4 {
			t.Fatalf("replay reply of %d frames", len(frames))
		}
		seq, _ := kvevents.ParseSeq(frames[2])
		if seq == kvevents.EndSeq {
			return seqs
		}
		seqs = append(seqs, seq)
	}
}

func TestStreamInterval(t *testing.T) {
	f := startFleet(t, Config{Speed: 100, StreamInterval: 20 * time.Millisecond})
	r := post(t, f.Replicas()[0].Info().URL+"/v1/chat/completions",
		map[string]any{"messages": userMsg("x"), "stream": true, "max_tokens": 200, "ignore_eos": true})
	if n := strings.Count(string(r.body), "data: "); n > 100 {
		t.Errorf("%d SSE events for 200 tokens with a 20 ms stream interval", n)
	}
}
