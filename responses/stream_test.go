package responses

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/warmpath/warmpath/internal/chatapi"
)

// sse renders chat chunks as an upstream stream would.
func sse(chunks ...string) string {
	var b strings.Builder
	for _, c := range chunks {
		b.WriteString("data: " + c + "\n\n")
	}
	return b.String()
}

// runStream feeds an upstream SSE body through consume and a builder, and
// settles the response like finish does (without storing).
func runStream(t *testing.T, body string, namespaced map[string]bool) (*Response, []event) {
	t.Helper()
	resp := &Response{ID: "resp_x", Object: "response", Output: []Item{}}
	var evs []event
	b := newBuilder(resp, 0, namespaced, func(ev *event) error {
		data, err := chatapi.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		var cp event
		if err := json.Unmarshal(data, &cp); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, cp)
		return nil
	})
	if err := b.begin(false); err != nil {
		t.Fatal(err)
	}
	failure, err := consume(context.Background(), strings.NewReader(body), b)
	if err != nil {
		t.Fatal(err)
	}
	status, inc, f := b.outcome()
	if failure != nil {
		status, inc, f = StatusFailed, nil, failure
	}
	if err := b.settle(status, inc, f, 1); err != nil {
		t.Fatal(err)
	}
	if err := b.terminate(); err != nil {
		t.Fatal(err)
	}
	for i, ev := range evs {
		if ev.SequenceNumber != i {
			t.Fatalf("event %d (%s) has sequence_number %d", i, ev.Type, ev.SequenceNumber)
		}
	}
	return resp, evs
}

func eventTypes(evs []event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

const usageChunk = `{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":20,"total_tokens":120,"prompt_tokens_details":{"cached_tokens":64},"completion_tokens_details":{"reasoning_tokens":7}}}`

func TestStreamReasoningThenText(t *testing.T) {
	body := sse(
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"choices":[{"index":0,"delta":{"reasoning":"think "}}]}`,
		`{"choices":[{"index":0,"delta":{"reasoning_content":"more"}}]}`,
		`{"choices":[{"index":0,"delta":{"content":"Hi"}}]}`,
		`{"choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"stop"}]}`,
		usageChunk, "[DONE]")
	resp, evs := runStream(t, body, nil)
	want := []string{"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added", "response.reasoning_text.delta", "response.reasoning_text.delta",
		"response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	if got := eventTypes(evs); !slices.Equal(got, want) {
		t.Fatalf("events:\n%v\nwant\n%v", got, want)
	}
	if len(resp.Output) != 2 || resp.Output[0].Type != ItemReasoning || resp.Output[0].Content[0].Text != "think more" ||
		resp.Output[1].Content[0].Text != "Hi there" || *evs[9].OutputIndex != 1 {
		t.Fatalf("output = %+v", resp.Output)
	}
	u := resp.Usage
	if u.InputTokens != 100 || u.InputTokensDetails.CachedTokens != 64 || u.OutputTokens != 20 || u.OutputTokensDetails.ReasoningTokens != 7 || u.TotalTokens != 120 {
		t.Fatalf("usage = %+v", u)
	}
	// Reasoning is stored but not sent upstream again.
	msgs, err := renderItems(resp.Output)
	if err != nil || len(msgs) != 1 || string(msgs[0]) != `{"role":"assistant","content":"Hi there"}` {
		t.Fatalf("rendered output = %s, %v", msgs, err)
	}
}

func TestStreamTextThenParallelCalls(t *testing.T) {
	body := sse(
		`{"choices":[{"index":0,"delta":{"content":"Checking."}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"fs.read","arguments":"{}"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		usageChunk)
	resp, evs := runStream(t, body, map[string]bool{"fs.read": true})
	if len(resp.Output) != 3 {
		t.Fatalf("output = %+v", resp.Output)
	}
	a, b := resp.Output[1], resp.Output[2]
	if a.CallID != "call_a" || a.Arguments != `{"city":"Paris"}` || b.CallID != "call_b" || b.Name != "read" || b.Namespace != "fs" || b.Status != StatusCompleted {
		t.Fatalf("calls = %+v, %+v", a, b)
	}
	var deltas []string
	for _, ev := range evs {
		if ev.Type == "response.function_call_arguments.delta" {
			deltas = append(deltas, *ev.Delta)
		}
		if ev.Type == "response.function_call_arguments.done" && *ev.OutputIndex == 2 && ev.Name != "fs.read" {
			t.Fatalf("done event name %q", ev.Name)
		}
	}
	if strings.Join(deltas, "|") != `{"city":|"Paris"}|{}` {
		t.Fatalf("argument deltas = %q", deltas)
	}
	// Text and calls of one upstream message render back as one message.
	msgs, _ := renderItems(resp.Output)
	want := `{"role":"assistant","content":"Checking.","tool_calls":[{"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},{"id":"call_b","type":"function","function":{"name":"fs.read","arguments":"{}"}}]}`
	if len(msgs) != 1 || string(msgs[0]) != want {
		t.Fatalf("rendered = %s\nwant %s", msgs, want)
	}
}

func TestStreamTerminalStates(t *testing.T) {
	cases := []struct {
		name, body, status, last string
		reason                   string
	}{
		{"length", sse(`{"choices":[{"index":0,"delta":{"content":"cut"},"finish_reason":"length"}]}`, usageChunk, "[DONE]"),
			StatusIncomplete, "response.incomplete", "max_output_tokens"},
		{"content_filter", sse(`{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"content_filter"}]}`, "[DONE]"),
			StatusIncomplete, "response.incomplete", "content_filter"},
		{"no finish reason", sse(`{"choices":[{"index":0,"delta":{"content":"x"}}]}`), StatusFailed, "response.failed", ""},
		{"mid-stream error", sse(`{"choices":[{"index":0,"delta":{"content":"x"}}]}`, `{"error":{"message":"engine died","type":"InternalServerError","code":500}}`, "[DONE]"),
			StatusFailed, "response.failed", ""},
		{"garbage chunk", sse(`{"choices":[`), StatusFailed, "response.failed", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, evs := runStream(t, c.body, nil)
			last := evs[len(evs)-1]
			if resp.Status != c.status || last.Type != c.last || last.Response.Status != c.status {
				t.Fatalf("status %s, last event %s", resp.Status, last.Type)
			}
			if c.reason != "" && (resp.IncompleteDetails == nil || resp.IncompleteDetails.Reason != c.reason) {
				t.Fatalf("incomplete_details = %+v", resp.IncompleteDetails)
			}
			if c.status == StatusFailed && (resp.Error == nil || resp.Error.Code != "server_error" || resp.Error.Message == "") {
				t.Fatalf("error = %+v", resp.Error)
			}
			if c.status != StatusCompleted && len(resp.Output) > 0 && resp.Output[0].Status != StatusIncomplete {
				t.Fatalf("open item status = %q; want incomplete", resp.Output[0].Status)
			}
			if resp.Usage == nil || resp.CompletedAt != nil {
				t.Fatalf("usage %v completed_at %v", resp.Usage, resp.CompletedAt)
			}
		})
	}
}
