package simtok

import "strings"

// Token IDs of the simulator's vocabulary. The layout is documented in
// the package doc; in short:
//
//   - 10 is the newline, and 33..126 minus letters and digits are the ASCII
//     punctuation characters, one token each (the ID is the byte value);
//   - [WordBase, WordBase+NumWords) are words, each spelled as 1 to 3
//     consonant-vowel syllables (see Word);
//   - the special tokens below reuse Qwen's IDs, so events look familiar.
//
// Every other ID is unused and detokenizes to the empty string.
const (
	// NewlineToken is the token of "\n".
	NewlineToken uint32 = '\n'
	// WordBase is the first word ID.
	WordBase uint32 = 1000
	// NumWords is the number of word IDs.
	NumWords = 150000
	// VocabSize is the size of the ID space (as Qwen3's).
	VocabSize = 151936

	// EndOfTextToken is "<|endoftext|>", the end-of-sequence token of the
	// completions endpoint.
	EndOfTextToken uint32 = 151643
	// IMStartToken is "<|im_start|>", which opens a chat message.
	IMStartToken uint32 = 151644
	// IMEndToken is "<|im_end|>", which closes a chat message and is the
	// end-of-sequence token of the chat endpoint.
	IMEndToken uint32 = 151645
	// ToolCallStartToken is "<tool_call>".
	ToolCallStartToken uint32 = 151657
	// ToolCallEndToken is "</tool_call>".
	ToolCallEndToken uint32 = 151658
	// ToolResponseStartToken is "<tool_response>".
	ToolResponseStartToken uint32 = 151665
	// ToolResponseEndToken is "</tool_response>".
	ToolResponseEndToken uint32 = 151666
	// ThinkStartToken is "<think>".
	ThinkStartToken uint32 = 151667
	// ThinkEndToken is "</think>".
	ThinkEndToken uint32 = 151668
)

// specialTokens lists the special tokens recognized in text. Tokenize
// matches them only where a '<' starts one, so they cost nothing elsewhere.
var specialTokens = [...]struct {
	text string
	id   uint32
}{
	{"<|endoftext|>", EndOfTextToken},
	{"<|im_start|>", IMStartToken},
	{"<|im_end|>", IMEndToken},
	{"<tool_call>", ToolCallStartToken},
	{"</tool_call>", ToolCallEndToken},
	{"<tool_response>", ToolResponseStartToken},
	{"</tool_response>", ToolResponseEndToken},
	{"<think>", ThinkStartToken},
	{"</think>", ThinkEndToken},
}

const (
	consonants = "bcdfghjklmnprstvwxyz" // 20
	vowels     = "aeiou"                // 5
	numSyl     = len(consonants) * len(vowels)
	// ShortWords is the number of one- and two-syllable words, from which
	// the simulator's generated text draws.
	ShortWords = uint64(numSyl + numSyl*numSyl)
)

// Byte classes used by the tokenizer's scanner.
const (
	clsWord    = iota // part of a word: letters, digits, non-ASCII bytes
	clsSpace          // separator, produces no token: ' ', '\t', '\r', '\v', '\f'
	clsNewline        // '\n', a token of its own
	clsPunct          // other ASCII: a token of its own (ID = byte value)
)

// Precomputed tables (constant after init; not mutable state).
var (
	byteClass [256]uint8
	consIdx   [256]int8
	vowelIdx  [256]int8
)

func init() {
	for c := 0; c < 256; c++ {
		consIdx[c], vowelIdx[c] = -1, -1
		switch {
		case c >= 0x80, c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
			byteClass[c] = clsWord
		case c == ' ', c == '\t', c == '\r', c == '\v', c == '\f':
			byteClass[c] = clsSpace
		case c == '\n':
			byteClass[c] = clsNewline
		default:
			byteClass[c] = clsPunct
		}
	}
	for i := 0; i < len(consonants); i++ {
		consIdx[consonants[i]] = int8(i)
	}
	for i := 0; i < len(vowels); i++ {
		vowelIdx[vowels[i]] = int8(i)
	}
}

// Tokenize returns the token IDs of text. It is deterministic (the same text
// gives the same IDs in every process) and safe for concurrent use.
//
// Spaces, tabs and carriage returns separate words and produce no token;
// a newline and each ASCII punctuation character are one token each; a word
// (a maximal run of letters, digits and non-ASCII bytes) is one token: its
// vocabulary ID when it is spelled as a vocabulary word (see Word), else an
// FNV-1a hash of its bytes folded into the word range. Special tokens such as
// "<|im_start|>" are recognized anywhere in text. So a text of N words
// separated by single spaces has exactly N tokens.
func Tokenize(text string) []uint32 {
	return AppendTokens(make([]uint32, 0, len(text)/5+4), text)
}

// AppendTokens appends the tokens of text to dst and returns the extended
// slice; it allocates only when dst must grow.
func AppendTokens(dst []uint32, text string) []uint32 {
	i := 0
	for i < len(text) {
		c := text[i]
		switch byteClass[c] {
		case clsSpace:
			i++
		case clsNewline:
			dst = append(dst, NewlineToken)
			i++
		case clsPunct:
			if c == '<' {
				if id, n := matchSpecial(text[i:]); n > 0 {
					dst = append(dst, id)
					i += n
					continue
				}
			}
			dst = append(dst, uint32(c))
			i++
		default:
			j := i
			h := uint64(14695981039346656037) // FNV-1a offset basis
			for j < len(text) {
				b := text[j]
				if byteClass[b] != clsWord {
					break
				}
				h = (h ^ uint64(b)) * 1099511628211
				j++
			}
			dst = append(dst, wordToken(text[i:j], h))
			i = j
		}
	}
	return dst
}

func matchSpecial(s string) (uint32, int) {
	if len(s) < 7 {
		return 0, 0
	}
	for _, sp := range specialTokens {
		if strings.HasPrefix(s, sp.text) {
			return sp.id, len(sp.text)
		}
	}
	return 0, 0
}

// wordToken maps a word to its ID: the vocabulary index when w spells one,
// else the hash h folded into the word range.
func wordToken(w string, h uint64) uint32 {
	if n := len(w); n == 2 || n == 4 || n == 6 {
		k := 0
		ok := true
		for p := 0; p < n; p += 2 {
			ci, vi := consIdx[w[p]], vowelIdx[w[p+1]]
			if ci < 0 || vi < 0 {
				ok = false
				break
			}
			k = k*numSyl + int(ci)*len(vowels) + int(vi)
		}
		if ok {
			switch n {
			case 4:
				k += numSyl
			case 6:
				k += numSyl + numSyl*numSyl
			}
			if k < NumWords {
				return WordBase + uint32(k)
			}
		}
	}
	return WordBase + uint32(h%NumWords)
}

// IsWord reports whether id is in the word range.
func IsWord(id uint32) bool { return id >= WordBase && id < WordBase+NumWords }

// Word returns the spelling of word ID id: index k = id − WordBase written in
// base 100 with one consonant-vowel syllable per digit, using one syllable
// for k < 100, two for the next 10,000 and three for the rest. It returns ""
// when id is not a word ID.
func Word(id uint32) string {
	var buf [6]byte
	return string(AppendWord(buf[:0], id))
}

// AppendWord appends Word(id) to dst and returns the extended slice.
func AppendWord(dst []byte, id uint32) []byte {
	if !IsWord(id) {
		return dst
	}
	k := int(id - WordBase)
	syl := 1
	switch {
	case k < numSyl:
	case k < numSyl+numSyl*numSyl:
		k -= numSyl
		syl = 2
	default:
		k -= numSyl + numSyl*numSyl
		syl = 3
	}
	var digits [3]int
	for i := syl - 1; i >= 0; i-- {
		digits[i] = k % numSyl
		k /= numSyl
	}
	for i := 0; i < syl; i++ {
		d := digits[i]
		dst = append(dst, consonants[d/len(vowels)], vowels[d%len(vowels)])
	}
	return dst
}

// TokenString returns the text of one token: a word, a punctuation
// character, "\n", a special token, or "" for an unused ID.
func TokenString(id uint32) string {
	return string(appendToken(nil, id))
}

func appendToken(dst []byte, id uint32) []byte {
	switch {
	case IsWord(id):
		return AppendWord(dst, id)
	case id == uint32(NewlineToken):
		return append(dst, '\n')
	case id < 128 && byteClass[id] == clsPunct:
		return append(dst, byte(id))
	case id >= EndOfTextToken:
		for _, sp := range specialTokens {
			if sp.id == id {
				return append(dst, sp.text...)
			}
		}
	}
	return dst
}

// spaceAfter reports whether a word that follows token prev is preceded by a
// space in detokenized text.
func spaceAfter(prev uint32) bool {
	if IsWord(prev) {
		return true
	}
	switch prev {
	case ',', '.', ';', ':', '!', '?', ')', ']', '}':
		return true
	}
	return false
}

// Detokenize returns the text of ids, including special tokens. A space is
// put before a word that follows a word or one of ",.;:!?)]}"; no other
// spaces are produced. Tokenize(Detokenize(ids)) == ids for every sequence
// of word, newline and special tokens, and for punctuation except sequences
// that spell a special token character by character. Safe for concurrent
// use.
func Detokenize(ids []uint32) string {
	return string(AppendText(make([]byte, 0, len(ids)*5), NoPrev, ids, false))
}

// NoPrev is the prev argument of AppendText at the start of a text.
const NoPrev = ^uint32(0)

// AppendText appends the text of ids to dst as Detokenize does and returns
// the extended slice. prev is the token before ids (for the spacing rule),
// or ^uint32(0) at the start of a text; this lets a stream of chunks be
// detokenized piecewise with the same result as the whole. With skipSpecial
// set, special tokens produce no text (as vLLM's skip_special_tokens).
func AppendText(dst []byte, prev uint32, ids []uint32, skipSpecial bool) []byte {
	for _, id := range ids {
		if IsWord(id) {
			if prev != NoPrev && spaceAfter(prev) {
				dst = append(dst, ' ')
			}
			dst = AppendWord(dst, id)
		} else if !(skipSpecial && id >= EndOfTextToken) {
			dst = appendToken(dst, id)
		}
		prev = id
	}
	return dst
}
