package vllmsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/warmpath/warmpath/tokenizer/simtok"
)

// samplingRequest holds the request fields shared by chat and completions.
type samplingRequest struct {
	Model               string          `json:"model"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	MinTokens           int             `json:"min_tokens"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	Stop                json.RawMessage `json:"stop"`
	N                   *int            `json:"n"`
	CacheSalt           json.RawMessage `json:"cache_salt"`
	Priority            int             `json:"priority"`
	SessionID           string          `json:"session_id"`
	ReturnTokenIDs      bool            `json:"return_token_ids"`
}

type streamOptions struct {
	IncludeUsage *bool `json:"include_usage"`
}

type chatRequest struct {
	samplingRequest
	Messages             []Message       `json:"messages"`
	Tools                []Tool          `json:"tools"`
	ToolChoice           json.RawMessage `json:"tool_choice"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
}

type completionRequest struct {
	samplingRequest
	Prompt json.RawMessage `json:"prompt"`
}

// job is a validated request ready for the engine.
type job struct {
	id           string
	created      int64
	s            *seq
	eng          *engine // the data-parallel rank serving it
	rank         int
	prompt       []uint32
	stream       bool
	includeUsage bool
	returnIDs    bool
	extra        time.Duration // injected latency, simulated
}

// preflight applies the injected error rate.
func (r *Replica) preflight() error {
	if f := r.faults.Load(); f.ErrorRate > 0 && r.draw() < f.ErrorRate {
		return &apiError{status: http.StatusInternalServerError, msg: "simulated engine failure (fault injection)"}
	}
	return nil
}

// prepare validates the sampling fields as vLLM does and plans the output.
func (r *Replica) prepare(ctx context.Context, h http.Header, sr *samplingRequest, prompt []uint32, eos uint32,
	tool *Tool, toolSeed uint64, idPrefix string) (*job, error) {
	if sr.N != nil && *sr.N != 1 {
		return nil, &apiError{status: http.StatusBadRequest, msg: "n > 1 is not supported by the simulator", param: "n"}
	}
	salt, err := sr.cacheSalt()
	if err != nil {
		return nil, err
	}
	if sr.Priority != 0 && r.cfg.SchedulingPolicy != "priority" {
		return nil, &apiError{status: http.StatusBadRequest,
			msg: "Got priority " + strconv.Itoa(sr.Priority) + " but Priority scheduling is not enabled.", param: "priority"}
	}
	stops, err := sr.stops()
	if err != nil {
		return nil, err
	}
	maxTokens, err := r.maxTokens(sr, len(prompt))
	if err != nil {
		return nil, err
	}
	plan := planOutput(prompt, genSpec{maxTokens: maxTokens, minTokens: sr.MinTokens, ignoreEOS: sr.IgnoreEOS,
		stop: stops, eos: eos, tool: tool, toolSeed: toolSeed})
	p := &r.cfg.Profile
	if need := (len(prompt) + len(plan.tokens) + p.BlockSize - 1) / p.BlockSize; need > p.KVBlocks {
		return nil, badRequest("the request needs %d KV blocks but the KV cache holds %d", need, p.KVBlocks)
	}
	session := sr.SessionID
	if session == "" {
		session = h.Get("X-Session-ID")
	}
	eng, rank, err := r.engineFor(h)
	if err != nil {
		return nil, err
	}
	j := &job{
		id:        r.newID(idPrefix),
		created:   r.cfg.Clock.Now().Unix(),
		s:         newSeq(prompt, plan, salt, session, sr.Priority),
		eng:       eng,
		rank:      rank,
		prompt:    prompt,
		stream:    sr.Stream,
		returnIDs: sr.ReturnTokenIDs,
		extra:     r.faults.Load().ExtraLatency,
	}
	if sr.StreamOptions != nil {
		j.includeUsage = sr.StreamOptions.IncludeUsage == nil || *sr.StreamOptions.IncludeUsage
	}
	if j.extra > 0 {
		if err := r.cfg.Clock.Sleep(ctx, time.Duration(float64(j.extra)/r.cfg.Speed)); err != nil {
			return nil, err
		}
	}
	return j, nil
}

// cacheSalt returns the request's cache_salt: "" when absent or null, an
// error when it is not a non-empty string.
func (sr *samplingRequest) cacheSalt() (string, error) {
	salt := ""
	if c := bytes.TrimSpace(sr.CacheSalt); len(c) > 0 && string(c) != "null" {
		if json.Unmarshal(c, &salt) != nil || salt == "" {
			return "", &apiError{status: http.StatusBadRequest,
				msg: "Parameter 'cache_salt' must be a non-empty string if provided.", param: "cache_salt"}
		}
	}
	return salt, nil
}

// stops returns the request's stop strings: stop may be one string or an
// array of them.
func (sr *samplingRequest) stops() ([]string, error) {
	var stops []string
	if c := bytes.TrimSpace(sr.Stop); len(c) > 0 && string(c) != "null" {
		if c[0] == '"' {
			var s string
			if err := json.Unmarshal(c, &s); err != nil {
				return nil, badRequest("stop: %v", err)
			}
			stops = []string{s}
		} else if err := json.Unmarshal(c, &stops); err != nil {
			return nil, badRequest("stop must be a string or an array of strings")
		}
	}
	return stops, nil
}

// maxTokens checks a prompt of promptLen tokens and the request's output
// bounds against the model's context length, as vLLM does, and returns the
// most tokens to generate (max_completion_tokens, else max_tokens, else
// what the context leaves).
func (r *Replica) maxTokens(sr *samplingRequest, promptLen int) (int, error) {
	maxLen := r.cfg.Profile.MaxModelLen
	if promptLen == 0 {
		return 0, badRequest("The prompt is empty.")
	}
	if promptLen >= maxLen {
		return 0, &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf("This model's maximum context length is %d tokens. "+
			"However, your request has %d input tokens. Please reduce the length of the input messages.", maxLen, promptLen)}
	}
	maxTokens := maxLen - promptLen
	if sr.MaxCompletionTokens != nil {
		maxTokens = *sr.MaxCompletionTokens
	} else if sr.MaxTokens != nil {
		maxTokens = *sr.MaxTokens
	}
	if maxTokens < 1 {
		return 0, &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf("max_tokens must be at least 1, got %d.", maxTokens), param: "max_tokens"}
	}
	if promptLen+maxTokens > maxLen {
		return 0, &apiError{status: http.StatusBadRequest, param: "max_tokens", msg: fmt.Sprintf(
			"'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens "+
				"and your request has %d input tokens (%d > %d - %d).", maxTokens, maxLen, promptLen, maxTokens, maxLen, promptLen)}
	}
	if sr.MinTokens < 0 || sr.MinTokens > maxTokens {
		return 0, &apiError{status: http.StatusBadRequest, msg: "min_tokens must be between 0 and max_tokens", param: "min_tokens"}
	}
	return maxTokens, nil
}

// follow waits for j's sequence to make progress and calls fn with each
// range of newly sampled output tokens, until it is done. It returns the
// sequence's error (a restart) or the context's; in the latter case, or
// when fn fails, the sequence is aborted.
func (r *Replica) follow(ctx context.Context, j *job, fn func(from, to int) error) error {
	s := j.s
	sent := 0
	for {
		done := s.done.Load() // before generated: done implies the final count is visible
		g := int(s.generated.Load())
		if g > sent {
			if err := r.waitHang(ctx); err != nil {
				j.eng.abort(s)
				return err
			}
			if err := fn(sent, g); err != nil {
				j.eng.abort(s)
				return err
			}
			sent = g
			if iv := r.cfg.StreamInterval; iv > 0 && !done {
				if err := r.cfg.Clock.Sleep(ctx, iv); err != nil {
					j.eng.abort(s)
					return err
				}
			}
		}
		if done {
			return s.err
		}
		select {
		case <-s.notify:
		case <-ctx.Done():
			j.eng.abort(s)
			return ctx.Err()
		}
	}
}

// setSimHeaders reports a request's simulated timings.
func (r *Replica) setSimHeaders(h http.Header, j *job) {
	ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 3, 64) }
	h.Set("X-Sim-Queue-Ms", ms(j.s.queueTime+j.extra))
	h.Set("X-Sim-TTFT-Ms", ms(j.s.ttft+j.extra))
	h.Set("X-Sim-Cached-Tokens", strconv.Itoa(j.s.cachedTokens))
	h.Set("X-Sim-CPU-Cached-Tokens", strconv.Itoa(j.s.cpuCachedTokens))
	h.Set("X-Sim-Replica", r.info.Name)
	h.Set("X-Sim-DP-Rank", strconv.Itoa(j.rank))
}

type usageJSON struct {
	PromptTokens        int `json:"prompt_tokens"`
	TotalTokens         int `json:"total_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (j *job) usage() usageJSON {
	var u usageJSON
	u.PromptTokens = len(j.prompt)
	u.CompletionTokens = int(j.s.generated.Load())
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	u.PromptTokensDetails.CachedTokens = j.s.cachedTokens
	return u
}

// failed reports whether err, returned by follow, is the engine failing
// the request (a restart) rather than the client going away.
func (j *job) failed(err error) bool {
	return j.s.done.Load() && j.s.err != nil && err == j.s.err
}

// engineError is what a request failed by the engine gets.
func engineError(err error) *apiError {
	return &apiError{status: http.StatusInternalServerError, msg: err.Error()}
}

// run submits j and writes its response, streaming or not; write builds
// the bodies.
func (r *Replica) run(w http.ResponseWriter, req *http.Request, j *job, sw streamer) error {
	ctx := req.Context()
	j.eng.submit(j.s)
	if !j.stream {
		if err := r.follow(ctx, j, func(int, int) error { return nil }); err != nil {
			if j.failed(err) {
				return engineError(err)
			}
			return nil // client gone
		}
		if r.waitHang(ctx) != nil {
			return nil
		}
		r.setSimHeaders(w.Header(), j)
		w.Header().Set("X-Sim-E2E-Ms", strconv.FormatFloat(float64(j.s.e2e+j.extra)/1e6, 'f', 3, 64))
		writeJSON(w, sw.full(j))
		return nil
	}
	rc := http.NewResponseController(w)
	started := false
	var buf []byte
	emit := func(b []byte) {
		buf = append(buf, "data: "...)
		buf = append(buf, b...)
		buf = append(buf, "\n\n"...)
	}
	flush := func() error {
		_, err := w.Write(buf)
		buf = buf[:0]
		if err == nil {
			err = rc.Flush()
		}
		return err
	}
	err := r.follow(ctx, j, func(from, to int) error {
		if !started {
			started = true
			h := w.Header()
			r.setSimHeaders(h, j)
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache")
			w.WriteHeader(http.StatusOK)
			sw.start(j, emit)
		}
		sw.delta(j, from, to, emit)
		return flush()
	})
	if err != nil {
		if !j.failed(err) {
			return nil // client gone or write failed
		}
		if !started {
			return engineError(err)
		}
		emit(errorBody(http.StatusInternalServerError, err.Error(), ""))
		emit([]byte("[DONE]"))
		_ = flush()
		return nil
	}
	if r.waitHang(ctx) != nil {
		return nil
	}
	sw.finish(j, emit)
	if j.includeUsage {
		sw.usage(j, emit)
	}
	emit([]byte("[DONE]"))
	_ = flush()
	return nil
}

// streamer renders one endpoint's response bodies.
type streamer interface {
	full(j *job) any
	start(j *job, emit func([]byte))
	delta(j *job, from, to int, emit func([]byte))
	finish(j *job, emit func([]byte))
	usage(j *job, emit func([]byte))
}

// ---- /v1/chat/completions ----

func (r *Replica) handleChat(w http.ResponseWriter, req *http.Request) error {
	if err := r.preflight(); err != nil {
		return err
	}
	var cr chatRequest
	if err := decodeBody(req, &cr); err != nil {
		return err
	}
	if err := r.checkModel(cr.Model); err != nil {
		return err
	}
	if len(cr.Messages) == 0 {
		return &apiError{status: http.StatusBadRequest, msg: "messages must not be empty", param: "messages"}
	}
	addGen := cr.AddGenerationPrompt == nil || *cr.AddGenerationPrompt
	if addGen && cr.ContinueFinalMessage {
		if cr.AddGenerationPrompt != nil {
			return badRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
		}
		addGen = false
	}
	tool, err := chooseTool(cr.Tools, cr.ToolChoice, cr.Messages)
	if err != nil {
		return &apiError{status: http.StatusBadRequest, msg: err.Error(), param: "tool_choice"}
	}
	prompt := Tokenize(string(simtok.AppendChat(nil, cr.Messages, cr.Tools, addGen, cr.ContinueFinalMessage)))
	seed := promptSeed(Tokenize(cr.Messages[len(cr.Messages)-1].Content))
	j, err := r.prepare(req.Context(), req.Header, &cr.samplingRequest, prompt, IMEndToken, tool, seed, "chatcmpl-")
	if err != nil {
		return err
	}
	cs := &chatStreamer{r: r}
	if tool != nil {
		cs.toolID = r.newID("chatcmpl-tool-")
	}
	return r.run(w, req, j, cs)
}

type chatStreamer struct {
	r        *Replica
	toolID   string
	argsSent int
	text     []byte
}

type chatMessageJSON struct {
	Role             string         `json:"role"`
	Content          *string        `json:"content"`
	ToolCalls        []toolCallJSON `json:"tool_calls"`
	ReasoningContent *string        `json:"reasoning_content"`
}

type toolCallJSON struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function FunctionCall `json:"function"`
}

type chatChoiceJSON struct {
	Index        int             `json:"index"`
	Message      chatMessageJSON `json:"message"`
	Logprobs     any             `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
	StopReason   any             `json:"stop_reason"`
	TokenIDs     []uint32        `json:"token_ids,omitempty"`
}

type chatResponseJSON struct {
	ID               string           `json:"id"`
	Object           string           `json:"object"`
	Created          int64            `json:"created"`
	Model            string           `json:"model"`
	Choices          []chatChoiceJSON `json:"choices"`
	Usage            usageJSON        `json:"usage"`
	PromptLogprobs   any              `json:"prompt_logprobs"`
	PromptTokenIDs   []uint32         `json:"prompt_token_ids,omitempty"`
	KVTransferParams any              `json:"kv_transfer_params"`
}

func stopReason(p *genPlan) any {
	if p.stopReason != "" {
		return p.stopReason
	}
	return nil
}

func (c *chatStreamer) full(j *job) any {
	p := &j.s.plan
	g := int(j.s.generated.Load())
	msg := chatMessageJSON{Role: "assistant", ToolCalls: []toolCallJSON{}}
	if p.toolName != "" && g == len(p.tokens) {
		msg.ToolCalls = append(msg.ToolCalls, toolCallJSON{ID: c.toolID, Type: "function",
			Function: FunctionCall{Name: p.toolName, Arguments: p.toolArgs}})
	} else {
		text := string(AppendText(nil, simtok.NoPrev, p.tokens[:g], true))
		msg.Content = &text
	}
	ch := chatChoiceJSON{Message: msg, FinishReason: p.finish, StopReason: stopReason(p)}
	resp := chatResponseJSON{ID: j.id, Object: "chat.completion", Created: j.created, Model: c.r.cfg.Model,
		Usage: j.usage()}
	if j.returnIDs {
		ch.TokenIDs = nonNil(p.tokens[:g])
		resp.PromptTokenIDs = nonNil(j.prompt)
	}
	resp.Choices = []chatChoiceJSON{ch}
	return resp
}

// chunk renders a chat.completion.chunk around choices; extra is appended
// to the object (e.g. `,"usage":{…}`).
func (c *chatStreamer) chunk(j *job, choices []byte, extra []byte) []byte {
	return chunkJSON(j, "chat.completion.chunk", c.r.cfg.Model, choices, extra)
}

// chunkJSON renders one streamed object of j from model, of type object
// (chat.completion.chunk or text_completion), around choices; extra is
// appended to the object (e.g. `,"usage":{…}`).
func chunkJSON(j *job, object, model string, choices, extra []byte) []byte {
	b := make([]byte, 0, 160+len(choices)+len(extra))
	b = append(b, `{"id":`...)
	b = simtok.AppendJSONString(b, j.id)
	b = append(b, `,"object":"`...)
	b = append(b, object...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, j.created, 10)
	b = append(b, `,"model":`...)
	b = simtok.AppendJSONString(b, model)
	b = append(b, `,"choices":[`...)
	b = append(b, choices...)
	b = append(b, ']')
	b = append(b, extra...)
	return append(b, '}')
}

func appendTokenIDs(b []byte, ids []uint32) []byte {
	b = append(b, '[')
	for i, t := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(t), 10)
	}
	return append(b, ']')
}

func (c *chatStreamer) start(j *job, emit func([]byte)) {
	var extra []byte
	if j.returnIDs {
		extra = appendTokenIDs([]byte(`,"prompt_token_ids":`), j.prompt)
	}
	emit(c.chunk(j, []byte(`{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`), extra))
	if p := &j.s.plan; p.toolName != "" {
		d := []byte(`{"index":0,"delta":{"tool_calls":[{"index":0,"id":`)
		d = simtok.AppendJSONString(d, c.toolID)
		d = append(d, `,"type":"function","function":{"name":`...)
		d = simtok.AppendJSONString(d, p.toolName)
		d = append(d, `,"arguments":""}}]},"logprobs":null,"finish_reason":null}`...)
		emit(c.chunk(j, d, nil))
	}
}

func (c *chatStreamer) delta(j *job, from, to int, emit func([]byte)) {
	p := &j.s.plan
	var d []byte
	if p.toolName != "" {
		want := len(p.toolArgs)
		if to < len(p.tokens) {
			want = len(p.toolArgs) * to / len(p.tokens)
			for want > c.argsSent && want < len(p.toolArgs) && !utf8.RuneStart(p.toolArgs[want]) {
				want--
			}
		}
		if want <= c.argsSent && !j.returnIDs {
			return
		}
		d = append(d, `{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":`...)
		d = simtok.AppendJSONString(d, p.toolArgs[c.argsSent:want])
		d = append(d, `}}]},"logprobs":null,"finish_reason":null`...)
		c.argsSent = want
	} else {
		prev := simtok.NoPrev
		if from > 0 {
			prev = p.tokens[from-1]
		}
		c.text = AppendText(c.text[:0], prev, p.tokens[from:to], true)
		if len(c.text) == 0 && !j.returnIDs {
			return
		}
		d = append(d, `{"index":0,"delta":{"content":`...)
		d = simtok.AppendJSONString(d, string(c.text))
		d = append(d, `},"logprobs":null,"finish_reason":null`...)
	}
	if j.returnIDs {
		d = appendTokenIDs(append(d, `,"token_ids":`...), p.tokens[from:to])
	}
	emit(c.chunk(j, append(d, '}'), nil))
}

func (c *chatStreamer) finish(j *job, emit func([]byte)) {
	emit(c.chunk(j, finishChoice(`{"index":0,"delta":{},`, &j.s.plan), nil))
}

// finishChoice is the last choice of a stream: head (the choice's opening,
// its empty text or delta) followed by its finish and stop reasons.
func finishChoice(head string, p *genPlan) []byte {
	d := append([]byte(head), `"logprobs":null,"finish_reason":`...)
	d = append(d, strconv.Quote(p.finish)...)
	d = append(d, `,"stop_reason":`...)
	if p.stopReason != "" {
		d = simtok.AppendJSONString(d, p.stopReason)
	} else {
		d = append(d, "null"...)
	}
	return append(d, '}')
}

func (c *chatStreamer) usage(j *job, emit func([]byte)) {
	u, _ := json.Marshal(j.usage())
	emit(c.chunk(j, nil, append([]byte(`,"usage":`), u...)))
}
