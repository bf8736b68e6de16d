package simtok

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestTokenizeOneTokenPerWord(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	words := []string{"hello", "world", "Token123", "héllo", "日本語", "42", "x", "kato", "zuzuzu", "ka", "QWERTY", "a1b2"}
	for i := 0; i < 200; i++ {
		words = append(words, Word(WordBase+uint32(rng.IntN(NumWords))))
	}
	for n := 1; n <= len(words); n += 7 {
		text := strings.Join(words[:n], " ")
		if got := Tokenize(text); len(got) != n {
			t.Fatalf("Tokenize(%d words) = %d tokens, want %d (%q)", n, len(got), n, text)
		}
	}
	for _, w := range words {
		if got := Tokenize(w); len(got) != 1 || !IsWord(got[0]) {
			t.Errorf("Tokenize(%q) = %v, want one word token", w, got)
		}
	}
}

func TestWordIDsRoundTrip(t *testing.T) {
	for id := WordBase; id < WordBase+NumWords; id++ {
		w := Word(id)
		got := Tokenize(w)
		if len(got) != 1 || got[0] != id {
			t.Fatalf("Tokenize(Word(%d) = %q) = %v", id, w, got)
		}
	}
	if Word(5) != "" || Word(WordBase+NumWords) != "" {
		t.Error("Word of a non-word ID should be empty")
	}
}

func TestTokenizeDeterministicGolden(t *testing.T) {
	// Fixed IDs: a change here breaks agreement with other processes'
	// recorded traces and must be deliberate.
	got := Tokenize("<|im_start|>user\nHello, kato zi!<|im_end|>")
	want := []uint32{IMStartToken, 107754, NewlineToken, 77363, ',', WordBase + 3673, WordBase + 97, '!', IMEndToken}
	if !slices.Equal(got, want) {
		t.Errorf("Tokenize = %v, want %v", got, want)
	}
}

func TestTokenizeSeparatorsAndPunctuation(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"", 0},
		{"   \t ", 0},
		{"a  b\tc", 3},
		{"a\nb", 3},
		{"f(x)=y;", 7},
		{"<|im_start|><|im_end|>", 2},
		{"<|im_sta", 5}, // '<', '|', "im", '_', "sta"
	} {
		got := Tokenize(tc.in)
		if len(got) != tc.want {
			t.Errorf("Tokenize(%q) = %v, want %d tokens", tc.in, got, tc.want)
		}
	}
}

func TestDetokenizeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	specials := []uint32{IMStartToken, IMEndToken, EndOfTextToken, ToolCallStartToken, ToolCallEndToken, ThinkStartToken}
	punct := []uint32{'.', ',', '!', '?', ':', ';', '(', ')', '"', '{', '}', '[', ']', '-', '\''}
	for trial := 0; trial < 500; trial++ {
		ids := make([]uint32, rng.IntN(60))
		for i := range ids {
			switch r := rng.IntN(10); {
			case r < 6:
				ids[i] = WordBase + uint32(rng.IntN(NumWords))
			case r < 8:
				ids[i] = punct[rng.IntN(len(punct))]
			case r < 9:
				ids[i] = NewlineToken
			default:
				ids[i] = specials[rng.IntN(len(specials))]
			}
		}
		text := Detokenize(ids)
		if got := Tokenize(text); !slices.Equal(got, ids) {
			t.Fatalf("Tokenize(Detokenize(%v)) = %v (text %q)", ids, got, text)
		}
		// Piecewise detokenization (streaming) equals the whole.
		var b []byte
		prev := NoPrev
		for i := 0; i < len(ids); {
			j := min(len(ids), i+1+rng.IntN(4))
			b = AppendText(b, prev, ids[i:j], false)
			prev = ids[j-1]
			i = j
		}
		if string(b) != text {
			t.Fatalf("piecewise %q != whole %q", b, text)
		}
	}
}

func TestSpecialTokenStrings(t *testing.T) {
	for _, sp := range specialTokens {
		if got := Tokenize(sp.text); len(got) != 1 || got[0] != sp.id {
			t.Errorf("Tokenize(%q) = %v, want [%d]", sp.text, got, sp.id)
		}
		if TokenString(sp.id) != sp.text {
			t.Errorf("TokenString(%d) = %q", sp.id, TokenString(sp.id))
		}
	}
	if got := Detokenize([]uint32{500, 151700}); got != "" {
		t.Errorf("unused IDs detokenize to %q, want empty", got)
	}
}

// conversation is an agent-style exchange exercising every message shape.
func conversation() ([]Message, []Tool) {
	tools := []Tool{{Type: "function", Function: ToolFunction{Name: "read_file", Description: "Read a file.",
		Parameters: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`)}}}
	msgs := []Message{
		{Role: "system", Content: "You are a helpful agent."},
		{Role: "user", Content: "Please use the read_file tool on main.go"},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "call_1", Type: "function", Function: FunctionCall{Name: "read_file", Arguments: `{"path": "main.go"}`}}}},
		{Role: "tool", ToolCallID: "call_1", Content: "package main\n\nfunc main() {}"},
		{Role: "assistant", Content: "The file defines an empty main."},
		{Role: "user", Content: "Thanks! And now?"},
		{Role: "assistant", Content: "Done.", ToolCalls: []ToolCall{{Type: "function", Function: FunctionCall{Name: "read_file", Arguments: `{"path":"a"}`}}, {Type: "function", Function: FunctionCall{Name: "read_file"}}}},
		{Role: "tool", Content: ""},
		{Role: "developer", Content: "be brief"},
	}
	return msgs, tools
}

func TestChatTemplatePrefixProperty(t *testing.T) {
	msgs, tools := conversation()
	for _, withTools := range [][]Tool{nil, tools} {
		for _, noSystem := range []bool{false, true} {
			m := msgs
			if noSystem {
				m = msgs[1:]
			}
			// From one message on: an empty conversation renders a
			// tools-only system block that a first system message replaces.
			for k := 1; k < len(m); k++ {
				a := TokenizeChat(m[:k], withTools, false)
				b := TokenizeChat(m[:k+1], withTools, false)
				if !slices.Equal(b[:len(a)], a) {
					t.Fatalf("tools=%v noSystem=%v: rendering of %d messages is not a prefix of %d", withTools != nil, noSystem, k, k+1)
				}
				if m[k].Role == "assistant" {
					g := TokenizeChat(m[:k], withTools, true)
					if !slices.Equal(b[:len(g)], g) {
						t.Fatalf("generation prompt after %d messages is not a prefix of the assistant turn", k)
					}
				}
				// The text rendering tokenizes the same way as per-message rendering.
				if got := Tokenize(RenderChat(m[:k+1], withTools, false)); !slices.Equal(got, b) {
					t.Fatal("TokenizeChat disagrees with Tokenize(RenderChat)")
				}
			}
		}
	}
	if got := RenderChat([]Message{{Role: "user", Content: "hi"}}, nil, true); got != "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" {
		t.Errorf("RenderChat = %q", got)
	}
}

func TestMessageContentForms(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"role":"user","content":"hi"}`, "hi"},
		{`{"role":"assistant","content":null}`, ""},
		{`{"role":"assistant"}`, ""},
		{`{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}`, "a\nb"},
	} {
		var m Message
		if err := json.Unmarshal([]byte(tc.in), &m); err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		if m.Content != tc.want {
			t.Errorf("%s: content %q, want %q", tc.in, m.Content, tc.want)
		}
	}
	var m Message
	if err := json.Unmarshal([]byte(`{"role":"user","content":5}`), &m); err == nil {
		t.Error("numeric content accepted")
	}
}

func BenchmarkTokenize(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	var sb strings.Builder
	n := 0
	for sb.Len() < 1<<20 {
		if n%13 == 12 {
			sb.WriteString(". ")
		} else if n%29 == 28 {
			sb.WriteString("unknownword ")
		} else {
			sb.WriteString(Word(WordBase + uint32(rng.IntN(NumWords))))
			sb.WriteByte(' ')
		}
		n++
	}
	text := sb.String()
	tokens := len(Tokenize(text))
	dst := make([]uint32, 0, tokens)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendTokens(dst[:0], text)
	}
	b.ReportMetric(float64(tokens)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkTokenizeBody is a 16,000-word chat prompt's /tokenize body
// tokenized in process, as a gateway with routing.tokenizer: simulator does.
func BenchmarkTokenizeBody(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 8))
	words := make([]string, 16000)
	for i := range words {
		words[i] = Word(WordBase + uint32(rng.IntN(NumWords)))
	}
	body, _ := json.Marshal(map[string]any{"model": "qwen3-32b", "add_generation_prompt": true,
		"messages": []Message{{Role: "user", Content: strings.Join(words, " ")}}})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := TokenizeBody(body); err != nil {
			b.Fatal(err)
		}
	}
}
