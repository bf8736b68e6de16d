package vllmsim

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/warmpath/warmpath/tokenizer/simtok"
)

// handleCompletions serves POST /v1/completions.
func (r *Replica) handleCompletions(w http.ResponseWriter, req *http.Request) error {
	if err := r.preflight(); err != nil {
		return err
	}
	var cr completionRequest
	if err := decodeBody(req, &cr); err != nil {
		return err
	}
	if err := r.checkModel(cr.Model); err != nil {
		return err
	}
	prompt, err := completionPrompt(cr.Prompt)
	if err != nil {
		return err
	}
	j, err := r.prepare(req.Context(), req.Header, &cr.samplingRequest, prompt, EndOfTextToken, nil, 0, "cmpl-")
	if err != nil {
		return err
	}
	return r.run(w, req, j, &completionStreamer{r: r})
}

// completionPrompt accepts a string, an array of token IDs, or an array of
// one string.
func completionPrompt(raw json.RawMessage) ([]uint32, error) {
	c := bytes.TrimSpace(raw)
	if len(c) == 0 || string(c) == "null" {
		return nil, &apiError{status: http.StatusBadRequest, msg: "prompt is required", param: "prompt"}
	}
	if c[0] == '"' {
		var s string
		if err := json.Unmarshal(c, &s); err != nil {
			return nil, badRequest("prompt: %v", err)
		}
		return Tokenize(s), nil
	}
	var ids []uint32
	if err := json.Unmarshal(c, &ids); err == nil {
		for _, t := range ids {
			if t >= VocabSize {
				return nil, badRequest("token id %d out of vocabulary (size %d)", t, VocabSize)
			}
		}
		return ids, nil
	}
	var strs []string
	if err := json.Unmarshal(c, &strs); err == nil {
		if len(strs) != 1 {
			return nil, badRequest("the simulator accepts exactly one prompt per request, got %d", len(strs))
		}
		return Tokenize(strs[0]), nil
	}
	return nil, &apiError{status: http.StatusBadRequest, msg: "prompt must be a string, an array of token IDs or an array of one string", param: "prompt"}
}

type completionStreamer struct {
	r    *Replica
	text []byte
}

type completionChoiceJSON struct {
	Index          int      `json:"index"`
	Text           string   `json:"text"`
	Logprobs       any      `json:"logprobs"`
	FinishReason   string   `json:"finish_reason"`
	StopReason     any      `json:"stop_reason"`
	PromptLogprobs any      `json:"prompt_logprobs"`
	TokenIDs       []uint32 `json:"token_ids,omitempty"`
	PromptTokenIDs []uint32 `json:"prompt_token_ids,omitempty"`
}

func (c *completionStreamer) full(j *job) any {
	p := &j.s.plan
	g := int(j.s.generated.Load())
	ch := completionChoiceJSON{Text: string(AppendText(nil, simtok.NoPrev, p.tokens[:g], true)), FinishReason: p.finish,
		StopReason: stopReason(p)}
	if j.returnIDs {
		ch.TokenIDs, ch.PromptTokenIDs = nonNil(p.tokens[:g]), nonNil(j.prompt)
	}
	return map[string]any{"id": j.id, "object": "text_completion", "created": j.created, "model": c.r.cfg.Model,
		"choices": []completionChoiceJSON{ch}, "usage": j.usage(), "kv_transfer_params": nil}
}

func (c *completionStreamer) chunk(j *job, choices []byte, extra []byte) []byte {
	return chunkJSON(j, "text_completion", c.r.cfg.Model, choices, extra)
}

func (c *completionStreamer) start(*job, func([]byte)) {}

func (c *completionStreamer) delta(j *job, from, to int, emit func([]byte)) {
	p := &j.s.plan
	prev := simtok.NoPrev
	if from > 0 {
		prev = p.tokens[from-1]
	}
	c.text = AppendText(c.text[:0], prev, p.tokens[from:to], true)
	if len(c.text) == 0 && !j.returnIDs {
		return
	}
	d := simtok.AppendJSONString([]byte(`{"index":0,"text":`), string(c.text))
	d = append(d, `,"logprobs":null,"finish_reason":null,"stop_reason":null`...)
	if j.returnIDs {
		d = appendTokenIDs(append(d, `,"token_ids":`...), p.tokens[from:to])
		if from == 0 {
			d = appendTokenIDs(append(d, `,"prompt_token_ids":`...), j.prompt)
		}
	}
	emit(c.chunk(j, append(d, '}'), nil))
}

func (c *completionStreamer) finish(j *job, emit func([]byte)) {
	emit(c.chunk(j, finishChoice(`{"index":0,"text":"",`, &j.s.plan), nil))
}

func (c *completionStreamer) usage(j *job, emit func([]byte)) {
	u, _ := json.Marshal(j.usage())
	emit(c.chunk(j, nil, append([]byte(`,"usage":`), u...)))
}
