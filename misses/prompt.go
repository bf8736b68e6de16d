package misses

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"

	"github.com/cespare/xxhash/v2"
	"github.com/tidwall/gjson"
)

// Part names a part of a chat prompt, in the order of the canonical
// rendering.
type Part uint8

// The parts of a prompt.
const (
	PartNone    Part = iota // no part: no previous turn, or nothing differs
	PartSystem              // a leading system or developer message (the system prompt)
	PartTools               // the tool definitions
	PartMessage             // a message after the leading system ones
	PartTail                // what follows the previous turn's prompt: new content
)

var partNames = [...]string{"none", "system", "tools", "message", "tail"}

// String returns the part's name: "none", "system", "tools", "message" or
// "tail".
func (p Part) String() string {
	if int(p) < len(partNames) {
		return partNames[p]
	}
	return "unknown"
}

// span is one part of a Prompt's rendering: its header (a separator and
// its role or name) at head, its body from start to end.
type span struct {
	part       Part
	index      int    // message index (system, message), -1 for tools
	role       string // a constant for the usual roles, else a copy
	head       int
	start, end int
	hash       uint64 // of header and body
}

// Prompt is one chat request's prompt in its canonical rendering, cut into
// parts: the leading system and developer messages, the tool definitions
// (each compacted, one a line), then the other messages, each as its role,
// its text (a string, or the text of its parts; other parts as compact
// JSON) and its tool calls. Formatting of the JSON body does not change the
// rendering; key order inside tools and tool calls does, as it does in a
// chat template's output. Build one with NewPrompt or ParseChat. A Prompt
// owns copies of what it needs and does not refer to the body. It is not
// safe for concurrent mutation (SetBlocks).
type Prompt struct {
	text  []byte
	parts []span
	tools []span // each tool's line inside the tools part's body
	// blocks and blockTokens are the prompt's token block hashes, when
	// the caller has them (SetBlocks).
	blocks      []uint64
	blockTokens int
}

// ErrNotChat is returned for a body that is not a JSON object with a
// messages array.
var ErrNotChat = errors.New("misses: not a chat body: want an object with a messages array")

// ParseChat builds the Prompt of a chat-completions request body, which
// it first checks is valid JSON (NewPrompt trusts its caller for that).
func ParseChat(body []byte) (*Prompt, error) {
	if !gjson.ValidBytes(body) {
		return nil, ErrNotChat
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return nil, ErrNotChat
	}
	return NewPrompt(root.Get("messages"), root.Get("tools"))
}

// NewPrompt builds a Prompt from a chat request's messages and tools
// (tools may be absent or null), as gjson views such as the gateway's
// parsed request holds; they must come from valid JSON.
func NewPrompt(messages, tools gjson.Result) (*Prompt, error) {
	if !messages.IsArray() {
		return nil, ErrNotChat
	}
	var msgs []message
	messages.ForEach(func(_, m gjson.Result) bool {
		msgs = append(msgs, fieldsOf(m))
		return true
	})
	// The rendering is no longer than the JSON plus a header a part.
	p := &Prompt{text: make([]byte, 0, len(messages.Raw)+len(tools.Raw)+32*(len(msgs)+1))}
	lead := 0
	for lead < len(msgs) && isSystem(msgs[lead].role.Str) {
		lead++
	}
	for i, m := range msgs[:lead] {
		p.addMessage(PartSystem, i, m)
	}
	if tools.IsArray() && len(tools.Array()) > 0 {
		p.addTools(tools)
	}
	for i, m := range msgs[lead:] {
		p.addMessage(PartMessage, lead+i, m)
	}
	return p, nil
}

func isSystem(role string) bool { return role == "system" || role == "developer" }

// message is a message's fields the rendering reads.
type message struct{ role, content, toolCalls gjson.Result }

// fieldsOf reads a message's fields in one pass (the first of each).
func fieldsOf(m gjson.Result) message {
	var f message
	m.ForEach(func(k, v gjson.Result) bool {
		switch {
		case k.Str == "role" && !f.role.Exists():
			f.role = v
		case k.Str == "content" && !f.content.Exists():
			f.content = v
		case k.Str == "tool_calls" && !f.toolCalls.Exists():
			f.toolCalls = v
		}
		return true
	})
	return f
}

// addMessage renders message m as part kind.
func (p *Prompt) addMessage(kind Part, index int, m message) {
	s := p.open(kind, index, canonicalRole(m.role.String()))
	switch content := m.content; {
	case content.Type == gjson.String:
		p.text = append(p.text, content.Str...)
	case content.IsArray():
		content.ForEach(func(_, part gjson.Result) bool {
			if t := part.Get("text"); t.Type == gjson.String {
				p.text = append(p.text, t.Str...)
			} else {
				p.text = appendCompact(p.text, part.Raw)
			}
			return true
		})
	}
	if tc := m.toolCalls; tc.Exists() && tc.Type != gjson.Null {
		p.text = append(p.text, 0)
		p.text = appendCompact(p.text, tc.Raw)
	}
	p.close(s)
}

// addTools renders the tool definitions, one compact tool a line.
func (p *Prompt) addTools(tools gjson.Result) {
	s := p.open(PartTools, -1, "")
	for i, t := range tools.Array() {
		if i > 0 {
			p.text = append(p.text, '\n')
		}
		start := len(p.text)
		p.text = appendCompact(p.text, t.Raw)
		p.tools = append(p.tools, span{part: PartTools, index: i, start: start, end: len(p.text),
			hash: xxhash.Sum64(p.text[start:])})
	}
	p.close(s)
}

// open starts a part: its header is a NUL, its kind and role, and a NUL.
func (p *Prompt) open(kind Part, index int, role string) span {
	s := span{part: kind, index: index, role: role, head: len(p.text)}
	p.text = append(p.text, 0)
	p.text = append(p.text, kind.String()...)
	p.text = append(p.text, ' ')
	p.text = append(p.text, role...)
	p.text = append(p.text, 0)
	s.start = len(p.text)
	return s
}

func (p *Prompt) close(s span) {
	s.end = len(p.text)
	s.hash = xxhash.Sum64(p.text[s.head:s.end])
	p.parts = append(p.parts, s)
}

// canonicalRole returns role as a constant for the usual roles, so a
// Prompt never keeps a string that aliases a request body.
func canonicalRole(role string) string {
	for _, r := range [...]string{"system", "developer", "user", "assistant", "tool", "function"} {
		if role == r {
			return r
		}
	}
	return strings.Clone(role)
}

// appendCompact appends raw JSON without insignificant whitespace (raw as
// is if it is not valid JSON).
func appendCompact(b []byte, raw string) []byte {
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(raw)); err != nil {
		return append(b, raw...)
	}
	return append(b, buf.Bytes()...)
}

// SetBlocks gives the prompt its token block hashes (the prefix index's
// chained block keys, blockTokens tokens each), so that Locate and
// Fingerprint can place a break by token blocks rather than by the
// approximation from bytes. The Prompt keeps blocks; the caller must not
// modify it afterwards.
func (p *Prompt) SetBlocks(blocks []uint64, blockTokens int) {
	if blockTokens <= 0 {
		blocks = nil
	}
	p.blocks, p.blockTokens = blocks, blockTokens
}

// Len returns the length of the canonical rendering in bytes.
func (p *Prompt) Len() int { return len(p.text) }
