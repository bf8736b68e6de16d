package anthropic

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// recorder is a sink that keeps every event.
type recorder struct{ events []*event }

func (r *recorder) send(ev *event) error { r.events = append(r.events, ev); return nil }

func (r *recorder) types() string {
	var ts []string
	for _, ev := range r.events {
		ts = append(ts, ev.Type)
	}
	return strings.Join(ts, " ")
}

// sse renders chat chunks (JSON texts) as a chat-completions stream.
func sse(chunks ...string) string {
	var b strings.Builder
	for _, c := range chunks {
		b.WriteString("data: " + c + "\n\n")
	}
	return b.String()
}

// upstream is a 200 answer of contentType; body is a string or an
// io.ReadCloser.
func upstream(contentType string, body any) *http.Response {
	rc, ok := body.(io.ReadCloser)
	if !ok {
		rc = io.NopCloser(strings.NewReader(body.(string)))
	}
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {contentType}}, Body: rc}
}

// translate runs a translator over body and checks the sequence the
// Anthropic SDKs require.
func translate(t *testing.T, contentType, body string, stops ...string) *recorder {
	t.Helper()
	rec := &recorder{}
	tr := newTranslator(rec, "m", stops)
	if err := tr.start(); err != nil {
		t.Fatal(err)
	}
	if err := tr.run(upstream(contentType, body)); err != nil {
		t.Fatalf("run: %v", err)
	}
	if err := checkSequence(rec.events); err != nil {
		t.Fatalf("%v\nevents: %s", err, rec.types())
	}
	return rec
}

// checkSequence checks the Messages event grammar: one message_start
// first; blocks started with dense indexes from 0, each delta addressing
// the open block with a delta of its kind, each stopped once; then
// message_delta and message_stop, or an error event last.
func checkSequence(evs []*event) error {
	if len(evs) == 0 || evs[0].Type != "message_start" || evs[0].Message == nil {
		return fmt.Errorf("the stream does not begin with message_start")
	}
	open, next, sawDelta := -1, 0, false
	kind := ""
	for i, ev := range evs[1:] {
		last := i == len(evs)-2
		switch ev.Type {
		case "content_block_start":
			if open >= 0 || ev.Index == nil || *ev.Index != next || ev.ContentBlock == nil || sawDelta {
				return fmt.Errorf("event %d: block start out of order", i+1)
			}
			open, kind = next, ev.ContentBlock.Type
			next++
		case "content_block_delta":
			d, ok := ev.Delta.(*delta)
			if !ok || ev.Index == nil || *ev.Index != open {
				return fmt.Errorf("event %d: delta for block %v while %d is open", i+1, ev.Index, open)
			}
			want := map[string]string{"text": "text_delta", "thinking": "thinking_delta", "tool_use": "input_json_delta"}[kind]
			if d.Type != want && (kind != "thinking" || d.Type != "signature_delta") {
				return fmt.Errorf("event %d: %s delta in a %s block", i+1, d.Type, kind)
			}
		case "content_block_stop":
			if ev.Index == nil || *ev.Index != open {
				return fmt.Errorf("event %d: stop for block %v while %d is open", i+1, ev.Index, open)
			}
			open = -1
		case "message_delta":
			md, ok := ev.Delta.(*messageDelta)
			if open >= 0 || sawDelta || !ok || md.StopReason == "" || ev.Usage == nil {
				return fmt.Errorf("event %d: bad message_delta", i+1)
			}
			sawDelta = true
		case "message_stop":
			if !sawDelta || !last {
				return fmt.Errorf("event %d: message_stop out of place", i+1)
			}
		case "error":
			if !last || ev.Error == nil || ev.Error.Type == "" || ev.Error.Message == "" {
				return fmt.Errorf("event %d: error event out of place", i+1)
			}
		default:
			return fmt.Errorf("event %d: unknown event %q", i+1, ev.Type)
		}
	}
	if l := evs[len(evs)-1].Type; l != "message_stop" && l != "error" {
		return fmt.Errorf("the stream ends with %s", l)
	}
	return nil
}

// accumulate builds the Message of a recorded sequence.
func accumulate(t *testing.T, evs []*event) messageJSON {
	t.Helper()
	acc := &accumulator{}
	for _, ev := range evs {
		if err := acc.send(ev); err != nil {
			t.Fatalf("accumulate %s: %v", ev.Type, err)
		}
	}
	return acc.msg
}

const (
	roleChunk  = `{"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`
	usageChunk = `{"id":"c1","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":64}}}`
)

func text(s string) string {
	b, _ := json.Marshal(s)
	return `{"choices":[{"index":0,"delta":{"content":` + string(b) + `},"finish_reason":null}]}`
}

func finish(reason string, extra string) string {
	return `{"choices":[{"index":0,"delta":{},"finish_reason":"` + reason + `"` + extra + `}]}`
}

func TestTranslateText(t *testing.T) {
	rec := translate(t, "text/event-stream", sse(roleChunk, text("Hello"), text(" world"), finish("stop", `,"stop_reason":null`), usageChunk, "[DONE]"))
	if got, want := rec.types(), "message_start content_block_start content_block_delta content_block_delta content_block_stop message_delta message_stop"; got != want {
		t.Fatalf("events %s\nwant %s", got, want)
	}
	msg := accumulate(t, rec.events)
	if *msg.Content[0].Text != "Hello world" || *msg.StopReason != "end_turn" || msg.StopSequence != nil {
		t.Errorf("message %+v", msg)
	}
	// Anthropic's input_tokens excludes the cached tokens.
	if want := (usageJSON{InputTokens: 36, CacheReadInputTokens: 64, OutputTokens: 7}); msg.Usage != want {
		t.Errorf("usage %+v; want %+v", msg.Usage, want)
	}
}

func TestTranslateThinkingThenText(t *testing.T) {
	rec := translate(t, "text/event-stream", sse(roleChunk,
		`{"choices":[{"index":0,"delta":{"reasoning_content":"Let me"}}]}`,
		`{"choices":[{"index":0,"delta":{"reasoning":" think."}}]}`,
		text("Answer."), finish("stop", ""), "[DONE]"))
	want := "message_start content_block_start content_block_delta content_block_delta content_block_delta content_block_stop " +
		"content_block_start content_block_delta content_block_stop message_delta message_stop"
	if got := rec.types(); got != want {
		t.Fatalf("events %s\nwant %s", got, want)
	}
	msg := accumulate(t, rec.events)
	th := msg.Content[0]
	if th.Type != "thinking" || *th.Thinking != "Let me think." || th.Signature == nil || *th.Signature == "" {
		t.Errorf("thinking block %+v", th)
	}
	if msg.Content[1].Type != "text" || *msg.Content[1].Text != "Answer." {
		t.Errorf("text block %+v", msg.Content[1])
	}
}

func TestTranslateToolCalls(t *testing.T) {
	tc := func(s string) string {
		return `{"choices":[{"index":0,"delta":{"tool_calls":[` + s + `]}}]}`
	}
	rec := translate(t, "text/event-stream", sse(roleChunk, text("Reading."),
		tc(`{"index":0,"id":"call_1","type":"function","function":{"name":"Read","arguments":""}}`),
		tc(`{"index":0,"function":{"arguments":"{\"path\":"}}`),
		tc(`{"index":0,"function":{"arguments":"\"a.go\"}"}}`),
		tc(`{"index":1,"id":"call_2","type":"function","function":{"name":"Glob","arguments":"{\"pattern\":\"*\"}"}}`),
		finish("tool_calls", ""), usageChunk, "[DONE]"))
	msg := accumulate(t, rec.events)
	if len(msg.Content) != 3 {
		t.Fatalf("content %+v", msg.Content)
	}
	for i, want := range []struct{ id, name, input string }{{"call_1", "Read", `{"path":"a.go"}`}, {"call_2", "Glob", `{"pattern":"*"}`}} {
		b := msg.Content[i+1]
		if b.Type != "tool_use" || b.ID != want.id || b.Name != want.name || string(b.Input) != want.input {
			t.Errorf("block %d = %+v (input %s); want %+v", i+1, b, b.Input, want)
		}
	}
	if *msg.StopReason != "tool_use" {
		t.Errorf("stop_reason %s", *msg.StopReason)
	}
	// The start event carries an empty input, as Anthropic's does.
	if cb := rec.events[4].ContentBlock; cb == nil || string(cb.Input) != `{}` {
		t.Errorf("tool_use start %+v", rec.events[4])
	}
}

func TestTranslateStopReasons(t *testing.T) {
	tests := []struct {
		finish, extra string
		stops         []string
		reason        string
		seq           string
	}{
		{"length", "", nil, "max_tokens", ""},
		{"stop", `,"stop_reason":"END"`, []string{"END"}, "stop_sequence", "END"},
		{"stop", `,"stop_reason":151645`, []string{"END"}, "end_turn", ""},
		{"stop", `,"stop_reason":"other"`, []string{"END"}, "end_turn", ""},
		{"content_filter", "", nil, "refusal", ""},
		{"abort", "", nil, "end_turn", ""},
	}
	for _, tt := range tests {
		rec := translate(t, "text/event-stream", sse(text("x"), finish(tt.finish, tt.extra), "[DONE]"), tt.stops...)
		msg := accumulate(t, rec.events)
		seq := ""
		if msg.StopSequence != nil {
			seq = *msg.StopSequence
		}
		if *msg.StopReason != tt.reason || seq != tt.seq {
			t.Errorf("finish %s%s: stop_reason %s, stop_sequence %q; want %s, %q", tt.finish, tt.extra, *msg.StopReason, seq, tt.reason, tt.seq)
		}
	}
}

func TestTranslateFailures(t *testing.T) {
	tests := []struct {
		name, body string
		status     int
		typ        string
	}{
		{"error chunk (the gateway's cut stream)", sse(text("par"), `{"error":{"message":"The upstream replica stopped","type":"server_error","param":null,"code":"upstream_error"}}`, "[DONE]"), 502, "api_error"},
		{"vLLM error chunk with an integer code", sse(text("par"), `{"error":{"message":"overloaded","type":"ServiceUnavailable","code":503}}`), 503, "overloaded_error"},
		{"stream ends without [DONE]", sse(text("par")), 502, "api_error"},
		{"event that is not JSON", sse(`{"choices":`), 502, "api_error"},
		{"interleaved tool arguments", sse(
			`{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"A","arguments":"{"}}]}}]}`,
			`{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"B","arguments":"{}"}}]}}]}`,
			`{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"}"}}]}}]}`, "[DONE]"), 502, "api_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			tr := newTranslator(rec, "m", nil)
			_ = tr.start()
			if err := tr.run(upstream("text/event-stream", tt.body)); err != nil {
				t.Fatal(err)
			}
			if err := checkSequence(rec.events); err != nil {
				t.Fatalf("%v: %s", err, rec.types())
			}
			last := rec.events[len(rec.events)-1]
			if last.Type != "error" || last.Error.Type != tt.typ || tr.failure == nil || tr.failure.status != tt.status {
				t.Errorf("last event %s %+v, failure %+v; want an error event %s (status %d)", last.Type, last.Error, tr.failure, tt.typ, tt.status)
			}
		})
	}
}

// A non-streaming chat completion (an upstream that ignored "stream")
// translates to the same Message.
func TestTranslateCompletion(t *testing.T) {
	body := `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Sure.","reasoning_content":"ok",
		"tool_calls":[{"id":"t1","type":"function","function":{"name":"Read","arguments":"{\"p\":1}"}}]},"finish_reason":"tool_calls"}],
		"usage":{"prompt_tokens":10,"completion_tokens":3,"prompt_tokens_details":null}}`
	rec := translate(t, "application/json", body)
	msg := accumulate(t, rec.events)
	if len(msg.Content) != 3 || msg.Content[0].Type != "thinking" || *msg.Content[1].Text != "Sure." || string(msg.Content[2].Input) != `{"p":1}` {
		t.Fatalf("content %+v", msg.Content)
	}
	if *msg.StopReason != "tool_use" || msg.Usage != (usageJSON{InputTokens: 10, OutputTokens: 3}) {
		t.Errorf("stop %s usage %+v", *msg.StopReason, msg.Usage)
	}
}

// Malformed tool arguments leave the input empty, so the client's tool
// reports it instead of the whole answer failing.
func TestToolInputMalformed(t *testing.T) {
	for _, args := range []string{`{"a":`, `[1]`, ``, `"x"`} {
		sb := &strings.Builder{}
		sb.WriteString(args)
		if got := string(toolInput(sb)); got != `{}` {
			t.Errorf("toolInput(%q) = %s; want {}", args, got)
		}
	}
	sb := &strings.Builder{}
	sb.WriteString(" {\"a\": [1, 2]} ")
	if got := string(toolInput(sb)); got != `{"a":[1,2]}` {
		t.Errorf("toolInput = %s", got)
	}
}

// eofReader reports whether its reader was read to the end.
type eofReader struct {
	io.Reader
	eof bool
}

func (r *eofReader) Read(p []byte) (int, error) {
	n, err := r.Reader.Read(p)
	r.eof = r.eof || err == io.EOF
	return n, err
}

func (r *eofReader) Close() error { return nil }

// The body is read to its end after [DONE], so the routed client counts
// the turn as complete (its usage remembered, the replica not blamed).
func TestTranslateReadsToEOF(t *testing.T) {
	body := &eofReader{Reader: strings.NewReader(sse(text("a"), finish("stop", ""), usageChunk, "[DONE]"))}
	tr := newTranslator(&recorder{}, "m", nil)
	_ = tr.start()
	if err := tr.run(upstream("text/event-stream", body)); err != nil || !body.eof {
		t.Fatalf("run = %v; body read to EOF: %v", err, body.eof)
	}
}
