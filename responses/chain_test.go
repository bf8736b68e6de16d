package responses

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/warmpath/warmpath/internal/redistest"
	"github.com/warmpath/warmpath/vllmsim"
)

// toolChain drives a tool-using chain of n turns through create, chaining
// each turn on the previous one with previous_response_id: odd turns ask
// for the tool in a user message (the simulator calls it), even turns send
// the function_call_output. It returns every response. create is the only
// dependency, so the driver moves to any package that can POST.
func toolChain(t testing.TB, n int, create func(body map[string]any) *Response) []*Response {
	t.Helper()
	var out []*Response
	prev := ""
	for i := range n {
		body := map[string]any{"tools": []any{weatherTool}, "instructions": "You are a weather assistant."}
		if prev != "" {
			body["previous_response_id"] = prev
		}
		if i%2 == 0 {
			body["input"] = fmt.Sprintf("Use the get_weather tool for city number %d.", i/2)
		} else {
			call := out[i-1].Output[len(out[i-1].Output)-1]
			if call.Type != ItemFunctionCall {
				t.Fatalf("turn %d: expected a function call, got %+v", i, out[i-1].Output)
			}
			body["input"] = []any{map[string]any{"type": "function_call_output", "call_id": call.CallID,
				"output": fmt.Sprintf(`{"temperature": %d, "sky": "clear"}`, 10+i)}}
		}
		r := create(body)
		if r.Status != StatusCompleted {
			t.Fatalf("turn %d: status %s error %+v", i, r.Status, r.Error)
		}
		out = append(out, r)
		prev = r.ID
	}
	return out
}

// messagesJSON returns the raw bytes of a chat body's messages array.
func messagesJSON(t testing.TB, body []byte) []byte {
	t.Helper()
	var b struct {
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatal(err)
	}
	return b.Messages
}

// assistantJSON renders a response's output the way chat completions
// carries an assistant turn, built here independently of renderItems.
func assistantJSON(r *Response) string {
	text, calls := "", ""
	for _, it := range r.Output {
		switch it.Type {
		case ItemMessage:
			text = it.Content[0].Text
		case ItemFunctionCall:
			if calls != "" {
				calls += ","
			}
			calls += fmt.Sprintf(`{"id":%s,"type":"function","function":{"name":%s,"arguments":%s}}`,
				jsonString(it.CallID), jsonString(it.Name), jsonString(it.Arguments))
		}
	}
	if calls == "" {
		return fmt.Sprintf(`{"role":"assistant","content":%s}`, jsonString(text))
	}
	return `{"role":"assistant","content":null,"tool_calls":[` + calls + `]}`
}

// TestChainRenderingIsPrefixStable proves item 4 of the design: over a
// 20-turn tool-using chain, turn N+1's upstream messages begin byte for
// byte with turn N's messages followed by turn N's assistant output, every
// turn carries the chain root as its session key, and the simulator's
// cached prefix grows turn after turn.
func TestChainRenderingIsPrefixStable(t *testing.T) {
	redistest.Each(t, testChainRenderingIsPrefixStable)
}

func testChainRenderingIsPrefixStable(t *testing.T, tp *redistest.Topology) {
	e := newEnv(t, tp, vllmsim.Config{Replicas: 2})
	rs := toolChain(t, 20, func(body map[string]any) *Response { return e.create(t, "acme", body) })
	turns := e.chat.recorded()
	if len(turns) != len(rs) {
		t.Fatalf("%d upstream turns for %d responses", len(turns), len(rs))
	}
	var cached, input int
	for i := range turns {
		if turns[i].Session != rs[0].ID {
			t.Fatalf("turn %d session %q; want the chain root %q", i, turns[i].Session, rs[0].ID)
		}
		if i == 0 {
			continue
		}
		prev, cur := messagesJSON(t, turns[i-1].Body), messagesJSON(t, turns[i].Body)
		want := append(append(bytes.TrimSuffix(prev, []byte("]")), ','), assistantJSON(rs[i-1])...)
		if !bytes.HasPrefix(cur, want) {
			t.Fatalf("turn %d messages do not extend turn %d:\n got %s\nwant prefix %s", i, i-1, cur, want)
		}
		u, pu := rs[i].Usage, rs[i-1].Usage
		if c := u.InputTokensDetails.CachedTokens; c <= pu.InputTokensDetails.CachedTokens || c < pu.InputTokens+pu.OutputTokens-1-16 || c >= u.InputTokens {
			t.Fatalf("turn %d cached %d of %d input; turn %d had %d input + %d output", i, c, u.InputTokens, i-1, pu.InputTokens, pu.OutputTokens)
		}
		cached += u.InputTokensDetails.CachedTokens
		input += u.InputTokens
	}
	t.Logf("turns 2..20: cached %d of %d input tokens (%.1f%%)", cached, input, 100*float64(cached)/float64(input))
}
