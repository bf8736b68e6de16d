package misses

import (
	"testing"
	"unicode/utf8"
)

// FuzzLocate checks Locate on arbitrary pairs of bodies: it does not
// panic, its offsets are in range, its excerpt is valid UTF-8, a prompt
// compared with itself is a KindPrefix, and a break matches fewer tokens
// than the previous prompt had.
func FuzzLocate(f *testing.F) {
	f.Add(string(chatBody(f, weatherTools, turn1...)), string(chatBody(f, weatherTools[1:], turn2...)))
	f.Add(string(chatBody(f, nil, turn2...)), string(chatBody(f, nil, turn2[1:]...)))
	f.Add(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x"}},{"text":"é"}]}]}`,
		`{"messages":[{"role":"user","content":"\xff\u00e9"},{"role":7,"tool_calls":[1,{"a":2}]}],"tools":[{},[]]}`)
	f.Fuzz(func(t *testing.T, a, b string) {
		pa, err := ParseChat([]byte(a))
		if err != nil {
			return
		}
		pb, err := ParseChat([]byte(b))
		if err != nil {
			return
		}
		opt := Options{Excerpts: true, GranuleBytes: 8}
		fa := pa.Fingerprint(opt)
		if d := Locate(fa, pa, opt); d.Kind != KindPrefix {
			t.Fatalf("a prompt against itself: got %v", d.Kind)
		}
		d := Locate(fa, pb, opt)
		if d.Offset < 0 || d.Byte < 0 || d.Byte > pb.Len() || d.Token < 0 || d.Matched < 0 {
			t.Fatalf("offsets out of range: %+v (len %d)", d, pb.Len())
		}
		if !utf8.ValidString(d.Excerpt) {
			t.Fatalf("excerpt %q is not UTF-8", d.Excerpt)
		}
		if d.Broke() && d.Matched > d.Previous {
			t.Fatalf("break matched %d of %d previous tokens", d.Matched, d.Previous)
		}
	})
}
