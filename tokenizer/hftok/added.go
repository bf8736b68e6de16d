package hftok

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
)

// addedSplitter finds added tokens (special or not) in text, leftmost
// first and longest first at the same position, as Hugging Face's
// AddedVocabulary does, so "<|im_start|>" typed in a message is one
// token, as vLLM's /tokenize makes it.
type addedSplitter struct {
	tokens map[string]addedToken // content → token
	lens   []int                 // the contents' distinct lengths, longest first
	first  [256]bool             // bytes a content starts with
}

type addedToken struct {
	id             uint32
	lstrip, rstrip bool // the token takes the whitespace before / after it
}

// newAddedSplitters sorts the added tokens into those matched on the raw
// text and those matched after normalization (normalized: true, when
// there is a normalizer); nil for an empty set.
func newAddedSplitters(toks []addedJSON, normalizer bool) (raw, normed *addedSplitter, err error) {
	var rawToks, normToks []addedJSON
	for _, t := range toks {
		switch {
		case t.Content == "":
			return nil, nil, fmt.Errorf("token %d has no content", t.ID)
		case t.SingleWord:
			return nil, nil, fmt.Errorf("token %q: single_word is not supported", t.Content)
		case t.Normalized && normalizer:
			normToks = append(normToks, t)
		default:
			rawToks = append(rawToks, t)
		}
	}
	return newAddedSplitter(rawToks), newAddedSplitter(normToks), nil
}

func newAddedSplitter(toks []addedJSON) *addedSplitter {
	if len(toks) == 0 {
		return nil
	}
	a := &addedSplitter{tokens: make(map[string]addedToken, len(toks))}
	for _, t := range toks {
		if _, dup := a.tokens[t.Content]; dup {
			continue // the first wins
		}
		a.tokens[t.Content] = addedToken{id: t.ID, lstrip: t.LStrip, rstrip: t.RStrip}
		a.first[t.Content[0]] = true
		if !slices.Contains(a.lens, len(t.Content)) {
			a.lens = append(a.lens, len(t.Content))
		}
	}
	slices.SortFunc(a.lens, func(x, y int) int { return y - x })
	return a
}

// split calls text with each stretch of s between added tokens and id
// with each added token's id, in order. A nil splitter passes s whole.
func (a *addedSplitter) split(s string, text func(string) error, id func(uint32)) error {
	if a == nil {
		return textIfAny(s, text)
	}
	from := 0 // start of the text not yet passed on
	for i := 0; i < len(s); i++ {
		if !a.first[s[i]] {
			continue
		}
		tok, n, ok := a.match(s[i:])
		if !ok {
			continue
		}
		start, end := i, i+n
		if tok.lstrip {
			start = from + len(strings.TrimRightFunc(s[from:start], unicode.IsSpace))
		}
		if tok.rstrip {
			end = len(s) - len(strings.TrimLeftFunc(s[end:], unicode.IsSpace))
		}
		if err := textIfAny(s[from:start], text); err != nil {
			return err
		}
		id(tok.id)
		from = end
		i = end - 1
	}
	return textIfAny(s[from:], text)
}

func textIfAny(s string, text func(string) error) error {
	if s == "" {
		return nil
	}
	return text(s)
}

// match returns the longest added token s starts with.
func (a *addedSplitter) match(s string) (addedToken, int, bool) {
	for _, n := range a.lens {
		if n > len(s) {
			continue
		}
		if tok, ok := a.tokens[s[:n]]; ok {
			return tok, n, true
		}
	}
	return addedToken{}, 0, false
}
