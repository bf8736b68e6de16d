package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/warmpath/warmpath/scoring/blockindex"
	"github.com/warmpath/warmpath/vllmsim"
)

// Trace formats.
const (
	// FormatMooncake is the Mooncake trace: one {"timestamp" (ms),
	// "input_length", "output_length", "hash_ids"} object a line, each hash
	// id a block of MooncakeBlockTokens tokens.
	FormatMooncake = "mooncake"
	// FormatOpenAI is a log of OpenAI chat requests, one a line, each with
	// a "timestamp" field in milliseconds; prompts are tokenized with the
	// simulator's tokenizer and chat template.
	FormatOpenAI = "openai"
	// FormatRecord is the gateway's own recording (package record, the
	// record: setting), read with ReadRecordTrace: a directory of JSON
	// lines with block keys at the gateway's block size.
	FormatRecord = "record"
)

// MooncakeBlockTokens is the number of tokens behind one Mooncake hash id.
const MooncakeBlockTokens = 512

// ChatBlockTokens is the block size used for tokenized chat logs.
const ChatBlockTokens = 16

// TraceRequest is one request of a trace.
type TraceRequest struct {
	// Arrival is the request's arrival time from the trace's first
	// request.
	Arrival time.Duration
	// InputTokens and OutputTokens are the prompt and generation lengths.
	InputTokens, OutputTokens int
	// Blocks holds one key per full block of the prompt (and the trailing
	// partial block, for Mooncake, whose hash ids cover it), chained, so two
	// requests share a prefix of k blocks exactly when their first k keys
	// are equal.
	Blocks []uint64
	// HashIDs are the Mooncake hash ids (nil for chat logs), from which
	// replay builds deterministic prompt text.
	HashIDs []int64
	// Body is the original chat request (nil for Mooncake).
	Body json.RawMessage
	// Opening is, for Mooncake records, how many leading blocks make the
	// conversation's opening: the blocks it shares with other
	// conversations plus the first where it parts from them (see
	// ReadTrace); 0 for chat logs.
	Opening int
	// Session is a recorded request's session (FormatRecord: the hash
	// the gateway wrote), "" otherwise.
	Session string
}

// Trace is a parsed request log.
type Trace struct {
	// Format is FormatMooncake, FormatOpenAI or FormatRecord.
	Format string
	// BlockTokens is the number of tokens per block of Requests[i].Blocks.
	BlockTokens int
	// Requests are in arrival order.
	Requests []TraceRequest
	// Recorded is what the fleet got on a recording (FormatRecord), nil
	// for other formats.
	Recorded *RecordedResult
}

// ReadTraceFile reads a trace file; see ReadTrace.
func ReadTraceFile(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("bench: trace: %w", err)
	}
	defer f.Close()
	return ReadTrace(f)
}

// maxTraceLine bounds one JSONL line (a chat request with a long history).
const maxTraceLine = 64 << 20

// maxTraceSpan bounds a trace's span, last arrival minus first: a year in
// milliseconds, far beyond any trace and far inside time.Duration.
const maxTraceSpan = 365 * 24 * 3600 * 1000

// maxTraceTimestamp bounds timestamps themselves: 2^53 ms, beyond which a
// float64 no longer counts milliseconds exactly (epoch milliseconds are
// about 2^40).
const maxTraceTimestamp = 1 << 53

// ReadTrace reads a JSONL trace in either format, telling them apart by the
// first line: a hash_ids field means Mooncake, a messages field a chat
// log, and a block_tokens field the gateway's recording, which is an error
// (ReadRecordTrace reads those). Requests are sorted by arrival, and arrivals count from the first
// request: a log of epoch milliseconds, or the second half of a trace,
// starts at 0 like any other. A malformed line is an error naming its line
// number.
//
// A Mooncake record carries no conversation identity, so ReadTrace derives
// each one's opening (TraceRequest.Opening) from the prefix tree of the
// whole trace: a block "branches" when at least two of its children lead
// to two or more distinct requests (conversations that went on), and a
// request's opening ends with the first block after the deepest branching
// block on its path (after the deepest block it shares with another
// request, when none on its path branches). Behind a shared multi-block
// harness the opening thus reaches the first block where conversations
// part, and sub-agents that share a parent's harness and context get
// openings of their own.
func ReadTrace(r io.Reader) (*Trace, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxTraceLine)
	t := &Trace{}
	line := 0
	var first, last float64
	var stamps []float64
	for sc.Scan() {
		line++
		raw := bytes.TrimSpace(sc.Bytes())
		if len(raw) == 0 {
			continue
		}
		var probe struct {
			Timestamp    *float64        `json:"timestamp"`
			InputLength  *int            `json:"input_length"`
			OutputLength int             `json:"output_length"`
			HashIDs      []int64         `json:"hash_ids"`
			Messages     json.RawMessage `json:"messages"`
			Tools        json.RawMessage `json:"tools"`
			MaxTokens    int             `json:"max_tokens"`
			MaxComplete  int             `json:"max_completion_tokens"`
			BlockTokens  *int            `json:"block_tokens"`
		}
		if err := json.Unmarshal(raw, &probe); err != nil {
			return nil, fmt.Errorf("bench: trace line %d: %w", line, err)
		}
		if t.Format == "" {
			var err error
			if t.Format, t.BlockTokens, err = traceFormat(probe.BlockTokens != nil, probe.HashIDs != nil || probe.InputLength != nil, probe.Messages != nil); err != nil {
				return nil, fmt.Errorf("bench: trace line %d: %w", line, err)
			}
		}
		if probe.Timestamp == nil || !(*probe.Timestamp >= 0 && *probe.Timestamp <= maxTraceTimestamp) {
			return nil, fmt.Errorf("bench: trace line %d: missing timestamp, or not within 0…2^53 ms", line)
		}
		if probe.OutputLength < 0 || probe.MaxTokens < 0 || probe.MaxComplete < 0 {
			return nil, fmt.Errorf("bench: trace line %d: negative output length", line)
		}
		ts := *probe.Timestamp
		if len(t.Requests) == 0 || ts < first {
			first = ts
		}
		last = max(last, ts)
		stamps = append(stamps, ts)
		var req TraceRequest
		switch t.Format {
		case FormatMooncake:
			if probe.InputLength == nil || *probe.InputLength <= 0 || len(probe.HashIDs) == 0 {
				return nil, fmt.Errorf("bench: trace line %d: a Mooncake record needs input_length > 0 and hash_ids", line)
			}
			if want := (*probe.InputLength + MooncakeBlockTokens - 1) / MooncakeBlockTokens; len(probe.HashIDs) != want {
				return nil, fmt.Errorf("bench: trace line %d: %d hash_ids for %d input tokens; want %d", line, len(probe.HashIDs), *probe.InputLength, want)
			}
			req.InputTokens, req.OutputTokens = *probe.InputLength, probe.OutputLength
			req.HashIDs = probe.HashIDs
			req.Blocks = chainIDs(probe.HashIDs)
		case FormatOpenAI:
			if probe.Messages == nil {
				return nil, fmt.Errorf("bench: trace line %d: chat request without messages", line)
			}
			var msgs []vllmsim.Message
			if err := json.Unmarshal(probe.Messages, &msgs); err != nil {
				return nil, fmt.Errorf("bench: trace line %d: messages: %w", line, err)
			}
			var tools []vllmsim.Tool
			if len(probe.Tools) > 0 && string(probe.Tools) != "null" {
				if err := json.Unmarshal(probe.Tools, &tools); err != nil {
					return nil, fmt.Errorf("bench: trace line %d: tools: %w", line, err)
				}
			}
			tokens := vllmsim.TokenizeChat(msgs, tools, true)
			req.InputTokens = len(tokens)
			req.OutputTokens = max(probe.MaxComplete, probe.MaxTokens)
			req.Blocks = blockindex.Hasher{BlockSize: ChatBlockTokens}.AppendKeys(nil, tokens, blockindex.Root{})
			req.Body = slices.Clone(raw)
		}
		t.Requests = append(t.Requests, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("bench: trace line %d: %w", line+1, err)
	}
	if len(t.Requests) == 0 {
		return nil, errors.New("bench: trace is empty")
	}
	if last-first > maxTraceSpan {
		return nil, fmt.Errorf("bench: trace spans %.0f ms; want at most a year", last-first)
	}
	for i := range t.Requests {
		t.Requests[i].Arrival = time.Duration((stamps[i] - first) * float64(time.Millisecond))
	}
	slices.SortStableFunc(t.Requests, func(a, b TraceRequest) int { return cmp.Compare(a.Arrival, b.Arrival) })
	if t.Format == FormatMooncake {
		setOpenings(t.Requests)
	}
	return t, nil
}

// traceFormat tells a trace's format and block size from its first line's
// fields: block_tokens (a recording, which ReadTrace does not read),
// hash_ids or input_length (Mooncake), messages (a chat log).
func traceFormat(blockTokens, mooncake, messages bool) (string, int, error) {
	switch {
	case blockTokens:
		return "", 0, errors.New("a warmpath recording (block_tokens): read its directory with ReadRecordTrace (warmpath analyze --record DIR)")
	case mooncake:
		return FormatMooncake, MooncakeBlockTokens, nil
	case messages:
		return FormatOpenAI, ChatBlockTokens, nil
	}
	return "", 0, errors.New("neither a Mooncake record (hash_ids) nor a chat request (messages)")
}

// setOpenings sets each Mooncake request's Opening from the trace's
// prefix tree (see ReadTrace).
func setOpenings(reqs []TraceRequest) {
	// below[k] is what the subtree of block key k leads to: the first
	// distinct request end seen under it, and whether there was another.
	type subtree struct {
		end   uint64
		multi bool
	}
	below := map[uint64]*subtree{}
	for i := range reqs {
		b := reqs[i].Blocks
		end := b[len(b)-1]
		for _, k := range b {
			st := below[k]
			switch {
			case st == nil:
				below[k] = &subtree{end: end}
			case st.end != end:
				st.multi = true
			}
		}
	}
	// branches[k] counts k's children that lead to several requests,
	// up to two.
	branches := map[uint64]int{}
	counted := map[uint64]bool{}
	for i := range reqs {
		b := reqs[i].Blocks
		for d := 0; d+1 < len(b); d++ {
			child := b[d+1]
			if below[child].multi && !counted[child] {
				counted[child] = true
				branches[b[d]] = min(branches[b[d]]+1, 2)
			}
		}
	}
	for i := range reqs {
		b := reqs[i].Blocks
		deepest, shared := -1, -1
		for d := range b {
			if branches[b[d]] >= 2 {
				deepest = d
			}
			if below[b[d]].multi {
				shared = d
			}
		}
		if deepest < 0 {
			// No conversation on the path goes on: the request parts from
			// the others at its first block of its own.
			deepest = shared
		}
		reqs[i].Opening = min(deepest+2, len(b))
	}
}

// chainIDs turns Mooncake hash ids into chained block keys.
func chainIDs(ids []int64) []uint64 {
	out := make([]uint64, len(ids))
	var buf [16]byte
	var parent uint64
	for i, id := range ids {
		binary.LittleEndian.PutUint64(buf[:8], parent)
		binary.LittleEndian.PutUint64(buf[8:], uint64(id))
		parent = xxhash.Sum64(buf[:])
		out[i] = parent
	}
	return out
}
