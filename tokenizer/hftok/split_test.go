package hftok

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func pieces(t testing.TB, sp splitter, s string) []string {
	t.Helper()
	var out []string
	if err := sp.split(s, func(p string) { out = append(out, p) }); err != nil {
		t.Fatalf("split(%q): %v", s, err)
	}
	return out
}

// splitters returns the hand splitter and regexp2's for pattern.
func splitters(t testing.TB, pattern string) (hand, re splitter) {
	t.Helper()
	hand, err := newSplitter(pattern, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := hand.(handSplitter); !ok {
		t.Fatalf("no hand splitter for %q", pattern)
	}
	if re, err = newSplitter(pattern, false); err != nil {
		t.Fatal(err)
	}
	return hand, re
}

// regexp2 folds case the .NET way, in which U+017F (long s) is not s;
// Oniguruma (Hugging Face tokenizers) and JavaScript fold it to s, as the
// hand splitter does. Differential inputs leave it out.
func comparable(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 'ſ') }

// The hand splitter cuts the corpus exactly where regexp2 running the
// pattern itself does, for Llama 3's pattern and Qwen2's.
func TestHandSplitMatchesRegexp2(t *testing.T) {
	extra := []string{"'s'S'T're'VE'Ll'd'M'x", "a'sb", "  \t\n x", "x\r\n\r\ny", "1234567 12 1", "?!\n\n\nabc", " ?abc", "\u00a0\u00a0x", "\u3000\u3000"}
	for _, pattern := range []string{llama3Pattern, qwen2Pattern} {
		hand, re := splitters(t, pattern)
		for _, s := range append(slices.Clone(corpusTexts), extra...) {
			if got, want := pieces(t, hand, s), pieces(t, re, s); !slices.Equal(got, want) {
				t.Errorf("split(%q):\n hand   %q\n regexp %q", s, got, want)
			}
		}
	}
	hand, _ := splitters(t, qwen2Pattern)
	if got := pieces(t, hand, "'ſx"); !slices.Equal(got, []string{"'ſ", "x"}) {
		t.Errorf("long s: %q; want it folded to s as Oniguruma does", got)
	}
}

func FuzzHandSplit(f *testing.F) {
	for _, s := range corpusTexts {
		f.Add(s)
	}
	hand3, re3 := splitters(f, llama3Pattern)
	hand1, re1 := splitters(f, qwen2Pattern)
	f.Fuzz(func(t *testing.T, s string) {
		if !comparable(s) {
			pieces(t, hand3, s) // must not panic, whatever the bytes
			return
		}
		for _, p := range [][2]splitter{{hand3, re3}, {hand1, re1}} {
			got, want := pieces(t, p[0], s), pieces(t, p[1], s)
			if !slices.Equal(got, want) {
				t.Fatalf("split(%q):\n hand   %q\n regexp %q", s, got, want)
			}
		}
	})
}
