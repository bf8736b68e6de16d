package hftok

import (
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// splitter is one Split pre-tokenizer step (behavior Isolated): it calls
// emit with each piece of s, in order, matches and the text between them
// alike, so the pieces concatenate back to s.
type splitter interface {
	split(s string, emit func(piece string)) error
}

// The patterns the hand splitter implements: Llama 3's (digits in runs of
// up to three) and Qwen2's (one digit a piece), and GPT-2's, which
// ByteLevel's use_regex applies.
const (
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	gpt2Pattern   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// regexTimeout bounds one regexp2 split, whose backtracking has no linear
// bound; a split that runs out fails the encode (the replicas tokenize).
const regexTimeout = 2 * time.Second

// newSplitter returns the splitter for pattern: the hand one for the
// Llama 3 and Qwen2 patterns when hand is set, else regexp2.
func newSplitter(pattern string, hand bool) (splitter, error) {
	if hand {
		switch pattern {
		case llama3Pattern:
			return handSplitter{maxDigits: 3}, nil
		case qwen2Pattern:
			return handSplitter{maxDigits: 1}, nil
		}
	}
	re, err := regexp2.Compile(pattern)
	if err != nil {
		return nil, fmt.Errorf("Split pattern %q: %w", pattern, err)
	}
	re.MatchTimeout = regexTimeout
	return regexSplitter{re}, nil
}

// regexSplitter splits with regexp2 (.NET syntax, which has the
// lookahead these patterns need and Go's regexp lacks).
type regexSplitter struct{ re *regexp2.Regexp }

func (r regexSplitter) split(s string, emit func(string)) error {
	idx, err := r.re.FindAllStringIndex(s, -1)
	if err != nil {
		return err
	}
	at := 0
	for _, m := range idx {
		if m[0] > at {
			emit(s[at:m[0]])
		}
		if m[1] > m[0] {
			emit(s[m[0]:m[1]])
		}
		at = m[1]
	}
	if at < len(s) {
		emit(s[at:])
	}
	return nil
}

// handSplitter is the Llama 3 / Qwen2 pattern written out: at each
// position it takes the first alternative that matches, as the regex
// engine does, in one pass without backtracking.
type handSplitter struct{ maxDigits int }

func (h handSplitter) split(s string, emit func(string)) error {
	for len(s) > 0 {
		n := h.next(s)
		emit(s[:n])
		s = s[n:]
	}
	return nil
}

// rune classes of the pattern
const (
	clsOther   = iota // [^\s\p{L}\p{N}]
	clsLetter         // \p{L}
	clsNumber         // \p{N}
	clsSpace          // \s other than \r and \n
	clsNewline        // \r or \n
)

func class(r rune) int {
	switch {
	case r == '\r' || r == '\n':
		return clsNewline
	case r < utf8.RuneSelf:
		return asciiClass[r]
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	case unicode.IsSpace(r):
		return clsSpace
	}
	return clsOther
}

var asciiClass = func() (c [utf8.RuneSelf]int) {
	for r := range rune(utf8.RuneSelf) {
		switch {
		case r == '\r' || r == '\n':
			c[r] = clsNewline
		case unicode.IsLetter(r):
			c[r] = clsLetter
		case unicode.IsNumber(r):
			c[r] = clsNumber
		case unicode.IsSpace(r):
			c[r] = clsSpace
		default:
			c[r] = clsOther
		}
	}
	return c
}()

// at decodes the rune at s[i:] and its class; width 0 past the end.
func at(s string, i int) (r rune, cls, width int) {
	if i >= len(s) {
		return 0, -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), asciiClass[c], 1
	}
	r, width = utf8.DecodeRuneInString(s[i:])
	return r, class(r), width
}

// run returns the end of the run of runes from i of class want (or,
// with newline set, of class clsNewline too: \s), stopping after max
// runes (0: no limit).
func run(s string, i, max, want int) int {
	for n := 0; max == 0 || n < max; n++ {
		if i < len(s) && s[i] < utf8.RuneSelf { // ASCII without decoding
			if c := asciiClass[s[i]]; c == want || want == clsSpace && c == clsNewline {
				i++
				continue
			}
			break
		}
		_, c, w := at(s, i)
		if w == 0 || c != want && !(want == clsSpace && c == clsNewline) {
			break
		}
		i += w
	}
	return i
}

// next returns the length of the piece s starts with (s is not empty).
func (h handSplitter) next(s string) int {
	r0, c0, w0 := at(s, 0)
	if r0 == '\'' {
		if n := contraction(s); n > 0 {
			return n // (?i:'s|'t|'re|'ve|'m|'ll|'d)
		}
	}
	_, c1, _ := at(s, w0)
	switch {
	case c0 == clsLetter: // \p{L}+
		return run(s, w0, 0, clsLetter)
	case c0 != clsNewline && c0 != clsNumber && c1 == clsLetter: // [^\r\n\p{L}\p{N}]\p{L}+
		return run(s, w0, 0, clsLetter)
	case c0 == clsNumber: // \p{N}{1,max}
		return run(s, 0, h.maxDigits, clsNumber)
	case r0 == ' ' && c1 == clsOther: // ' '[^\s\p{L}\p{N}]+[\r\n]*
		return run(s, run(s, w0, 0, clsOther), 0, clsNewline)
	case c0 == clsOther: // [^\s\p{L}\p{N}]+[\r\n]*
		return run(s, run(s, 0, 0, clsOther), 0, clsNewline)
	}
	return spaces(s)
}

// spaces matches \s*[\r\n]+ | \s+(?!\S) | \s+ at the start of s, which
// starts with whitespace.
func spaces(s string) int {
	end, lastNL, last := 0, -1, 0
	for {
		_, c, w := at(s, end)
		if w == 0 || c != clsSpace && c != clsNewline {
			break
		}
		if c == clsNewline {
			lastNL = end
		}
		last = end
		end += w
	}
	switch {
	case lastNL >= 0: // \s*[\r\n]+ ends after the run's last newline
		return lastNL + 1
	case end == len(s) || last == 0: // \s+(?!\S) at the end, or \s+
		return end
	}
	return last // \s+(?!\S): all but the last whitespace rune
}

// contraction returns the length of the contraction s starts with (after
// its apostrophe), or 0. Case is ignored as the pattern's (?i) does,
// Unicode folding included: U+017F (long s) folds to s.
func contraction(s string) int {
	r1, _, w1 := at(s, 1)
	switch r1 {
	case 's', 'S', 'ſ', 't', 'T', 'm', 'M', 'd', 'D':
		return 1 + w1
	}
	r2, _, w2 := at(s, 1+w1)
	pair := [2]rune{unicode.ToLower(r1), unicode.ToLower(r2)}
	switch pair {
	case [2]rune{'r', 'e'}, [2]rune{'v', 'e'}, [2]rune{'l', 'l'}:
		if w1 == 1 && w2 == 1 { // K (U+212A) and other non-ASCII folds do not apply here
			return 3
		}
	}
	return 0
}
