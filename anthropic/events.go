package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/warmpath/warmpath/internal/chatapi"
)

// event is one Messages stream event; Type names it (and is repeated as
// the SSE event name). Each event type uses some fields.
type event struct {
	Type         string        `json:"type"`
	Message      *messageJSON  `json:"message,omitempty"`
	Index        *int          `json:"index,omitempty"`
	ContentBlock *contentBlock `json:"content_block,omitempty"`
	Delta        any           `json:"delta,omitempty"` // *delta, or *messageDelta for message_delta
	Usage        *usageJSON    `json:"usage,omitempty"`
	Error        *errorDetail  `json:"error,omitempty"`
}

// messageJSON is a Message object: the non-streaming answer, and the
// message of message_start.
type messageJSON struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []contentBlock `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        usageJSON      `json:"usage"`
}

// contentBlock is a text, thinking or tool_use block.
type contentBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text,omitempty"`
	Thinking  *string         `json:"thinking,omitempty"`
	Signature *string         `json:"signature,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
}

// delta is a content_block_delta's delta.
type delta struct {
	Type        string  `json:"type"` // text_delta, thinking_delta, signature_delta, input_json_delta
	Text        *string `json:"text,omitempty"`
	Thinking    *string `json:"thinking,omitempty"`
	Signature   *string `json:"signature,omitempty"`
	PartialJSON *string `json:"partial_json,omitempty"`
}

// messageDelta is message_delta's delta.
type messageDelta struct {
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
}

// usageJSON is Anthropic's usage: input_tokens excludes the cached
// prompt tokens, which are cache_read_input_tokens (vLLM caches
// automatically, so nothing is ever a cache write).
type usageJSON struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
}

func ptr[T any](v T) *T { return &v }

// sink receives the events of one answer, in order.
type sink interface {
	send(ev *event) error
}

// sseSink writes events to a client as text/event-stream, flushing each
// one, and writes a ping whenever the stream has been silent for its
// interval (a long prefill says nothing otherwise, and proxies cut idle
// connections). It is safe for use by the translator and its ping timer.
type sseSink struct {
	interval time.Duration // 0: no pings

	mu     sync.Mutex // guards the writes to sw, err, closed and timer
	sw     *chatapi.Writer
	err    error
	closed bool
	timer  *time.Timer
}

func newSSESink(sw *chatapi.Writer, interval time.Duration) *sseSink {
	s := &sseSink{sw: sw, interval: interval}
	if interval > 0 {
		s.timer = time.AfterFunc(interval, s.tick)
	}
	return s
}

var pingData = []byte(`{"type":"ping"}`)

func (s *sseSink) send(ev *event) error {
	data, err := chatapi.Marshal(ev)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errSinkClosed
	}
	s.write(ev.Type, data)
	if s.timer != nil {
		s.timer.Reset(s.interval)
	}
	return s.err
}

var errSinkClosed = errors.New("anthropic: stream closed")

// ping writes a ping now.
func (s *sseSink) ping() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.write("ping", pingData)
	}
	return s.err
}

func (s *sseSink) tick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.err != nil {
		return
	}
	s.write("ping", pingData)
	s.timer.Reset(s.interval)
}

// write writes one frame and flushes it; s.mu is held.
func (s *sseSink) write(name string, data []byte) {
	if s.err == nil {
		s.err = s.sw.Event(name, data)
	}
}

// close stops the pings; nothing is written after it returns.
func (s *sseSink) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
	}
}

// accumulator builds the non-streaming Message from the events, as the
// SDKs' stream accumulators do.
type accumulator struct {
	msg    messageJSON
	args   map[int]*strings.Builder // a tool_use block's input JSON so far, by index
	failed *failure                 // the error event, if the answer failed
}

// failure is a stream's error event with the HTTP status it stands for.
type failure struct {
	status int
	detail errorDetail
}

var errBadEvent = errors.New("anthropic: event out of order")

func (a *accumulator) send(ev *event) error {
	switch ev.Type {
	case "message_start":
		a.msg = *ev.Message
		a.msg.Content = []contentBlock{}
	case "content_block_start":
		a.msg.Content = append(a.msg.Content, *ev.ContentBlock)
	case "content_block_delta":
		d, ok := ev.Delta.(*delta)
		if !ok || ev.Index == nil {
			return errBadEvent
		}
		return a.delta(*ev.Index, d)
	case "content_block_stop":
		if ev.Index == nil || *ev.Index < 0 || *ev.Index >= len(a.msg.Content) {
			return errBadEvent
		}
		if b := &a.msg.Content[*ev.Index]; b.Type == "tool_use" {
			b.Input = toolInput(a.args[*ev.Index])
		}
	case "message_delta":
		md, ok := ev.Delta.(*messageDelta)
		if !ok || ev.Usage == nil {
			return errBadEvent
		}
		a.msg.StopReason, a.msg.StopSequence = &md.StopReason, md.StopSequence
		a.msg.Usage = *ev.Usage
	}
	return nil
}

func (a *accumulator) delta(i int, d *delta) error {
	if i < 0 || i >= len(a.msg.Content) {
		return errBadEvent
	}
	b := &a.msg.Content[i]
	switch {
	case d.Text != nil && b.Text != nil:
		*b.Text += *d.Text
	case d.Thinking != nil && b.Thinking != nil:
		*b.Thinking += *d.Thinking
	case d.Signature != nil:
		b.Signature = d.Signature
	case d.PartialJSON != nil:
		if a.args == nil {
			a.args = map[int]*strings.Builder{}
		}
		if a.args[i] == nil {
			a.args[i] = &strings.Builder{}
		}
		a.args[i].WriteString(*d.PartialJSON)
	}
	return nil
}

// toolInput is a tool call's input: its arguments when they are a JSON
// object, else {} (the client's tool then reports the missing input to
// the model, which is how a malformed call is best recovered).
func toolInput(sb *strings.Builder) json.RawMessage {
	if sb == nil {
		return json.RawMessage(`{}`)
	}
	raw := bytes.TrimSpace([]byte(sb.String()))
	if len(raw) == 0 || raw[0] != '{' || !json.Valid(raw) {
		return json.RawMessage(`{}`)
	}
	var b bytes.Buffer
	_ = json.Compact(&b, raw)
	return b.Bytes()
}
