package vllmsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/warmpath/warmpath/tokenizer/simtok"
)

// Finish reasons, as in the OpenAI API.
const (
	finishStop      = "stop"
	finishLength    = "length"
	finishToolCalls = "tool_calls"
)

// genSpec describes what a request may generate.
type genSpec struct {
	maxTokens int // ≥ 1
	minTokens int
	ignoreEOS bool
	stop      []string
	eos       uint32
	tool      *Tool  // forced function call, or nil
	toolSeed  uint64 // varies the call's arguments
}

// genPlan is a request's whole output, fixed at admission: the engine only
// decides when each token appears.
type genPlan struct {
	tokens     []uint32 // output token IDs, including the EOS token when finished by it
	finish     string
	stopReason string // the matched stop string, if any
	toolName   string // set when the output is a function call
	toolArgs   string
}

// splitmix64 is a tiny deterministic generator for output text.
type splitmix64 uint64

func (s *splitmix64) next() uint64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// promptSeed hashes the prompt tokens (no per-process seed: output text is
// the same on every replica and run).
func promptSeed(tokens []uint32) uint64 {
	h := uint64(14695981039346656037)
	for _, t := range tokens {
		h = (h ^ uint64(t)) * 1099511628211
	}
	return h
}

// planOutput computes the output of a request whose prompt is prompt.
//
// Text output is a stream of vocabulary words (1–2 syllables) with a '.'
// ending each sentence of 6–15 words. Without ignore_eos its natural length
// is 16–63 tokens (at least min_tokens) followed by the EOS token; it is cut
// at max_tokens (finish "length") or at the first stop string (finish
// "stop", the stop string and what follows dropped).
func planOutput(prompt []uint32, g genSpec) genPlan {
	seed := promptSeed(prompt)
	if g.tool != nil {
		args := toolArguments(g.tool.Function.Parameters, g.toolSeed)
		toks := AppendTokens(nil, string(simtok.AppendToolCallText(nil, g.tool.Function.Name, args)))
		if len(toks)+1 <= g.maxTokens {
			return genPlan{tokens: append(toks, g.eos), finish: finishToolCalls, toolName: g.tool.Function.Name, toolArgs: args}
		}
		// Does not fit: fall through to ordinary text cut at max_tokens.
	}
	n := g.maxTokens
	finish := finishLength
	withEOS := false
	if !g.ignoreEOS {
		natural := 16 + int(seed%48)
		if natural < g.minTokens {
			natural = g.minTokens
		}
		if natural+1 <= g.maxTokens {
			n, finish, withEOS = natural, finishStop, true
		}
	}
	rng := splitmix64(seed)
	toks := make([]uint32, 0, n+1)
	sentence := 6 + int(rng.next()%10)
	for len(toks) < n {
		if sentence == 0 {
			toks = append(toks, '.')
			sentence = 6 + int(rng.next()%10)
			continue
		}
		toks = append(toks, WordBase+uint32(rng.next()%simtok.ShortWords))
		sentence--
	}
	p := genPlan{tokens: toks, finish: finish}
	if len(g.stop) > 0 {
		if cut, s, ok := cutAtStop(toks, g.stop); ok {
			p.tokens, p.finish, p.stopReason = toks[:cut], finishStop, s
			return p
		}
	}
	if withEOS {
		p.tokens = append(p.tokens, g.eos)
	}
	return p
}

// cutAtStop finds the earliest stop string in the text of toks and returns
// how many tokens lie wholly before it.
func cutAtStop(toks []uint32, stops []string) (int, string, bool) {
	text := make([]byte, 0, len(toks)*5)
	ends := make([]int, len(toks))
	prev := simtok.NoPrev
	for i, t := range toks {
		text = AppendText(text, prev, toks[i:i+1], true)
		ends[i] = len(text)
		prev = t
	}
	best, which := -1, ""
	for _, s := range stops {
		if s == "" {
			continue
		}
		if i := bytes.Index(text, []byte(s)); i >= 0 && (best < 0 || i < best) {
			best, which = i, s
		}
	}
	if best < 0 {
		return 0, "", false
	}
	cut := sort.SearchInts(ends, best+1) // first token ending after the match start
	return cut, which, true
}

// chooseTool applies the simulator's tool-call rule (see doc.go):
//
//   - tool_choice {"type":"function","function":{"name":N}} calls N;
//   - "none" calls nothing;
//   - "required" calls the tool the last message mentions, else the first;
//   - "auto" or absent (with tools) calls a tool only when the last message
//     is a user message that mentions a tool's name as a whole word (as in
//     "call tool read_file" or "use the read_file tool"); the earliest
//     mention wins.
func chooseTool(tools []Tool, choice json.RawMessage, msgs []Message) (*Tool, error) {
	c := bytes.TrimSpace(choice)
	mode := "auto"
	if len(c) > 0 && string(c) != "null" {
		switch c[0] {
		case '"':
			if err := json.Unmarshal(c, &mode); err != nil {
				return nil, err
			}
		case '{':
			var named struct {
				Type     string `json:"type"`
				Function struct {
					Name string `json:"name"`
				} `json:"function"`
			}
			if err := json.Unmarshal(c, &named); err != nil {
				return nil, fmt.Errorf("tool_choice: %w", err)
			}
			for i := range tools {
				if tools[i].Function.Name == named.Function.Name {
					return &tools[i], nil
				}
			}
			return nil, fmt.Errorf("tool_choice names function %q, which is not in tools", named.Function.Name)
		default:
			return nil, errors.New("tool_choice must be a string or an object")
		}
	}
	// Trailing system messages (harness reminders, as Claude Code sends
	// after the user's request) do not change whose turn it is.
	for len(msgs) > 1 && (msgs[len(msgs)-1].Role == "system" || msgs[len(msgs)-1].Role == "developer") {
		msgs = msgs[:len(msgs)-1]
	}
	switch mode {
	case "none":
		return nil, nil
	case "auto":
		if len(tools) == 0 || len(msgs) == 0 || msgs[len(msgs)-1].Role != "user" {
			return nil, nil
		}
		return mentionedTool(tools, msgs[len(msgs)-1].Content), nil
	case "required":
		if len(tools) == 0 {
			return nil, errors.New(`tool_choice "required" needs tools`)
		}
		if len(msgs) > 0 {
			if t := mentionedTool(tools, msgs[len(msgs)-1].Content); t != nil {
				return t, nil
			}
		}
		return &tools[0], nil
	default:
		return nil, fmt.Errorf("unknown tool_choice %q", mode)
	}
}

func isNameByte(c byte) bool {
	return c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// mentionedTool returns the tool whose name occurs earliest in text as a
// whole word, or nil.
func mentionedTool(tools []Tool, text string) *Tool {
	var best *Tool
	bestAt := -1
	for i := range tools {
		name := tools[i].Function.Name
		if name == "" {
			continue
		}
		for from := 0; from < len(text); {
			j := strings.Index(text[from:], name)
			if j < 0 {
				break
			}
			j += from
			end := j + len(name)
			if (j == 0 || !isNameByte(text[j-1])) && (end == len(text) || !isNameByte(text[end])) {
				if bestAt < 0 || j < bestAt {
					best, bestAt = &tools[i], j
				}
				break
			}
			from = j + 1
		}
	}
	return best
}

// toolArguments builds deterministic JSON arguments from a JSON Schema:
// an object with each required property (in the order of "required") set to
// a value of its type: the first enum value; a vocabulary word for strings;
// 1 for integers; 1.5 for numbers; true for booleans; a one-element array of
// the items schema; objects recursively. Optional properties are left out.
func toolArguments(schema json.RawMessage, seed uint64) string {
	var s map[string]any
	if len(schema) > 0 {
		d := json.NewDecoder(bytes.NewReader(schema))
		d.UseNumber()
		_ = d.Decode(&s) // a malformed schema yields {}
	}
	rng := splitmix64(seed)
	out := appendSchemaValue(nil, s, &rng, 0, true)
	return string(out)
}

func appendSchemaValue(dst []byte, s map[string]any, rng *splitmix64, depth int, top bool) []byte {
	if enum, ok := s["enum"].([]any); ok && len(enum) > 0 {
		if b, err := json.Marshal(enum[0]); err == nil {
			return append(dst, b...)
		}
	}
	typ := "string"
	if top {
		typ = "object"
	}
	switch t := s["type"].(type) {
	case string:
		typ = t
	case []any:
		for _, x := range t {
			if xs, ok := x.(string); ok && xs != "null" {
				typ = xs
				break
			}
		}
	}
	if depth > 8 {
		return append(dst, "null"...)
	}
	switch typ {
	case "object":
		dst = append(dst, '{')
		props, _ := s["properties"].(map[string]any)
		req, _ := s["required"].([]any)
		n := 0
		for _, r := range req {
			name, ok := r.(string)
			if !ok {
				continue
			}
			if n > 0 {
				dst = append(dst, ", "...)
			}
			dst = simtok.AppendJSONString(dst, name)
			dst = append(dst, ": "...)
			ps, _ := props[name].(map[string]any)
			dst = appendSchemaValue(dst, ps, rng, depth+1, false)
			n++
		}
		return append(dst, '}')
	case "array":
		items, _ := s["items"].(map[string]any)
		dst = append(dst, '[')
		dst = appendSchemaValue(dst, items, rng, depth+1, false)
		return append(dst, ']')
	case "integer":
		return append(dst, '1')
	case "number":
		return append(dst, "1.5"...)
	case "boolean":
		return append(dst, "true"...)
	case "null":
		return append(dst, "null"...)
	default:
		dst = append(dst, '"')
		dst = simtok.AppendWord(dst, WordBase+uint32(rng.next()%simtok.ShortWords))
		return append(dst, '"')
	}
}
