package responses

import (
	"encoding/json"
	"strings"

	"github.com/warmpath/warmpath/internal/chatapi"
)

// event is one Responses stream event. Only the fields of its Type are
// set; there is deliberately no Error field, so a normal event can never
// carry a top-level "error" key (openai-go fails a stream on one).
type event struct {
	Type           string    `json:"type"`
	SequenceNumber int       `json:"sequence_number"`
	Response       *Response `json:"response,omitempty"`
	OutputIndex    *int      `json:"output_index,omitempty"`
	ItemID         string    `json:"item_id,omitempty"`
	ContentIndex   *int      `json:"content_index,omitempty"`
	Item           *Item     `json:"item,omitempty"`
	Part           *Part     `json:"part,omitempty"`
	Delta          *string   `json:"delta,omitempty"`
	Text           *string   `json:"text,omitempty"`
	Name           string    `json:"name,omitempty"`
	Arguments      *string   `json:"arguments,omitempty"`
	// Logprobs is set on output_text delta and done events ([] when none).
	Logprobs json.RawMessage `json:"logprobs,omitempty"`
}

// emitFunc receives each event of a response in order, already numbered.
// The event is only valid during the call.
type emitFunc func(ev *event) error

// chatChunk is the part of a chat.completion.chunk the translator reads.
type chatChunk struct {
	Choices []struct {
		Delta struct {
			Content          *string `json:"content"`
			Reasoning        *string `json:"reasoning"`
			ReasoningContent *string `json:"reasoning_content"`
			Refusal          *string `json:"refusal"`
			ToolCalls        []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		Logprobs *struct {
			Content []json.RawMessage `json:"content"`
		} `json:"logprobs"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *chatUsage      `json:"usage"`
	Error json.RawMessage `json:"error"`
}

type chatUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

// toUsage maps chat usage onto Responses usage.
func (u *chatUsage) toUsage() *Usage {
	r := &Usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	if r.TotalTokens == 0 {
		r.TotalTokens = u.PromptTokens + u.CompletionTokens
	}
	if d := u.PromptTokensDetails; d != nil {
		r.InputTokensDetails.CachedTokens = d.CachedTokens
	}
	if d := u.CompletionTokensDetails; d != nil {
		r.OutputTokensDetails.ReasoningTokens = d.ReasoningTokens
	}
	return r
}

// Kinds of the output item being streamed.
const (
	openNone = iota
	openMessage
	openReasoning
	openCall
)

// builder turns chat chunks into the Responses event sequence and builds
// the Response as it goes. One builder serves one response; it is not safe
// for concurrent use.
type builder struct {
	resp       *Response
	emit       emitFunc
	seq        int
	namespaced map[string]bool // chat tool names that are namespace.name

	open     int
	idx      int // output index of the open item
	text     strings.Builder
	logprobs []json.RawMessage
	callIdx  int // chat tool_calls index of the open call
	finish   string
	usage    *Usage
}

func newBuilder(resp *Response, seq int, namespaced map[string]bool, emit emitFunc) *builder {
	return &builder{resp: resp, seq: seq, namespaced: namespaced, emit: emit, callIdx: -1}
}

func (b *builder) send(ev *event) error {
	ev.SequenceNumber = b.seq
	b.seq++
	return b.emit(ev)
}

func ptr[T any](v T) *T { return &v }

// begin sends response.created (unless the response was announced
// already, as a queued background one is) and response.in_progress.
func (b *builder) begin(created bool) error {
	b.resp.Status = StatusInProgress
	if !created {
		if err := b.send(&event{Type: "response.created", Response: b.resp}); err != nil {
			return err
		}
	}
	return b.send(&event{Type: "response.in_progress", Response: b.resp})
}

// chunk consumes one chat chunk.
func (b *builder) chunk(c *chatChunk) error {
	if c.Usage != nil {
		b.usage = c.Usage.toUsage()
	}
	for _, ch := range c.Choices {
		d := &ch.Delta
		if r := firstNonEmpty(d.Reasoning, d.ReasoningContent); r != "" {
			if err := b.reasoningDelta(r); err != nil {
				return err
			}
		}
		var lp []json.RawMessage
		if ch.Logprobs != nil {
			lp = ch.Logprobs.Content
		}
		if t := deref(d.Content); t != "" || len(lp) > 0 {
			if err := b.textDelta(t, lp); err != nil {
				return err
			}
		}
		for _, tc := range d.ToolCalls {
			if err := b.callDelta(tc.Index, tc.ID, tc.Function.Name, tc.Function.Arguments); err != nil {
				return err
			}
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			b.finish = *ch.FinishReason
		}
	}
	return nil
}

func firstNonEmpty(ps ...*string) string {
	for _, p := range ps {
		if p != nil && *p != "" {
			return *p
		}
	}
	return ""
}

func (b *builder) addItem(it Item) error {
	if err := b.closeOpen(StatusCompleted); err != nil {
		return err
	}
	b.resp.Output = append(b.resp.Output, it)
	b.idx = len(b.resp.Output) - 1
	b.text.Reset()
	b.logprobs = nil
	return b.send(&event{Type: "response.output_item.added", OutputIndex: ptr(b.idx), Item: &b.resp.Output[b.idx]})
}

func (b *builder) reasoningDelta(delta string) error {
	if b.open != openReasoning {
		if err := b.addItem(Item{Type: ItemReasoning, ID: newID(prefixReasoning), Status: StatusInProgress}); err != nil {
			return err
		}
		b.open = openReasoning
		if err := b.send(&event{Type: "response.content_part.added", ItemID: b.item().ID, OutputIndex: ptr(b.idx),
			ContentIndex: ptr(0), Part: &Part{Type: "reasoning_text"}}); err != nil {
			return err
		}
	}
	b.text.WriteString(delta)
	return b.send(&event{Type: "response.reasoning_text.delta", ItemID: b.item().ID, OutputIndex: ptr(b.idx),
		ContentIndex: ptr(0), Delta: &delta})
}

func (b *builder) textDelta(delta string, lp []json.RawMessage) error {
	if b.open != openMessage {
		if err := b.addItem(Item{Type: ItemMessage, ID: newID(prefixMessage), Status: StatusInProgress, Role: "assistant"}); err != nil {
			return err
		}
		b.open = openMessage
		if err := b.send(&event{Type: "response.content_part.added", ItemID: b.item().ID, OutputIndex: ptr(b.idx),
			ContentIndex: ptr(0), Part: &Part{Type: "output_text"}}); err != nil {
			return err
		}
	}
	b.text.WriteString(delta)
	b.logprobs = append(b.logprobs, lp...)
	if delta == "" {
		return nil
	}
	return b.send(&event{Type: "response.output_text.delta", ItemID: b.item().ID, OutputIndex: ptr(b.idx),
		ContentIndex: ptr(0), Delta: &delta, Logprobs: rawArray(lp)})
}

func (b *builder) callDelta(index int, id, name, args string) error {
	if b.open != openCall || index != b.callIdx {
		if id == "" {
			id = newID(prefixCall)
		}
		ns, fn := splitToolName(name, b.namespaced)
		it := Item{Type: ItemFunctionCall, ID: newID(prefixFunctionCall), Status: StatusInProgress, CallID: id, Name: fn, Namespace: ns}
		if err := b.addItem(it); err != nil {
			return err
		}
		b.open, b.callIdx = openCall, index
	}
	if args == "" {
		return nil
	}
	b.text.WriteString(args)
	return b.send(&event{Type: "response.function_call_arguments.delta", ItemID: b.item().ID, OutputIndex: ptr(b.idx), Delta: &args})
}

func (b *builder) item() *Item { return &b.resp.Output[b.idx] }

// closeOpen finishes the open item, if any, with its done events.
func (b *builder) closeOpen(status string) error {
	open := b.open
	b.open = openNone
	it := b.item
	switch open {
	case openNone:
		return nil
	case openMessage:
		text := b.text.String()
		lp := rawArray(b.logprobs)
		part := Part{Type: "output_text", Text: text, Logprobs: lp}
		it().Content, it().Status = []Part{part}, status
		if err := b.send(&event{Type: "response.output_text.done", ItemID: it().ID, OutputIndex: ptr(b.idx), ContentIndex: ptr(0), Text: &text, Logprobs: lp}); err != nil {
			return err
		}
		if err := b.send(&event{Type: "response.content_part.done", ItemID: it().ID, OutputIndex: ptr(b.idx), ContentIndex: ptr(0), Part: &part}); err != nil {
			return err
		}
	case openReasoning:
		text := b.text.String()
		part := Part{Type: "reasoning_text", Text: text}
		it().Content, it().Status = []Part{part}, status
		if err := b.send(&event{Type: "response.reasoning_text.done", ItemID: it().ID, OutputIndex: ptr(b.idx), ContentIndex: ptr(0), Text: &text}); err != nil {
			return err
		}
		if err := b.send(&event{Type: "response.content_part.done", ItemID: it().ID, OutputIndex: ptr(b.idx), ContentIndex: ptr(0), Part: &part}); err != nil {
			return err
		}
	case openCall:
		args := b.text.String()
		it().Arguments, it().Status = args, status
		name := chatToolName(it().Namespace, it().Name)
		if err := b.send(&event{Type: "response.function_call_arguments.done", ItemID: it().ID, OutputIndex: ptr(b.idx), Name: name, Arguments: &args}); err != nil {
			return err
		}
	}
	return b.send(&event{Type: "response.output_item.done", OutputIndex: ptr(b.idx), Item: it()})
}

func rawArray(lp []json.RawMessage) json.RawMessage {
	if len(lp) == 0 {
		return emptyArray
	}
	b, _ := chatapi.Marshal(lp)
	return b
}

// outcome is how the upstream stream ended, as the terminal status: the
// finish reason decides, and a stream without one failed.
func (b *builder) outcome() (status string, incomplete *Incomplete, failure *ResponseError) {
	switch b.finish {
	case "stop", "tool_calls", "function_call":
		return StatusCompleted, nil, nil
	case "length":
		return StatusIncomplete, &Incomplete{Reason: "max_output_tokens"}, nil
	case "content_filter":
		return StatusIncomplete, &Incomplete{Reason: "content_filter"}, nil
	case "":
		return StatusFailed, nil, &ResponseError{Code: "server_error", Message: "the model's stream ended without a finish reason"}
	}
	return StatusCompleted, nil, nil
}

// settle closes the open item and fills in the Response's final state,
// without sending the terminal event: the caller stores the response
// first, then calls terminate.
func (b *builder) settle(status string, incomplete *Incomplete, failure *ResponseError, now int64) error {
	itemStatus := StatusCompleted
	if status != StatusCompleted {
		itemStatus = StatusIncomplete
	}
	if err := b.closeOpen(itemStatus); err != nil {
		return err
	}
	r := b.resp
	r.Status, r.IncompleteDetails, r.Error = status, incomplete, failure
	if b.usage != nil {
		r.Usage = b.usage
	} else {
		r.Usage = &Usage{}
	}
	if status == StatusCompleted {
		r.CompletedAt = &now
	}
	return nil
}

// terminate sends the terminal event matching the response's status.
func (b *builder) terminate() error {
	typ := "response.completed"
	switch b.resp.Status {
	case StatusIncomplete:
		typ = "response.incomplete"
	case StatusFailed:
		typ = "response.failed"
	case StatusCancelled:
		return nil // there is no cancelled event; the stream just ends
	}
	return b.send(&event{Type: typ, Response: b.resp})
}
