package hftok

import (
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// decode turns ids back into text: what BPE and the added tokens stand for.
func decode(t *Tokenizer, ids []uint32) string {
	byID := map[uint32]string{}
	for s, id := range t.bpe.vocab {
		byID[id] = s
	}
	for _, a := range []*addedSplitter{t.raw, t.normed} {
		if a != nil {
			for s, tok := range a.tokens {
				byID[tok.id] = s
			}
		}
	}
	var sb strings.Builder
	for _, id := range ids {
		sb.WriteString(byID[id])
	}
	return sb.String()
}

// The encoder never panics, and what it encodes decodes back to the
// normalized text: no byte is lost or invented.
func FuzzEncode(f *testing.F) {
	for _, s := range corpusTexts {
		f.Add(s)
	}
	f.Add("hello<|end|>hello<|end|")
	tok := mustParse(f, tinyTokenizer(f, nil))
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := tok.Encode(s, true)
		if !utf8.ValidString(s) {
			if err == nil {
				t.Fatalf("Encode(%q) of invalid UTF-8 succeeded", s)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if got, want := decode(tok, ids), norm.NFC.String(s); got != want {
			t.Fatalf("Encode(%q) decodes to %q; want %q", s, got, want)
		}
	})
}

// Parse, given an operator's tokenizer.json, never panics: it loads it or
// says why not, and a tokenizer it loads encodes without panicking.
func FuzzParse(f *testing.F) {
	f.Add(tinyTokenizer(f, nil))
	f.Add(tinyTokenizer(f, func(m map[string]any) {
		m["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "use_regex": true}
		m["post_processor"] = map[string]any{"type": "TemplateProcessing", "single": []any{map[string]any{"Sequence": map[string]any{"id": "A"}}}}
	}))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{},"merges":[]}}`))
	f.Add([]byte(`{"added_tokens":[{"id":1,"content":""}]}`))
	f.Fuzz(func(t *testing.T, tj []byte) {
		tok, err := Parse(tj, nil, "")
		if err != nil {
			return
		}
		if _, err := tok.Encode("hello <|end|> wörld 123 \n\n ", true); err != nil {
			t.Fatalf("Encode: %v", err)
		}
	})
}

// TokenizeBody, given any body, answers or errs without panicking.
func FuzzTokenizeBody(f *testing.F) {
	for _, b := range corpusBodies("m") {
		f.Add([]byte(b))
	}
	tmpl := `{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}`
	tok, err := Parse(tinyTokenizer(f, nil), nil, tmpl)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		tok.TokenizeBody(body)
	})
}
