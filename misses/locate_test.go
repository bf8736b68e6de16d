package misses

import (
	"encoding/json"
	"strings"
	"testing"
)

// weatherTools are tool definitions as an agent sends them.
var weatherTools = []string{
	`{"type":"function","function":{"name":"get_weather","description":"Current weather for a city.","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}`,
	`{"type":"function","function":{"name":"search_web","description":"Search the web.","parameters":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}}}`,
	`{"type":"function","function":{"name":"read_file","description":"Read a file from the workspace.","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}}`,
	`{"type":"function","function":{"name":"run_shell","description":"Run a shell command.","parameters":{"type":"object","properties":{"cmd":{"type":"string"}}}}}`,
}

// msg is a chat message: role and content.
type msg struct{ role, content string }

// chatBody renders a chat-completions body.
func chatBody(t testing.TB, tools []string, msgs ...msg) []byte {
	t.Helper()
	var ms []map[string]any
	for _, m := range msgs {
		ms = append(ms, map[string]any{"role": m.role, "content": m.content})
	}
	body := map[string]any{"model": "qwen3-8b", "messages": ms, "stream": true}
	if tools != nil {
		raw := make([]json.RawMessage, len(tools))
		for i, s := range tools {
			raw[i] = json.RawMessage(s)
		}
		body["tools"] = raw
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustPrompt(t testing.TB, body []byte) *Prompt {
	t.Helper()
	p, err := ParseChat(body)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

const sysPrompt = "You are Atlas, a coding assistant for the Acme monorepo. Follow the style guide, prefer small diffs, and explain your reasoning briefly."

var (
	turn1 = []msg{{"system", sysPrompt}, {"user", "Why does the build fail on main?"}}
	turn2 = append(append([]msg(nil), turn1...), msg{"assistant", "The linker cannot find libfoo; the Makefile dropped it."}, msg{"user", "Fix it, please."})
)

func TestLocate(t *testing.T) {
	stamped := func(ts string, ms []msg) []msg {
		out := append([]msg(nil), ms...)
		out[0].content = "Current time: " + ts + ". " + sysPrompt
		return out
	}
	shuffled := []string{weatherTools[2], weatherTools[0], weatherTools[3], weatherTools[1]}
	editedTool := append([]string(nil), weatherTools...)
	editedTool[1] = strings.Replace(editedTool[1], "Search the web.", "Search the web (results as of today).", 1)
	rewritten := append([]msg(nil), turn2...)
	rewritten[1].content = "Why does the build fail on main? (summarised)"
	tests := []struct {
		name         string
		prev, cur    []byte
		kind         Kind
		change       Change
		part         Part
		index        int
		role         string
		offsetAtMost int // the true offset inside the part; Offset is at most this, and within a granule of it
	}{
		{name: "appends only", prev: chatBody(t, weatherTools, turn1...), cur: chatBody(t, weatherTools, turn2...),
			kind: KindExtends, part: PartTail, index: 2, role: "assistant", offsetAtMost: -1},
		{name: "timestamp in system prompt", prev: chatBody(t, nil, stamped("2026-12-06T21:00:00Z", turn1)...),
			cur: chatBody(t, nil, stamped("2026-12-06T21:00:42Z", turn2)...), kind: KindBreak, change: ChangeEdited,
			part: PartSystem, index: 0, role: "system", offsetAtMost: len("Current time: 2026-12-06T21:00:")},
		{name: "tools shuffled", prev: chatBody(t, weatherTools, turn1...), cur: chatBody(t, shuffled, turn2...),
			kind: KindBreak, change: ChangeToolsReordered, part: PartTools, index: 0, offsetAtMost: 0},
		{name: "tool description edited", prev: chatBody(t, weatherTools, turn1...), cur: chatBody(t, editedTool, turn2...),
			kind: KindBreak, change: ChangeEdited, part: PartTools, index: 1,
			offsetAtMost: len(weatherTools[0]) + 1 + strings.Index(weatherTools[1], "Search the web") + len("Search the web")},
		{name: "earlier message rewritten", prev: chatBody(t, weatherTools, turn2...),
			cur:  chatBody(t, weatherTools, append(rewritten, msg{"assistant", "Done."}, msg{"user", "Thanks"})...),
			kind: KindBreak, change: ChangeRewritten, part: PartMessage, index: 1, role: "user",
			offsetAtMost: len("Why does the build fail on main?")},
		{name: "system prompt dropped", prev: chatBody(t, weatherTools, turn1...), cur: chatBody(t, weatherTools, turn2[1:]...),
			kind: KindBreak, change: ChangeRemoved, part: PartSystem, index: 0, role: "system", offsetAtMost: 0},
		{name: "tools added", prev: chatBody(t, nil, turn1...), cur: chatBody(t, weatherTools, turn2...),
			kind: KindBreak, change: ChangeInserted, part: PartTools, index: -1, offsetAtMost: 0},
		{name: "regenerate", prev: chatBody(t, weatherTools, turn2...), cur: chatBody(t, weatherTools, turn2...),
			kind: KindPrefix, part: PartNone, index: -1, offsetAtMost: -1},
		{name: "last turn dropped", prev: chatBody(t, weatherTools, turn2...), cur: chatBody(t, weatherTools, turn1...),
			kind: KindPrefix, part: PartNone, index: -1, offsetAtMost: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prev := mustPrompt(t, tt.prev).Fingerprint(Options{})
			d := Locate(prev, mustPrompt(t, tt.cur), Options{})
			if d.Kind != tt.kind || d.Change != tt.change || d.Part != tt.part || d.Index != tt.index || d.Role != tt.role {
				t.Fatalf("got %v/%v part %v index %d role %q; want %v/%v part %v index %d role %q",
					d.Kind, d.Change, d.Part, d.Index, d.Role, tt.kind, tt.change, tt.part, tt.index, tt.role)
			}
			if tt.offsetAtMost >= 0 && (d.Offset > tt.offsetAtMost || d.Offset < tt.offsetAtMost-DefaultGranuleBytes) {
				t.Errorf("got offset %d; want within a granule below %d", d.Offset, tt.offsetAtMost)
			}
			if d.Broke() != (tt.kind == KindBreak) {
				t.Errorf("Broke() = %v", d.Broke())
			}
			if d.Broke() && d.Matched != d.Token {
				t.Errorf("got Matched %d, Token %d; want equal for a break", d.Matched, d.Token)
			}
			if d.Excerpt != "" {
				t.Errorf("got excerpt %q without Options.Excerpts", d.Excerpt)
			}
		})
	}
}

func TestLocateTimestampOffsets(t *testing.T) {
	prefix := "Current time: 2026-12-06T21:00:"
	prev := chatBody(t, nil, msg{"system", prefix + "00Z. " + sysPrompt}, msg{"user", "hi"})
	cur := chatBody(t, nil, msg{"system", prefix + "42Z. " + sysPrompt}, msg{"user", "hi"}, msg{"assistant", "hello"}, msg{"user", "go on"})
	fp := mustPrompt(t, prev).Fingerprint(Options{})
	d := Locate(fp, mustPrompt(t, cur), Options{Excerpts: true})
	header := len("\x00system system\x00")
	if d.Byte != header+d.Offset {
		t.Errorf("got Byte %d, Offset %d; want Byte = header (%d) + Offset", d.Byte, d.Offset, header)
	}
	if want := d.Byte / 4; d.Token != want || d.Block != want/DefaultBlockTokens || d.Exact {
		t.Errorf("got token %d block %d exact %v; want %d, %d, false", d.Token, d.Block, d.Exact, want, want/DefaultBlockTokens)
	}
	if !strings.Contains(d.Excerpt, "21:00:42Z") {
		t.Errorf("got excerpt %q; want the timestamp in it", d.Excerpt)
	}
	if d.PrevHash == d.CurHash || len(d.PrevHash) != 8 || len(d.CurHash) != 8 {
		t.Errorf("got hashes %q, %q; want two different 8-digit hashes", d.PrevHash, d.CurHash)
	}
	if d.Previous <= 0 || d.Matched >= d.Previous {
		t.Errorf("got Previous %d, Matched %d; want 0 < Matched < Previous", d.Previous, d.Matched)
	}
}

func TestLocateBlocks(t *testing.T) {
	prev := mustPrompt(t, chatBody(t, weatherTools, turn1...))
	prev.SetBlocks([]uint64{1, 2, 3, 4, 5}, 16)
	fp := prev.Fingerprint(Options{})
	cur := mustPrompt(t, chatBody(t, weatherTools, append([]msg{{"system", "changed"}}, turn2[1:]...)...))
	cur.SetBlocks([]uint64{1, 2, 9, 9, 9, 9, 9}, 16)
	d := Locate(fp, cur, Options{})
	if d.Block != 2 || d.Token != 32 || !d.Exact || d.Matched != 32 || d.Previous != 80 {
		t.Errorf("got block %d token %d exact %v matched %d previous %d; want 2 32 true 32 80", d.Block, d.Token, d.Exact, d.Matched, d.Previous)
	}
	fp.Tokens = 77
	ext := mustPrompt(t, chatBody(t, weatherTools, turn2...))
	if d := Locate(fp, ext, Options{}); d.Kind != KindExtends || d.Matched != 77 || d.Token != 77 || !d.Exact {
		t.Errorf("got %v matched %d token %d exact %v; want extends 77 77 true", d.Kind, d.Matched, d.Token, d.Exact)
	}
}

func TestLocateFormattingIsNotABreak(t *testing.T) {
	compact := `{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]}]}`
	spaced := `{ "model": "m",
	  "messages": [ {"role": "system", "content": "s"}, {"content": [{"text": "hi", "type": "text"}], "role": "user"},
	                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]} ],
	  "tools": [ { "type": "function", "function": { "name": "f", "parameters": {} } } ] }`
	d := Locate(mustPrompt(t, []byte(compact)).Fingerprint(Options{}), mustPrompt(t, []byte(spaced)), Options{})
	if d.Kind != KindExtends {
		t.Errorf("got %v at %v %d; want extends", d.Kind, d.Part, d.Index)
	}
}

func TestLocateFirst(t *testing.T) {
	if d := Locate(nil, mustPrompt(t, chatBody(t, nil, turn1...)), Options{}); d.Kind != KindFirst || d.Broke() {
		t.Errorf("got %v; want first", d.Kind)
	}
}

func TestParseChatErrors(t *testing.T) {
	for _, body := range []string{``, `[]`, `{"messages":{}}`, `{"model":"m"}`, `not json`} {
		if _, err := ParseChat([]byte(body)); err == nil {
			t.Errorf("ParseChat(%q): got no error", body)
		}
	}
}

func TestFingerprintKeepsNoText(t *testing.T) {
	secret := "my-secret-system-prompt-text"
	fp := mustPrompt(t, chatBody(t, nil, msg{"system", secret}, msg{"user", "hello"})).Fingerprint(Options{})
	b, err := json.Marshal(fp)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "secret") || strings.Contains(string(b), "hello") {
		t.Errorf("fingerprint %s holds prompt text", b)
	}
}

func TestLocateTemplateBreak(t *testing.T) {
	prev := mustPrompt(t, chatBody(t, weatherTools, turn1...))
	prev.SetBlocks([]uint64{1, 2, 3, 4, 5, 6, 7, 8}, 16)
	fp := prev.Fingerprint(Options{})
	cur := mustPrompt(t, chatBody(t, weatherTools, turn2...))
	cur.SetBlocks([]uint64{1, 2, 3, 4, 5, 6, 70, 80, 90, 100}, 16)
	d := Locate(fp, cur, Options{})
	if d.Kind != KindBreak || d.Change != ChangeTemplate || d.Block != 6 || d.Token != 96 || d.Matched != 96 || !d.Exact {
		t.Errorf("got %v/%v block %d token %d matched %d; want break/template 6 96 96", d.Kind, d.Change, d.Block, d.Token, d.Matched)
	}
	if d.Part != PartTools {
		t.Errorf("got part %v; want tools (byte %d of the rendering)", d.Part, d.Byte)
	}
	cur.SetBlocks([]uint64{1, 2, 3, 4, 5, 6, 7, 8, 90, 100}, 16)
	if d := Locate(fp, cur, Options{}); d.Kind != KindExtends || d.Token != 128 {
		t.Errorf("got %v token %d; want extends at 128", d.Kind, d.Token)
	}
}
