package responses

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
)

var translateSeeds = []string{
	`{"model":"m","input":"hello"}`,
	`{"model":"m","instructions":"be brief","input":[{"role":"user","content":"hi"}]}`,
	`{"model":"m","input":[{"role":"system","content":"s"},{"role":"developer","content":"d"},{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"data:image/png;base64,AA==","detail":"low"}]}]}`,
	`{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"q"}]},{"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[{"type":"output_text","text":"a","annotations":[]}]}]}`,
	`{"model":"m","input":[{"type":"function_call","id":"fc_1","call_id":"call_1","name":"f","arguments":"{\"a\":1}","status":"completed"},{"type":"function_call_output","call_id":"call_1","output":"ok"}]}`,
	`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":{"x":[1,2]}},{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]}]}`,
	`{"model":"m","input":[{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"s"}],"encrypted_content":"xyz"},{"role":"user","content":"go"}]}`,
	`{"model":"m","input":[{"type":"item_reference","id":"msg_9"},{"id":"msg_8"},{"role":"user","content":"next"}]}`,
	`{"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":{"type":"object"},"strict":true},{"type":"namespace","name":"ns","tools":[{"type":"function","name":"g","parameters":null}]},{"type":"web_search"}],"tool_choice":"required","parallel_tool_calls":false}`,
	`{"model":"m","input":"x","tools":[{"type":"function","name":"f"},{"type":"function","name":"g"}],"tool_choice":{"type":"allowed_tools","mode":"auto","tools":[{"type":"function","name":"g"}]}}`,
	`{"model":"m","input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"f"}}`,
	`{"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"out","schema":{"type":"object"},"strict":true}}}`,
	`{"model":"m","input":"x","text":{"format":{"type":"json_object"}},"reasoning":{"effort":"minimal","summary":"auto"}}`,
	`{"model":"m","input":"x","text":{},"temperature":0.5,"top_p":0.9,"max_output_tokens":64,"top_logprobs":2,"include":["message.output_text.logprobs"],"metadata":{"a":"b"}}`,
	`{"model":"m","input":"x","store":false,"stream":true,"prompt_cache_key":"k","include":["reasoning.encrypted_content"],"client_metadata":{"a":1}}`,
	`{"model":"m","conversation":{"id":"conv_1"},"input":"x"}`,
	`{"model":"m","previous_response_id":"resp_1","input":[{"type":"function_call_output","call_id":"c","output":"r"}]}`,
	`{"model":"m","input":[{"type":"web_search_call"}]}`,
	`{"model":"m","input":"x","tools":[{"type":"file_search"}]}`,
	`{"model":"m","input":[{"role":"user","content":null}]}`,
	`{"model":"m","input":{"role":"user"}}`,
	`[1,2]`,
	``,
}

// FuzzTranslate feeds arbitrary CreateResponse bodies through parsing,
// input rendering and chat-body assembly: whatever is accepted must
// translate without panicking into a valid chat body whose items
// round-trip through storage; whatever is rejected must be a 400 in
// OpenAI's envelope.
func FuzzTranslate(f *testing.F) {
	for _, s := range translateSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := parseCreate(body)
		if err != nil {
			checkRejection(t, err)
			return
		}
		items := make([]Item, 0, len(p.input))
		for _, it := range p.input {
			if it.Type == itemReference { // resolved against the store in a real turn
				it = Item{Type: ItemMessage, ID: it.ID, Role: "assistant", Content: []Part{{Type: "output_text", Text: "ref"}}}
			}
			items = append(items, it)
		}
		assignIDs(items)
		msgs, err := renderItems(items)
		if err != nil {
			checkRejection(t, err)
			return
		}
		b, err := chatBody(p, msgs)
		if err != nil {
			checkRejection(t, err)
			return
		}
		var chat struct {
			Model    string            `json:"model"`
			Messages []json.RawMessage `json:"messages"`
			Stream   bool              `json:"stream"`
		}
		if err := json.Unmarshal(b, &chat); err != nil || chat.Model != p.model || len(chat.Messages) == 0 || !chat.Stream {
			t.Fatalf("chat body invalid (%v): %s", err, b)
		}
		for _, it := range items {
			j, err := chatapi.Marshal(it)
			if err != nil {
				t.Fatalf("marshal %+v: %v", it, err)
			}
			back, err := decodeItem(j)
			if err != nil {
				t.Fatalf("stored item does not decode: %v: %s", err, j)
			}
			j2, _ := chatapi.Marshal(back)
			if !bytes.Equal(j, j2) {
				t.Fatalf("item round trip differs:\n%s\n%s", j, j2)
			}
		}
	})
}

func checkRejection(t *testing.T, err error) {
	t.Helper()
	he, ok := errors.AsType[*apierror.Error](err)
	if !ok || he.Status != 400 || he.Type != apierror.TypeInvalidRequest || he.Msg == "" {
		t.Fatalf("rejection is not a 400 invalid_request_error: %#v", err)
	}
	var env apierror.Envelope
	if json.Unmarshal(he.Marshal(), &env) != nil || env.Error.Message == "" {
		t.Fatalf("rejection envelope: %s", he.Marshal())
	}
}

// FuzzChatStream feeds arbitrary upstream stream bytes through the event
// builder: no panic, every event valid JSON numbered in order, and a
// terminal status always decided.
func FuzzChatStream(f *testing.F) {
	f.Add([]byte(sse(`{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}`, usageChunk, "[DONE]")))
	f.Add([]byte(sse(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"ns.f","arguments":"{"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":3,"function":{"arguments":"}"}}]},"finish_reason":"tool_calls"}]}`)))
	f.Add([]byte(sse(`{"choices":[{"index":0,"delta":{"reasoning":"r"}}]}`, `{"error":{"message":"x","code":500}}`)))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"\\u0000\"},\"logprobs\":{\"content\":[{\"token\":\"a\"}]}}]}\n\nevent: x\n: comment\ndata: [DONE]\n\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		resp := &Response{ID: "resp_f", Object: "response", Output: []Item{}}
		seq := 0
		b := newBuilder(resp, 0, map[string]bool{"ns.f": true}, func(ev *event) error {
			data, err := chatapi.Marshal(ev)
			if err != nil || !json.Valid(data) || ev.SequenceNumber != seq {
				t.Fatalf("event %d invalid (%v): %s", seq, err, data)
			}
			var top map[string]json.RawMessage
			if json.Unmarshal(data, &top) != nil {
				t.Fatalf("event is not an object: %s", data)
			}
			if _, ok := top["error"]; ok {
				t.Fatalf("an event carries a top-level error key: %s", data)
			}
			seq++
			return nil
		})
		if err := b.begin(false); err != nil {
			t.Fatal(err)
		}
		failure, err := consume(context.Background(), bytes.NewReader(body), b)
		if err != nil {
			t.Fatal(err)
		}
		status, inc, fe := b.outcome()
		if failure != nil {
			status, inc, fe = StatusFailed, nil, failure
		}
		if err := b.settle(status, inc, fe, 0); err != nil {
			t.Fatal(err)
		}
		if err := b.terminate(); err != nil {
			t.Fatal(err)
		}
		if !terminal(resp.Status) {
			t.Fatalf("status %q is not terminal", resp.Status)
		}
		if _, err := renderItems(resp.Output); err != nil {
			t.Fatalf("output does not render: %v", err)
		}
	})
}
