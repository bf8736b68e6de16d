package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
)

// FuzzToChat: any body is either refused with a 400 or translated into
// valid JSON, the same bytes every time, whose chat messages a following
// turn's begin with.
func FuzzToChat(f *testing.F) {
	for _, n := range []int{1, 2} {
		b, err := readTurnFile(n)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		`{"model":"m","max_tokens":5,"system":[{"type":"text","text":"x-anthropic-billing-header: a\nrest"}],"messages":[{"role":"user","content":"hi"},{"role":"system","content":"env"}]}`,
		`{"model":"m","max_tokens":5,"tools":[{"name":"A","input_schema":{"type":"object"}},{"type":"web_search_20250305","name":"w"}],"tool_choice":{"type":"tool","name":"w","disable_parallel_tool_use":true},
		  "messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"thinking","thinking":"t"},{"type":"tool_use","id":"1","name":"A","input":{"b":1,"a":2}}]},
		  {"role":"user","content":[{"type":"tool_result","tool_use_id":"1","is_error":true,"content":[{"type":"text","text":"e"},{"type":"image","source":{"type":"url","url":"u"}}]},{"type":"text","text":"go"}]}]}`,
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"content","content":[{"type":"text","text":"d"}]}},{"type":"search_result","source":"s","title":"t","content":[]}]}],"output_config":{"effort":"xhigh","format":{"type":"json_schema","schema":{}}}}`,
		`{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":"prefill"}],"stop_sequences":["a",""],"top_k":3}`,
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := parseRequest(body, false)
		if err != nil {
			must400(t, err)
			return
		}
		out, err := toChat(r)
		if err != nil {
			must400(t, err)
			return
		}
		if !json.Valid(out) {
			t.Fatalf("invalid chat body %s", out)
		}
		if again, _ := toChat(r); !bytes.Equal(again, out) {
			t.Fatal("the same request rendered differently")
		}
		msgs := gjson.GetBytes(out, "messages")
		if len(msgs.Array()) < len(r.Messages) {
			t.Fatalf("%d messages became %d chat messages", len(r.Messages), len(msgs.Array()))
		}
		r.Messages = append(r.Messages, message{Role: "user", Content: json.RawMessage(`"next"`)})
		next, err := toChat(r)
		if err != nil {
			t.Fatalf("appending a user message broke the translation: %v", err)
		}
		prefix := strings.TrimSuffix(msgs.Raw, "]")
		if !strings.HasPrefix(gjson.GetBytes(next, "messages").Raw, prefix+",") {
			t.Fatalf("the next turn's messages do not begin with this turn's")
		}
	})
}

func must400(t *testing.T, err error) {
	t.Helper()
	if he, ok := errors.AsType[*apierror.Error](err); !ok || he.Status != 400 || he.Msg == "" {
		t.Fatalf("error %v is not a 400 with a message", err)
	}
}

// FuzzTranslateStream: whatever the upstream sends, the client gets a
// well-formed event sequence (ending with message_stop or an error event)
// that the SDKs' accumulator can build a Message from.
func FuzzTranslateStream(f *testing.F) {
	tc := `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"R","arguments":"{\"a\":"}}]}}]}`
	for _, s := range []string{
		sse(roleChunk, text("Hello"), finish("stop", `,"stop_reason":"END"`), usageChunk, "[DONE]"),
		sse(`{"choices":[{"delta":{"reasoning_content":"hm"}}]}`, text("x"), tc, `{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]},"finish_reason":"tool_calls"}]}`, "[DONE]"),
		sse(text("a"), `{"error":{"message":"m","code":503}}`),
		sse(tc, `{"choices":[{"delta":{"tool_calls":[{"id":"d","function":{"name":"S"}},{"index":0,"function":{"arguments":"x"}}]}}]}`),
		"data: {\"choices\":[{\"delta\":{\"content\":\"cut",
		`{"choices":[{"message":{"content":"whole","tool_calls":[{"function":{"name":"T","arguments":"{}"}}]},"finish_reason":"length"}],"usage":{"prompt_tokens":3}}`,
	} {
		f.Add([]byte(s), strings.HasPrefix(s, "{"))
	}
	f.Fuzz(func(t *testing.T, body []byte, whole bool) {
		ct := "text/event-stream"
		if whole {
			ct = "application/json"
		}
		rec := &recorder{}
		tr := newTranslator(rec, "m", []string{"END"})
		if err := tr.start(); err != nil {
			t.Fatal(err)
		}
		if err := tr.run(upstream(ct, string(body))); err != nil {
			t.Fatalf("run: %v", err)
		}
		if err := checkSequence(rec.events); err != nil {
			t.Fatalf("%v: %s", err, rec.types())
		}
		acc := &accumulator{}
		for _, ev := range rec.events {
			if err := acc.send(ev); err != nil {
				t.Fatalf("accumulate %s: %v", ev.Type, err)
			}
		}
		for _, b := range acc.msg.Content {
			if b.Type == "tool_use" && !json.Valid(b.Input) {
				t.Fatalf("tool input %q is not JSON", b.Input)
			}
		}
		if _, err := chatapi.Marshal(acc.msg); err != nil {
			t.Fatal(err)
		}
	})
}
