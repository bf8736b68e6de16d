package bench

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/warmpath/warmpath/vllmsim"
)

// Replay replays a request trace (see ReadTrace): arrival times multiplied
// by Env.TimeScale, each request sent once as a streamed chat completion
// with max_tokens = its output length and ignore_eos.
//
// Mooncake records carry no text, only hash ids of 512-token blocks; two
// requests share a prefix exactly as long as their leading hash ids agree.
// Replay gives each hash id deterministic content: position p of block h
// is the vocabulary word hashed from (h, p), one simulator token, so equal
// ids mean equal tokens; at Env.Scale s a block has ⌈512 s⌉ tokens and
// a request round(input_length × s), the last block truncated.
//
// The prompt is sent as a chat request, not a completion, split into
// messages at block boundaries: the system message holds the blocks the
// conversation shares with others (block 0, the service's common system
// prompt, in Mooncake's own trace; a coding agent's whole harness in
// others), the first user message the first block where it parts from
// them (TraceRequest.Opening), and a second user message the rest. The
// gateway keys sessions on a conversation's opening (system messages,
// tools and first user message); a completion has no session key unless a
// header names one, and a chat request whose single user message held the
// whole prompt would make every request its own session. Split this way,
// the turns of one Mooncake conversation, which extend each other's hash
// ids, share their opening and hence their session, as a chat client's
// turns do; requests that only share the harness do not. The chat template
// adds 13–18 tokens to the input_length content tokens.
//
// Chat-log traces (FormatOpenAI) are sent as recorded, with the model
// replaced and streaming on; Scale does not apply to them.
//
// The zero value is ready to use.
type Replay struct{}

// Name implements Workload.
func (*Replay) Name() string { return "trace" }

// Plan implements Workload.
func (*Replay) Plan(env Env) (*Plan, error) {
	if env.TracePath == "" {
		return nil, errors.New("bench: trace: no trace file (--trace)")
	}
	tr, err := ReadTraceFile(env.TracePath)
	if err != nil {
		return nil, err
	}
	ts := env.TimeScale
	if ts <= 0 {
		ts = 1
	}
	sessions := make([]Session, 0, len(tr.Requests))
	for i := range tr.Requests {
		req := &tr.Requests[i]
		var sc Script
		switch tr.Format {
		case FormatMooncake:
			sc = &mooncakeTurn{req: req, scale: env.Scale}
		default:
			sc = &chatLogTurn{req: req}
		}
		sessions = append(sessions, Session{Start: time.Duration(float64(req.Arrival) * ts), Script: sc})
	}
	sessions = cutSessions(env, sessions)
	var in, out int64
	for _, s := range sessions {
		switch sc := s.Script.(type) {
		case *mooncakeTurn:
			in += int64(sc.req.InputTokens)
			out += int64(sc.req.OutputTokens)
		case *chatLogTurn:
			in += int64(sc.req.InputTokens)
			out += int64(sc.req.OutputTokens)
		}
	}
	span := time.Duration(0)
	if n := len(sessions); n > 0 {
		span = sessions[n-1].Start
	}
	params := []Param{
		{"trace", env.TracePath + " (" + tr.Format + ")"},
		{"requests", fmt.Sprintf("%d of %d", len(sessions), len(tr.Requests))},
		{"time scale", fmt.Sprintf("%g (arrivals over %v)", ts, span.Round(time.Second))},
		{"mean input / output (trace tokens)", fmt.Sprintf("%.0f / %.0f", float64(in)/float64(max(1, len(sessions))), float64(out)/float64(max(1, len(sessions))))},
	}
	if tr.Format == FormatMooncake {
		params = append(params, Param{"tokens per hash id", strconv.Itoa(mooncakeBlock(env.Scale))})
	}
	return &Plan{Sessions: sessions, Params: params}, nil
}

// mooncakeBlock is the number of tokens behind one hash id at scale s:
// 512 s rounded up, so that a request's hash ids always cover its scaled
// input length.
func mooncakeBlock(s float64) int {
	if s <= 0 {
		s = 1
	}
	return max(1, int(math.Ceil(MooncakeBlockTokens*s-1e-9)))
}

// mooncakeTurn is the single turn of a Mooncake record; it renders the
// prompt when sent, so a long trace is never held in memory as text.
type mooncakeTurn struct {
	req   *TraceRequest
	scale float64
}

// Next implements Script.
func (m *mooncakeTurn) Next(prev *Outcome) (Turn, bool) {
	if prev != nil {
		return Turn{}, false
	}
	s := m.scale
	if s <= 0 {
		s = 1
	}
	return Turn{
		Messages:  mooncakeMessages(m.req.HashIDs, m.req.InputTokens, m.req.Opening, s),
		MaxTokens: max(1, int(math.Round(float64(m.req.OutputTokens)*s))),
		IgnoreEOS: true,
	}, true
}

// mooncakeMessages renders a Mooncake prompt of input tokens (before
// scaling) over hash ids, whose opening is the first opening blocks, as
// system (the opening but its last block; at least block 0), user (the
// next block) and user (the rest) messages.
func mooncakeMessages(ids []int64, input, opening int, scale float64) []vllmsim.Message {
	bt := mooncakeBlock(scale)
	n := min(max(1, int(math.Round(float64(input)*scale))), bt*len(ids))
	split := min(max(1, opening-1), len(ids))
	parts := []string{blockWords(ids, 0, split, bt, n)}
	if len(ids) > split {
		parts = append(parts, blockWords(ids, split, split+1, bt, n))
	}
	if len(ids) > split+1 {
		parts = append(parts, blockWords(ids, split+1, len(ids), bt, n))
	}
	msgs := make([]vllmsim.Message, 0, 3)
	for i, p := range parts {
		if p == "" {
			break
		}
		role := "user"
		if i == 0 {
			role = "system"
		}
		msgs = append(msgs, vllmsim.Message{Role: role, Content: p})
	}
	return msgs
}

// blockWords renders blocks [from, to) of ids, bt tokens each, stopping at
// token n of the prompt.
func blockWords(ids []int64, from, to, bt, n int) string {
	var b strings.Builder
	var buf [16]byte
	for i := from; i < to; i++ {
		binary.LittleEndian.PutUint64(buf[:8], uint64(ids[i]))
		for p := range bt {
			if i*bt+p >= n {
				return b.String()
			}
			binary.LittleEndian.PutUint64(buf[8:], uint64(p))
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(vllmsim.Word(vllmsim.WordBase + uint32(xxhash.Sum64(buf[:])%vllmsim.NumWords)))
		}
	}
	return b.String()
}

// chatLogTurn is the single turn of a recorded chat request.
type chatLogTurn struct{ req *TraceRequest }

// Next implements Script. A body that does not decode is sent with no
// messages, which the endpoint rejects, so the failure is counted.
func (c *chatLogTurn) Next(prev *Outcome) (Turn, bool) {
	if prev != nil {
		return Turn{}, false
	}
	var body struct {
		Messages   []vllmsim.Message `json:"messages"`
		Tools      []vllmsim.Tool    `json:"tools"`
		ToolChoice json.RawMessage   `json:"tool_choice"`
	}
	_ = json.Unmarshal(c.req.Body, &body)
	t := Turn{Messages: body.Messages, Tools: body.Tools}
	if c.req.OutputTokens > 0 {
		t.MaxTokens, t.IgnoreEOS = c.req.OutputTokens, true
	}
	var choice string
	if json.Unmarshal(body.ToolChoice, &choice) == nil {
		t.ToolChoice = choice
	}
	return t, true
}

var (
	_ Workload = (*Replay)(nil)
	_ Script   = (*mooncakeTurn)(nil)
	_ Script   = (*chatLogTurn)(nil)
)
