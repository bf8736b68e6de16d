package anthropic

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/internal/chatapi"
)

// eventTooLarge is what a client hears of an upstream event (or a
// non-streaming body) over chatapi.MaxEventBytes.
const eventTooLarge = "anthropic: upstream event exceeds 8 MiB"

// translator turns one chat completion (stream chunks, or a whole
// completion) into the Messages event sequence: message_start; for each
// run of reasoning, text or one tool call a content block (start, deltas,
// stop) with dense indexes from 0; message_delta with the stop reason and
// the cumulative usage; message_stop. An upstream error, or a stream that
// ends early, ends the sequence with an error event instead.
type translator struct {
	out   sink
	id    string
	model string
	stops []string // the request's stop sequences

	next     int    // index of the next block
	open     int    // index of the open block, -1 for none
	kind     string // the open block's type
	thinking *xxhash.Digest
	tools    map[int]int // chat tool-call index → block index
	sawTool  bool

	finish  string  // finish_reason
	stopStr *string // vLLM's stop_reason when it is a string
	usage   usageJSON
	done    bool
	failure *failure
}

func newTranslator(out sink, model string, stops []string) *translator {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return &translator{out: out, id: "msg_" + hex.EncodeToString(b[:]), model: model, stops: stops, open: -1, tools: map[int]int{}}
}

// start sends message_start, before anything is known of the answer:
// usage comes with message_delta (the SDKs and Claude Code take it from
// there).
func (t *translator) start() error {
	return t.out.send(&event{Type: "message_start", Message: &messageJSON{
		ID: t.id, Type: "message", Role: "assistant", Model: t.model, Content: []contentBlock{}}})
}

// run translates resp's body: a stream of chat.completion.chunk events,
// or one chat.completion object. It returns nil once message_stop or an
// error event has been sent, or the sink's error.
func (t *translator) run(resp *http.Response) error {
	if !isEventStream(resp.Header.Get("Content-Type")) {
		body, err := io.ReadAll(io.LimitReader(resp.Body, chatapi.MaxEventBytes+1))
		switch {
		case err != nil:
			return t.fail(http.StatusBadGateway, "reading the upstream answer: "+err.Error())
		case len(body) > chatapi.MaxEventBytes:
			return t.fail(http.StatusBadGateway, eventTooLarge)
		}
		if err := t.chunk(body); err != nil || t.done {
			return err
		}
		return t.end()
	}
	er := chatapi.NewReader(resp.Body)
	for !t.done {
		data, err := er.Next()
		switch {
		case errors.Is(err, chatapi.ErrDone):
			if err := t.end(); err != nil {
				return err
			}
			// Read on to the end, so the routed client sees the body
			// complete (and counts the turn as such) rather than closed
			// early. Nothing follows [DONE], and vLLM closes the stream
			// right after it; the gateway's idle timeout bounds one that
			// does not.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, chatapi.MaxEventBytes))
			return nil
		case errors.Is(err, io.EOF):
			return t.fail(http.StatusBadGateway, "the upstream stream ended before the answer was complete")
		case errors.Is(err, chatapi.ErrEventTooLarge):
			return t.fail(http.StatusBadGateway, "reading the upstream stream: "+eventTooLarge)
		case err != nil:
			return t.fail(http.StatusBadGateway, "reading the upstream stream: "+err.Error())
		}
		if err := t.chunk(data); err != nil {
			return err
		}
	}
	return nil
}

func isEventStream(ct string) bool { return strings.HasPrefix(ct, "text/event-stream") }

// chunk translates one chunk (or a whole completion: its choice has a
// message instead of a delta).
func (t *translator) chunk(data []byte) error {
	if !gjson.ValidBytes(data) {
		return t.fail(http.StatusBadGateway, "the upstream sent an event that is not JSON")
	}
	root := gjson.ParseBytes(data)
	if e := root.Get("error"); e.IsObject() {
		status, detail := streamError(data)
		return t.failWith(status, detail)
	}
	if u := root.Get("usage"); u.IsObject() {
		cached := int(u.Get("prompt_tokens_details.cached_tokens").Int())
		t.usage = usageJSON{InputTokens: max(0, int(u.Get("prompt_tokens").Int())-cached),
			CacheReadInputTokens: max(0, cached), OutputTokens: int(u.Get("completion_tokens").Int())}
	}
	c := root.Get("choices.0")
	if !c.Exists() {
		return nil
	}
	d := c.Get("delta")
	if !d.Exists() {
		d = c.Get("message")
	}
	if err := t.content(d); err != nil {
		return err
	}
	if f := c.Get("finish_reason"); f.Type == gjson.String {
		t.finish = f.String()
	}
	if s := c.Get("stop_reason"); s.Type == gjson.String {
		t.stopStr = ptr(s.String())
	}
	return nil
}

// content translates a delta's (or message's) reasoning, text and tool
// calls, in that order.
func (t *translator) content(d gjson.Result) error {
	reasoning := d.Get("reasoning_content")
	if reasoning.Type != gjson.String {
		reasoning = d.Get("reasoning")
	}
	if s := reasoning.String(); reasoning.Type == gjson.String && s != "" {
		if err := t.blockDelta("thinking", &delta{Type: "thinking_delta", Thinking: &s}); err != nil {
			return err
		}
		t.thinking.WriteString(s)
	}
	if s := d.Get("content"); s.Type == gjson.String && s.String() != "" {
		text := s.String()
		if err := t.blockDelta("text", &delta{Type: "text_delta", Text: &text}); err != nil {
			return err
		}
	}
	var err error
	d.Get("tool_calls").ForEach(func(k, tc gjson.Result) bool {
		err = t.toolDelta(int(k.Int()), tc)
		return err == nil && !t.done
	})
	return err
}

// blockDelta sends a delta to the open block of kind, opening one (and
// closing the one before) when the kind changes.
func (t *translator) blockDelta(kind string, d *delta) error {
	if t.kind != kind || t.open < 0 {
		if err := t.closeBlock(); err != nil {
			return err
		}
		cb := &contentBlock{Type: kind}
		if kind == "text" {
			cb.Text = ptr("")
		} else {
			cb.Thinking, cb.Signature = ptr(""), ptr("")
			t.thinking = xxhash.New()
		}
		if err := t.openBlock(kind, cb); err != nil {
			return err
		}
	}
	return t.out.send(&event{Type: "content_block_delta", Index: ptr(t.open), Delta: d})
}

// toolDelta handles one tool_calls entry (pos is its place in the array,
// the index when the entry has none): the first entry of a call opens a
// tool_use block, its arguments become input_json_delta.
func (t *translator) toolDelta(pos int, tc gjson.Result) error {
	k := pos
	if i := tc.Get("index"); i.Type == gjson.Number {
		k = int(i.Int())
	}
	bi, seen := t.tools[k]
	if !seen {
		if err := t.closeBlock(); err != nil {
			return err
		}
		id := tc.Get("id").String()
		if id == "" {
			id = "toolu_" + t.id[len("msg_"):] + "_" + strconv.Itoa(k)
		}
		if err := t.openBlock("tool_use", &contentBlock{Type: "tool_use", ID: id, Name: tc.Get("function.name").String(), Input: []byte(`{}`)}); err != nil {
			return err
		}
		bi = t.open
		t.tools[k] = bi
		t.sawTool = true
	}
	args := tc.Get("function.arguments").String()
	if args == "" {
		return nil
	}
	if bi != t.open {
		return t.fail(http.StatusBadGateway, fmt.Sprintf("the upstream interleaved the arguments of tool call %d with a later one", k))
	}
	return t.out.send(&event{Type: "content_block_delta", Index: ptr(bi), Delta: &delta{Type: "input_json_delta", PartialJSON: &args}})
}

func (t *translator) openBlock(kind string, cb *contentBlock) error {
	t.open, t.kind = t.next, kind
	t.next++
	return t.out.send(&event{Type: "content_block_start", Index: ptr(t.open), ContentBlock: cb})
}

// closeBlock stops the open block; a thinking block gets its signature
// first (a digest of its text: the engine signs nothing, and clients only
// echo it back, which the translation drops).
func (t *translator) closeBlock() error {
	if t.open < 0 {
		return nil
	}
	if t.kind == "thinking" {
		sig := strconv.FormatUint(t.thinking.Sum64(), 16)
		if err := t.out.send(&event{Type: "content_block_delta", Index: ptr(t.open), Delta: &delta{Type: "signature_delta", Signature: &sig}}); err != nil {
			return err
		}
	}
	i := t.open
	t.open, t.kind = -1, ""
	return t.out.send(&event{Type: "content_block_stop", Index: ptr(i)})
}

// end closes the open block and sends message_delta and message_stop.
func (t *translator) end() error {
	if err := t.closeBlock(); err != nil {
		return err
	}
	reason, seq := t.stopReason()
	u := t.usage
	if err := t.out.send(&event{Type: "message_delta", Delta: &messageDelta{StopReason: reason, StopSequence: seq}, Usage: &u}); err != nil {
		return err
	}
	t.done = true
	return t.out.send(&event{Type: "message_stop"})
}

// stopReason maps finish_reason: length → max_tokens, tool_calls (or any
// tool call) → tool_use, content_filter → refusal, a matched stop string
// → stop_sequence, else end_turn.
func (t *translator) stopReason() (string, *string) {
	switch {
	case t.finish == "length":
		return "max_tokens", nil
	case t.finish == "tool_calls" || t.sawTool:
		return "tool_use", nil
	case t.finish == "content_filter":
		return "refusal", nil
	case t.stopStr != nil && slices.Contains(t.stops, *t.stopStr):
		return "stop_sequence", t.stopStr
	}
	return "end_turn", nil
}

// fail ends the answer with an error event of the type for status.
func (t *translator) fail(status int, msg string) error {
	return t.failWith(status, errorDetail{Type: errorType(status), Message: msg})
}

func (t *translator) failWith(status int, d errorDetail) error {
	t.done = true
	t.failure = &failure{status: status, detail: d}
	if err := t.out.send(&event{Type: "error", Error: &d}); err != nil {
		return err
	}
	return nil
}
