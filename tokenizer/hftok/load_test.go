package hftok

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// tinyTokenizer is a byte-level BPE tokenizer.json small enough to read:
// the 256 bytes (ids 0–255, in byte order), merges "h e" → 256, "he l" →
// 257, "l o" → 258, "hel lo" → 259, "Ġ w" → 260, the Qwen2 pattern, and
// <|end|> (300) as a special token. edit changes the decoded file first.
func tinyTokenizer(t testing.TB, edit func(f map[string]any)) []byte {
	t.Helper()
	vocab := map[string]any{}
	for b, r := range byteRunes {
		vocab[string(r)] = b
	}
	merges := []any{[]any{"h", "e"}, []any{"he", "l"}, []any{"l", "o"}, []any{"hel", "lo"}, "Ġ w"}
	for i, m := range []string{"he", "hel", "lo", "hello", "Ġw"} {
		vocab[m] = 256 + i
	}
	f := map[string]any{
		"added_tokens": []any{map[string]any{"id": 300, "content": "<|end|>", "special": true}},
		"normalizer":   map[string]any{"type": "NFC"},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": qwen2Pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		}},
		"post_processor": map[string]any{"type": "ByteLevel"},
		"model":          map[string]any{"type": "BPE", "vocab": vocab, "merges": merges},
	}
	if edit != nil {
		edit(f)
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustParse(t testing.TB, tj []byte) *Tokenizer {
	t.Helper()
	tok, err := Parse(tj, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func encode(t testing.TB, tok *Tokenizer, s string, special bool) []uint32 {
	t.Helper()
	ids, err := tok.Encode(s, special)
	if err != nil {
		t.Fatalf("Encode(%q): %v", s, err)
	}
	return ids
}

func TestEncodeTiny(t *testing.T) {
	tok := mustParse(t, tinyTokenizer(t, nil))
	for _, c := range []struct {
		in   string
		want []uint32
	}{
		{"hello", []uint32{259}},
		{"hello world", []uint32{259, 260, 'o', 'r', 'l', 'd'}},
		{"hel", []uint32{257}},
		{"helo", []uint32{257, 'o'}}, // "he l" ranks before "l o"
		{"hello<|end|>x", []uint32{259, 300, 'x'}},
		{"a1234", []uint32{'a', '1', '2', '3', '4'}},
		{"", nil},
	} {
		if got := encode(t, tok, c.in, true); !slices.Equal(got, c.want) && !(len(got) == 0 && len(c.want) == 0) {
			t.Errorf("Encode(%q) = %v; want %v", c.in, got, c.want)
		}
	}
	// NFC: a decomposed é encodes as the composed one (C3 A9).
	if got := encode(t, tok, "e\u0301", false); !slices.Equal(got, []uint32{0xC3, 0xA9}) {
		t.Errorf("Encode(e + combining acute) = %v; want the bytes of é", got)
	}
	if _, err := tok.Encode("\xff", false); err == nil {
		t.Error("Encode of invalid UTF-8 succeeded")
	}
}

// A TemplateProcessing post-processor adds its special tokens around a
// sequence encoded with special tokens, and nothing without.
func TestTemplateProcessing(t *testing.T) {
	tok := mustParse(t, tinyTokenizer(t, func(f map[string]any) {
		f["post_processor"] = map[string]any{"type": "Sequence", "processors": []any{
			map[string]any{"type": "ByteLevel"},
			map[string]any{"type": "TemplateProcessing",
				"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}, map[string]any{"SpecialToken": map[string]any{"id": "</s>"}}},
				"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []any{301}}, "</s>": map[string]any{"ids": []any{302}}}},
		}}
	}))
	if got := encode(t, tok, "he", true); !slices.Equal(got, []uint32{301, 256, 302}) {
		t.Errorf("with special tokens: %v", got)
	}
	if got := encode(t, tok, "he", false); !slices.Equal(got, []uint32{256}) {
		t.Errorf("without: %v", got)
	}
}

// Added tokens with lstrip / rstrip take the whitespace beside them; the
// longest added token at a position wins.
func TestAddedTokenStrip(t *testing.T) {
	tok := mustParse(t, tinyTokenizer(t, func(f map[string]any) {
		f["added_tokens"] = []any{
			map[string]any{"id": 300, "content": "<m>", "lstrip": true, "rstrip": true},
			map[string]any{"id": 301, "content": "<m>>"},
		}
	}))
	if got := encode(t, tok, "a  <m>  b", false); !slices.Equal(got, []uint32{'a', 300, 'b'}) {
		t.Errorf("lstrip/rstrip: %v", got)
	}
	if got := encode(t, tok, "<m>>", false); !slices.Equal(got, []uint32{301}) {
		t.Errorf("longest first: %v", got)
	}
}

// Ignore_merges takes a whole word that is in the vocab as one token,
// even when its merges would not reach it.
func TestIgnoreMerges(t *testing.T) {
	edit := func(ignore bool) func(map[string]any) {
		return func(f map[string]any) {
			m := f["model"].(map[string]any)
			m["vocab"].(map[string]any)["ab"] = 290 // no merge makes it
			m["ignore_merges"] = ignore
		}
	}
	if got := encode(t, mustParse(t, tinyTokenizer(t, edit(true))), "ab", false); !slices.Equal(got, []uint32{290}) {
		t.Errorf("ignore_merges: %v", got)
	}
	if got := encode(t, mustParse(t, tinyTokenizer(t, edit(false))), "ab", false); !slices.Equal(got, []uint32{'a', 'b'}) {
		t.Errorf("merges: %v", got)
	}
}

// What hftok does not implement is refused at load, naming it.
func TestParseRefuses(t *testing.T) {
	set := func(key string, v any) func(map[string]any) { return func(f map[string]any) { f[key] = v } }
	model := func(key string, v any) func(map[string]any) {
		return func(f map[string]any) { f["model"].(map[string]any)[key] = v }
	}
	for _, c := range []struct {
		name string
		edit func(map[string]any)
		want string
	}{
		{"unigram", model("type", "Unigram"), `"Unigram" is not supported`},
		{"wordpiece", model("type", "WordPiece"), `"WordPiece" is not supported`},
		{"byte fallback", model("byte_fallback", true), "byte_fallback"},
		{"dropout", model("dropout", 0.1), "dropout"},
		{"suffix", model("end_of_word_suffix", "</w>"), "end_of_word_suffix"},
		{"no byte", func(f map[string]any) { delete(f["model"].(map[string]any)["vocab"].(map[string]any), "Ġ") }, "no token for byte 0x20"},
		{"bad merge", model("merges", []any{"h e x"}), "merges[0]"},
		{"merge out of vocab", model("merges", []any{"e h"}), "not in the vocab"},
		{"normalizer", set("normalizer", map[string]any{"type": "NFKC"}), `"NFKC" is not supported`},
		{"lowercase", set("normalizer", map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "NFC"}, map[string]any{"type": "Lowercase"}}}), "more than one"},
		{"metaspace", set("pre_tokenizer", map[string]any{"type": "Metaspace"}), `"Metaspace" is not supported`},
		{"no byte level", set("pre_tokenizer", nil), "no ByteLevel"},
		{"prefix space", set("pre_tokenizer", map[string]any{"type": "ByteLevel", "add_prefix_space": true}), "add_prefix_space"},
		{"split merged", set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\s`}, "behavior": "MergedWithPrevious"}, map[string]any{"type": "ByteLevel"}}}), "MergedWithPrevious"},
		{"bad regex", set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `(`}, "behavior": "Isolated"}, map[string]any{"type": "ByteLevel"}}}), "Split pattern"},
		{"roberta", set("post_processor", map[string]any{"type": "RobertaProcessing"}), `"RobertaProcessing" is not supported`},
		{"single word", set("added_tokens", []any{map[string]any{"id": 1, "content": "x", "single_word": true}}), "single_word"},
		{"not json", nil, "tokenizer.json"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tj := []byte("{not json")
			if c.edit != nil {
				tj = tinyTokenizer(t, c.edit)
			}
			if _, err := Parse(tj, nil, ""); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Parse: err = %v; want one containing %q", err, c.want)
			}
		})
	}
}

// Load reads the three files of a model directory; chat_template.jinja
// wins over the config's chat_template, and the config's special tokens
// reach the template.
func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(TokenizerFile, string(tinyTokenizer(t, nil)))
	write(TokenizerConfigFile, `{"chat_template": "config {{ bos_token }}", "bos_token": {"content": "<s>", "lstrip": false}}`)
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if text, err := tok.renderBody([]byte(`{"messages":[]}`)); err != nil || text != "config <s>" {
		t.Errorf("config template: %q, %v", text, err)
	}
	write(ChatTemplateFile, "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}")
	if tok, err = Load(dir); err != nil {
		t.Fatal(err)
	}
	text, err := tok.renderBody([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null}]}`))
	if err != nil || text != "[user:a\nb][assistant:]>" {
		t.Errorf("chat_template.jinja: %q, %v", text, err)
	}
	write(ChatTemplateFile, "{% for %}")
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "chat template") {
		t.Errorf("a template that does not compile: err = %v", err)
	}
	if _, err := Load(t.TempDir()); err == nil {
		t.Error("Load of an empty directory succeeded")
	}
}

// TokenizeBody refuses what it cannot render as vLLM does, so the
// gateway asks a replica.
func TestTokenizeBodyRefuses(t *testing.T) {
	tok := mustParse(t, tinyTokenizer(t, nil))
	for _, body := range []string{
		`{"messages":[{"role":"user","content":"x"}]}`, // no chat template
		`{"prompt":["a","b"]}`,
		`{"prompt":"a","chat_template_kwargs":{"enable_thinking":false}}`,
		`{"prompt":"a","continue_final_message":true}`,
		`not json`,
	} {
		if ids, err := tok.TokenizeBody([]byte(body)); err == nil {
			t.Errorf("TokenizeBody(%s) = %v; want an error", body, ids)
		}
	}
	withChat, err := Parse(tinyTokenizer(t, nil), nil, "{% for m in messages %}{{ m.content }}{% endfor %}")
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
		`{"messages":[{"content":"no role"}]}`,
		`{"messages":{"role":"user"}}`,
		`{"messages":[{"role":"assistant","content":"","tool_calls":[{"type":"custom","custom":{}}]}]}`,
	} {
		if ids, err := withChat.TokenizeBody([]byte(body)); err == nil {
			t.Errorf("TokenizeBody(%s) = %v; want an error", body, ids)
		}
	}
	ids, err := withChat.TokenizeBody([]byte(`{"messages":[{"role":"user","content":"hello"}]}`))
	if err != nil || !slices.Equal(ids, []uint32{259}) {
		t.Errorf("chat body: %v, %v", ids, err)
	}
}

// Values the engine's tojson writes unlike Python's json.dumps (1.0 as
// 1, U+2028 escaped) in tools or tool call arguments send the body to
// the replicas; others render.
func TestTojsonUnlikePythonRefused(t *testing.T) {
	tok, err := Parse(tinyTokenizer(t, nil), nil, `{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}{{ tools | tojson }}`)
	if err != nil {
		t.Fatal(err)
	}
	call := func(args string) string {
		return `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":` + args + `}}]}]}`
	}
	for _, body := range []string{
		call(`"{\"t\": 1.0}"`),
		call(`"{\"t\": 1e5}"`),
		call(`"{\"s\": \"a\u2028b\"}"`),
		`{"messages":[],"tools":[{"type":"function","function":{"name":"f","parameters":{"minimum":0.0}}}]}`,
	} {
		if _, err := tok.renderBody([]byte(body)); err == nil {
			t.Errorf("renderBody(%s) succeeded; want it refused", body)
		}
	}
	text, err := tok.renderBody([]byte(call(`"{\"t\": 1.5, \"n\": 2, \"s\": \"é\"}"`)))
	if want := `{"t": 1.5, "n": 2, "s": "é"}`; err != nil || !strings.HasPrefix(text, want) {
		t.Errorf("renderBody = %q, %v; want it to start with %q", text, err, want)
	}
}
