package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/gateway/proxy"
	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/misses"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/vllmsim"
)

// ccConversation drives /v1/messages the way Claude Code does: system
// blocks led by a billing line that changes on every request, cache_control
// marks, a dozen tools, a mid-conversation system message, thinking,
// context_management, output_config and metadata, and the whole history
// resent each turn with the assistant's blocks echoed back as they came.
type ccConversation struct {
	url      string
	header   map[string]string
	system   string // the system prompt after the billing block
	tools    []json.RawMessage
	messages []json.RawMessage
	requests int
}

// ccTools are Claude Code's tool names, with schemas of its shape.
var ccTools = []string{"Agent", "Bash", "Edit", "Glob", "Grep", "Read", "Write", "TodoWrite", "WebFetch", "WebSearch", "NotebookEdit", "Skill"}

func newCCConversation(url, session, agent, system string) *ccConversation {
	c := &ccConversation{url: url, system: system, header: map[string]string{
		"Authorization": "Bearer sk-ant-anything", "anthropic-version": "2023-06-01", "x-app": "cli",
		"anthropic-beta":           "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,effort-2025-11-24",
		"X-Claude-Code-Session-Id": session,
	}}
	if agent != "" {
		c.header["X-Claude-Code-Agent-Id"] = agent
	}
	for i, name := range ccTools {
		prop := strings.ToLower(name) + "_arg"
		c.tools = append(c.tools, json.RawMessage(fmt.Sprintf(`{"name":%q,"description":%q,"input_schema":{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object",`+
			`"properties":{%q:{"type":"string","description":"what to act on"}},"required":[%q],"additionalProperties":false}}`,
			name, words(fmt.Sprint("tool", i), 60), prop, prop)))
	}
	return c
}

// user appends a user turn of text blocks (Claude Code sends the last one
// with cache_control).
func (c *ccConversation) user(texts ...string) {
	var blocks []string
	for i, s := range texts {
		b, _ := json.Marshal(s)
		cc := ""
		if i == len(texts)-1 {
			cc = `,"cache_control":{"type":"ephemeral"}`
		}
		blocks = append(blocks, `{"type":"text","text":`+string(b)+cc+`}`)
	}
	c.messages = append(c.messages, json.RawMessage(`{"role":"user","content":[`+strings.Join(blocks, ",")+`]}`))
}

func (c *ccConversation) systemMessage(text string) {
	b, _ := json.Marshal(text)
	c.messages = append(c.messages, json.RawMessage(`{"role":"system","content":[{"type":"text","text":`+string(b)+`}]}`))
}

// ccAnswer is what one request returned.
type ccAnswer struct {
	status     int
	header     http.Header
	content    []json.RawMessage // the assistant's blocks, as the client will echo them
	toolIDs    []string
	stopReason string
	usage      struct{ Input, CacheRead, Output int }
	body       []byte
}

func (a ccAnswer) prompt() int { return a.usage.Input + a.usage.CacheRead }

func (a ccAnswer) predicted() int {
	n, _ := strconv.Atoi(a.header.Get("X-Warmpath-Predicted-Cached"))
	return n
}

// send posts the conversation so far and appends the assistant's answer.
func (c *ccConversation) send(t *testing.T, stream bool) ccAnswer {
	t.Helper()
	c.requests++
	sys, _ := json.Marshal(c.system)
	uid, _ := json.Marshal(fmt.Sprintf(`{"device_id":"d1","account_uuid":"","session_id":%q}`, c.header["X-Claude-Code-Session-Id"]))
	body := fmt.Sprintf(`{"model":%q,"messages":[%s],"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.328.%03x; cc_entrypoint=cli; cch=%05x;"},`+
		`{"type":"text","text":"You are Claude Code, Anthropic's official CLI for Claude.","cache_control":{"type":"ephemeral"}},{"type":"text","text":%s,"cache_control":{"type":"ephemeral"}}],`+
		`"tools":[%s],"metadata":{"user_id":%s},"max_tokens":32000,"thinking":{"type":"adaptive"},`+
		`"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]},"output_config":{"effort":"high"},"stream":%t}`,
		vllmsim.DefaultModel, join(c.messages), c.requests, c.requests*7919, sys, join(c.tools), uid, stream)
	req, _ := http.NewRequest(http.MethodPost, c.url+"/v1/messages?beta=true", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range c.header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("request %d: %v", c.requests, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := ccAnswer{status: resp.StatusCode, header: resp.Header, body: raw}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("request %d: status %d: %s", c.requests, resp.StatusCode, raw)
	}
	msg := raw
	if stream {
		msg = accumulateStream(t, raw)
	}
	m := gjson.ParseBytes(msg)
	m.Get("content").ForEach(func(_, b gjson.Result) bool {
		a.content = append(a.content, json.RawMessage(b.Raw))
		if b.Get("type").String() == "tool_use" {
			a.toolIDs = append(a.toolIDs, b.Get("id").String())
		}
		return true
	})
	a.stopReason = m.Get("stop_reason").String()
	a.usage.Input, a.usage.CacheRead = int(m.Get("usage.input_tokens").Int()), int(m.Get("usage.cache_read_input_tokens").Int())
	a.usage.Output = int(m.Get("usage.output_tokens").Int())
	c.messages = append(c.messages, json.RawMessage(`{"role":"assistant","content":[`+join(a.content)+`]}`))
	return a
}

// toolResults appends the results of the answer's tool calls, with a
// reminder after them, as Claude Code sends them.
func (c *ccConversation) toolResults(a ccAnswer, result string) {
	var blocks []string
	for _, id := range a.toolIDs {
		r, _ := json.Marshal(result)
		blocks = append(blocks, fmt.Sprintf(`{"tool_use_id":%q,"type":"tool_result","content":%s}`, id, r))
	}
	blocks = append(blocks, `{"type":"text","text":"<system-reminder>Keep going.</system-reminder>","cache_control":{"type":"ephemeral"}}`)
	c.messages = append(c.messages, json.RawMessage(`{"role":"user","content":[`+strings.Join(blocks, ",")+`]}`))
}

func join(rs []json.RawMessage) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = string(r)
	}
	return strings.Join(parts, ",")
}

// accumulateStream builds the Message a Messages event stream adds up to,
// as the SDKs do (tool input JSON kept as sent, so its key order too).
func accumulateStream(t *testing.T, raw []byte) []byte {
	t.Helper()
	var msg map[string]json.RawMessage
	var blocks []map[string]any
	var args []string
	for _, frame := range strings.Split(strings.TrimSpace(string(raw)), "\n\n") {
		name, data, _ := strings.Cut(frame, "\n")
		name, data = strings.TrimPrefix(name, "event: "), strings.TrimPrefix(data, "data: ")
		ev := gjson.Parse(data)
		switch name {
		case "message_start":
			_ = json.Unmarshal([]byte(ev.Get("message").Raw), &msg)
		case "content_block_start":
			var b map[string]any
			_ = json.Unmarshal([]byte(ev.Get("content_block").Raw), &b)
			blocks, args = append(blocks, b), append(args, "")
		case "content_block_delta":
			i, d := int(ev.Get("index").Int()), ev.Get("delta")
			switch d.Get("type").String() {
			case "text_delta":
				blocks[i]["text"] = blocks[i]["text"].(string) + d.Get("text").String()
			case "thinking_delta":
				blocks[i]["thinking"] = blocks[i]["thinking"].(string) + d.Get("thinking").String()
			case "signature_delta":
				blocks[i]["signature"] = d.Get("signature").String()
			case "input_json_delta":
				args[i] += d.Get("partial_json").String()
			}
		case "content_block_stop":
			if i := int(ev.Get("index").Int()); blocks[i]["type"] == "tool_use" {
				blocks[i]["input"] = json.RawMessage(args[i])
			}
		case "message_delta":
			msg["stop_reason"] = json.RawMessage(ev.Get("delta.stop_reason").Raw)
			msg["usage"] = json.RawMessage(ev.Get("usage").Raw)
		case "error":
			t.Fatalf("error event: %s", data)
		}
	}
	b, _ := json.Marshal(blocks)
	msg["content"] = b
	out, _ := json.Marshal(msg)
	return out
}

// A 20-turn Claude Code-shaped run through the full gateway over four
// replicas: every turn after the first is routed sticky, without the
// tokenizer, to the replica holding the conversation, with a prediction
// within a block of the cached tokens the replica reports; each turn reads
// the whole previous prompt from cache although the billing line changes
// on every request. The cached fraction is logged.
func TestMessagesClaudeCodeShapedRun(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 4})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)

	c := newCCConversation(gw.URL, "7f3e1c2a-5b4d-4e6f-8a9b-0c1d2e3f4a5b", "", words("harness", 1500))
	c.user("<system-reminder>"+words("context", 80)+"</system-reminder>", "Please use the Read tool on main.go")
	c.systemMessage("# Environment\n" + words("env", 120))
	const turns = 20
	var home string
	var prompt, cached, prev int
	for i := range turns {
		a := c.send(t, i%7 != 6) // now and then a non-streaming request, as Claude Code's retry sends
		rep, reason := a.header.Get("X-Warmpath-Replica"), a.header.Get("X-Warmpath-Reason")
		t.Logf("turn %2d: %s %-7s prompt %5d cached %5d predicted %5d stop %s", i+1, rep, reason, a.prompt(), a.usage.CacheRead, a.predicted(), a.stopReason)
		if i == 0 {
			home = rep
		} else {
			if rep != home || reason != scoring.ReasonSticky {
				t.Errorf("turn %d went to %s (%s); the conversation is on %s", i+1, rep, reason, home)
			}
			if d := a.predicted() - a.usage.CacheRead; d < -cfg.Routing.BlockSize || d > cfg.Routing.BlockSize {
				t.Errorf("turn %d predicted %d cached tokens; the replica reported %d", i+1, a.predicted(), a.usage.CacheRead)
			}
			if a.usage.CacheRead < prev-cfg.Routing.BlockSize {
				t.Errorf("turn %d read %d tokens from cache; the previous prompt had %d", i+1, a.usage.CacheRead, prev)
			}
		}
		prompt, cached, prev = prompt+a.prompt(), cached+a.usage.CacheRead, a.prompt()
		switch {
		case a.stopReason == "tool_use":
			c.toolResults(a, words(fmt.Sprint("out", i), 40))
		case i%2 == 0:
			c.user("<system-reminder>" + words(fmt.Sprint("todo", i), 10) + "</system-reminder>")
			c.user(fmt.Sprintf("Now use the Grep tool for item %d", i))
		default:
			c.user(fmt.Sprintf("Explain step %d: %s", i, words(fmt.Sprint("q", i), 12)))
		}
	}
	frac := float64(cached) / float64(prompt)
	t.Logf("%d Claude Code-shaped turns: cached %d of %d prompt tokens (%.1f%%)", turns, cached, prompt, 100*frac)
	if frac < 0.9 {
		t.Errorf("cached fraction %.3f; want above 0.9", frac)
	}
	if got := counter(t, gw.obs.reg, "warmpath_tokenizer_avoided_total", nil); got != turns-1 {
		t.Errorf("tokenizer avoided %v times; want every turn after the first (%d)", got, turns-1)
	}
	if got := counter(t, gw.obs.reg, "warmpath_cached_tokens_total", nil); int(got) != cached {
		t.Errorf("the gateway counted %v cached tokens; the answers said %d", got, cached)
	}
	// The miss attribution: the causes add up, and Claude Code's billing
	// line, which changes on every request, is no client prefix break
	// (the Messages front end keeps it out of the prompt).
	if by := uncachedBy(t, gw, ""); int(sum(by)) != prompt-cached || by[misses.CauseClientBreak] != 0 {
		t.Errorf("uncached tokens by cause %v (sum %v); want prompt − cached = %d, none a client prefix break", by, sum(by), prompt-cached)
	}
	// Every turn's body was read to its end: none counts as broken.
	if got := counter(t, gw.obs.reg, "warmpath_upstream_errors_total", nil); got != 0 {
		t.Errorf("%v upstream errors counted; want none", got)
	}
	if got := counter(t, gw.obs.reg, "warmpath_requests_total", map[string]string{"route": "messages", "code": "200"}); got != turns {
		t.Errorf("warmpath_requests_total{route=messages} = %v; want %d", got, turns)
	}
}

// A Claude Code sub-agent (same session id, its own agent id, its own
// system prompt) keeps a binding of its own: the main conversation's turns
// around it stay sticky, and nothing is rebound.
func TestMessagesSubAgentHasItsOwnSession(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)

	const run = "0d9c8b7a-6f5e-4d3c-2b1a-09f8e7d6c5b4"
	main := newCCConversation(gw.URL, run, "", words("harness", 800))
	sub := newCCConversation(gw.URL, run, "a1b2c3d4e5f6a7b8", words("explorer", 600))
	main.user("Find the bug in " + words("bug", 20))
	sub.user("Search for " + words("task", 20))
	var mainHome, subHome string
	for i := range 3 {
		m := main.send(t, true)
		s := sub.send(t, true)
		if i == 0 {
			mainHome, subHome = m.header.Get("X-Warmpath-Replica"), s.header.Get("X-Warmpath-Replica")
		} else {
			for who, a := range map[string]ccAnswer{"main": m, "sub-agent": s} {
				if a.header.Get("X-Warmpath-Reason") != scoring.ReasonSticky || a.usage.CacheRead < a.prompt()-100 {
					t.Errorf("%s turn %d: %s, cached %d of %d", who, i+1, a.header.Get("X-Warmpath-Reason"), a.usage.CacheRead, a.prompt())
				}
			}
			if m.header.Get("X-Warmpath-Replica") != mainHome || s.header.Get("X-Warmpath-Replica") != subHome {
				t.Errorf("turn %d moved: main %s (was %s), sub-agent %s (was %s)", i+1,
					m.header.Get("X-Warmpath-Replica"), mainHome, s.header.Get("X-Warmpath-Replica"), subHome)
			}
		}
		main.user(fmt.Sprintf("and then %d", i))
		sub.user(fmt.Sprintf("look further %d", i))
	}
	if got := counter(t, gw.obs.reg, "warmpath_session_rebinds_total", nil); got != 0 {
		t.Errorf("%v session rebinds; the sub-agent must not disturb the main conversation", got)
	}
}

// Tenancy on /v1/messages: x-api-key or bearer keys of the OpenAI routes,
// Anthropic's envelope for every refusal (bad key, a model outside the
// allow-list, the rate limit with its Retry-After), and count_tokens with
// the routing tokenizer agreeing with what the engine then prompts.
func TestMessagesTenancy(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := tenantConfig(sim)
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	key := newTenant(t, gw.URL, "coder", `,"limits":{"requests_per_minute":4},"models":["qwen3-32b"]`)

	post := func(path, body string, h map[string]string) (int, http.Header, gjson.Result) {
		req, _ := http.NewRequest(http.MethodPost, gw.URL+path, strings.NewReader(body))
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, gjson.ParseBytes(b)
	}
	body := `{"model":"qwen3-32b","max_tokens":8,"system":"Be brief.","messages":[{"role":"user","content":"` + words("hello", 50) + `"}]}`
	apiKey := map[string]string{"x-api-key": key, "anthropic-version": "2023-06-01"}

	code, _, n := post("/v1/messages/count_tokens", body, apiKey)
	if code != 200 || n.Get("input_tokens").Int() < 50 {
		t.Fatalf("count_tokens: %d %s", code, n.Raw)
	}
	code, _, m := post("/v1/messages", body, apiKey)
	if code != 200 || m.Get("type").String() != "message" {
		t.Fatalf("x-api-key: %d %s", code, m.Raw)
	}
	if got := m.Get("usage.input_tokens").Int() + m.Get("usage.cache_read_input_tokens").Int(); got != n.Get("input_tokens").Int() {
		t.Errorf("count_tokens said %d; the engine prompted %d", n.Get("input_tokens").Int(), got)
	}
	if code, _, m = post("/v1/messages", body, bearer(key)); code != 200 {
		t.Errorf("bearer: %d %s", code, m.Raw)
	}
	refusals := []struct {
		name   string
		body   string
		h      map[string]string
		status int
		typ    string
	}{
		{"bad key", body, map[string]string{"x-api-key": "sk-wp-nope"}, 401, "authentication_error"},
		{"no key", body, nil, 401, "authentication_error"},
		{"model outside the allow-list", strings.Replace(body, "qwen3-32b", "llama-70b", 1), apiKey, 403, "permission_error"},
	}
	for _, r := range refusals {
		code, _, e := post("/v1/messages", r.body, r.h)
		if code != r.status || e.Get("type").String() != "error" || e.Get("error.type").String() != r.typ {
			t.Errorf("%s: %d %s; want %d %s", r.name, code, e.Raw, r.status, r.typ)
		}
	}
	var limited bool
	for range 4 {
		code, h, e := post("/v1/messages", body, apiKey)
		if code == http.StatusTooManyRequests {
			limited = true
			if e.Get("error.type").String() != "rate_limit_error" || h.Get("Retry-After") == "" || h.Get("X-Ratelimit-Limit-Requests") != "4" {
				t.Errorf("429: %v %s", h, e.Raw)
			}
			break
		}
	}
	if !limited {
		t.Error("the tenant's rate limit never applied to /v1/messages")
	}
	// Accounted to the tenant as chat turns are.
	if got := counter(t, gw.obs.reg, "warmpath_prompt_tokens_total", map[string]string{"tenant": "coder"}); got < 3*float64(n.Get("input_tokens").Int()) {
		t.Errorf("warmpath_prompt_tokens_total{tenant=coder} = %v; want the three admitted turns' prompts", got)
	}
	if got := counter(t, gw.obs.reg, "warmpath_requests_total", map[string]string{"route": "messages", "code": "429"}); got != 1 {
		t.Errorf("warmpath_requests_total{route=messages,code=429} = %v; want 1", got)
	}
}

// A Messages stream whose replica dies mid-way ends with an error event
// (which the Anthropic SDKs raise), never with message_stop; a
// non-streaming request whose replica stalls gets an error status in
// Anthropic's envelope.
func TestMessagesUpstreamFailsMidStream(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1, Speed: 1, StreamInterval: 20 * time.Millisecond})
	cfg := fleetConfig(sim)
	cfg.Upstream = proxy.Config{IdleTimeout: 300 * time.Millisecond, HeaderTimeout: 300 * time.Millisecond}
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	body := `{"model":"qwen3-32b","max_tokens":400,"stream":%t,"messages":[{"role":"user","content":"` + words("cut", 30) + `"}]}`

	resp, err := http.Post(gw.URL+"/v1/messages", "application/json", strings.NewReader(fmt.Sprintf(body, true)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var names []string
	var last string
	for {
		line, err := br.ReadString('\n')
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "event: "); ok {
			names = append(names, name)
			if name == "content_block_delta" && slices.Index(names, "content_block_delta") == len(names)-1 {
				sim.Replicas()[0].SetFaults(vllmsim.Faults{Hang: true})
			}
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			last = data
		}
		if err != nil {
			break
		}
	}
	sim.Replicas()[0].SetFaults(vllmsim.Faults{})
	if names[len(names)-1] != "error" || slices.Contains(names, "message_stop") || gjson.Get(last, "error.type").String() != "api_error" {
		t.Fatalf("stream ended with %v, %s; want an api_error event and no message_stop", names[max(0, len(names)-3):], last)
	}

	// A replica that hangs before answering a non-streaming request: the
	// whole answer fails, with a 5xx in Anthropic's envelope. The request
	// must reach the replica: while its failed stream is its last word
	// (fleet.Replica.Failing), the queue holds requests for it, so first
	// a health check answers.
	rep := gw.fleet.Snapshot().Replicas[0]
	testrun.Eventually(t, 10*time.Second, func() bool { return rep.State().Healthy && !rep.Failing() }, "the replica answering again")
	sim.Replicas()[0].SetFaults(vllmsim.Faults{Hang: true})
	defer sim.Replicas()[0].SetFaults(vllmsim.Faults{})
	resp, err = http.Post(gw.URL+"/v1/messages", "application/json", strings.NewReader(fmt.Sprintf(body, false)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	e := gjson.ParseBytes(raw)
	t.Logf("hung replica, non-streaming: %d %s", resp.StatusCode, raw)
	if resp.StatusCode < 500 || e.Get("type").String() != "error" || !slices.Contains([]string{"api_error", "overloaded_error", "timeout_error"}, e.Get("error.type").String()) {
		t.Errorf("hung replica, non-streaming: %d %s; want a 5xx error envelope", resp.StatusCode, raw)
	}
}
