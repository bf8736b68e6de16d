package hftok

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/tidwall/gjson"
)

// byteRunes is GPT-2's byte-level alphabet: the rune each byte is written
// as in vocab and merges (printable Latin-1 bytes as themselves, the rest
// shifted to U+0100 and up).
var byteRunes = func() (m [256]rune) {
	n := 0
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE {
			m[b] = rune(b)
		} else {
			m[b] = rune(256 + n)
			n++
		}
	}
	return m
}()

// runeBytes inverts byteRunes.
var runeBytes = func() map[rune]byte {
	m := make(map[rune]byte, 256)
	for b, r := range byteRunes {
		m[r] = byte(b)
	}
	return m
}()

// fromByteLevel returns the bytes a byte-level token stands for; ok is
// false when it has a rune outside the alphabet (BPE never produces it).
func fromByteLevel(tok string) (string, bool) {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		b, ok := runeBytes[r]
		if !ok {
			return "", false
		}
		out = append(out, b)
	}
	return string(out), true
}

// bpe is a byte-level BPE model keyed by raw bytes.
type bpe struct {
	vocab        map[string]uint32 // token bytes → id
	bytes        [256]uint32       // each byte's id
	merges       map[uint64]merge  // pair of ids → its merge
	ignoreMerges bool              // a word in the vocab is one token (Llama 3)
	cache        *wordCache
}

// merge is what a pair becomes and how early it merges.
type merge struct{ rank, id uint32 }

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

func newBPE(m *modelJSON) (*bpe, error) {
	switch {
	case m.Type != "BPE":
		return nil, fmt.Errorf("%q is not supported (only byte-level BPE; SentencePiece Unigram, WordPiece and WordLevel are not)", m.Type)
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, errors.New("BPE dropout is not supported")
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "",
		m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, errors.New("BPE continuing_subword_prefix / end_of_word_suffix are not supported")
	case m.ByteFallback:
		return nil, errors.New("BPE byte_fallback is not supported (a SentencePiece-style BPE, not byte-level)")
	}
	vocab, merges := gjson.ParseBytes(m.Vocab), gjson.ParseBytes(m.Merges)
	if !vocab.IsObject() || m.Merges != nil && !merges.IsArray() && merges.Type != gjson.Null {
		return nil, errors.New("vocab is not an object or merges not a list")
	}
	p := &bpe{vocab: make(map[string]uint32, len(m.Vocab)/16), merges: make(map[uint64]merge, len(m.Merges)/16), ignoreMerges: m.IgnoreMerges, cache: newWordCache()}
	var err error
	vocab.ForEach(func(tok, id gjson.Result) bool {
		if id.Type != gjson.Number || id.Num < 0 || id.Num > math.MaxUint32 || id.Num != float64(id.Uint()) {
			err = fmt.Errorf("vocab: %q has id %s, not a 32-bit id", tok.String(), id.Raw)
			return false
		}
		if raw, ok := fromByteLevel(tok.String()); ok {
			p.vocab[raw] = uint32(id.Uint())
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	if len(p.vocab) == 0 {
		return nil, errors.New("empty vocab")
	}
	for b, r := range byteRunes {
		id, ok := p.vocab[string([]byte{byte(b)})]
		if !ok {
			return nil, fmt.Errorf("vocab has no token for byte %#02x (%q): not a byte-level BPE", b, r)
		}
		p.bytes[b] = id
	}
	rank := uint32(0)
	merges.ForEach(func(_, m gjson.Result) bool {
		if err = p.addMerge(rank, m); err != nil {
			err = fmt.Errorf("merges[%d]: %w", rank, err)
		}
		rank++
		return err == nil
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (p *bpe) addMerge(rank uint32, m gjson.Result) error {
	a, b, err := mergePair(m)
	if err != nil {
		return err
	}
	ra, oka := fromByteLevel(a)
	rb, okb := fromByteLevel(b)
	if !oka || !okb {
		return fmt.Errorf("%q %q is outside the byte-level alphabet", a, b)
	}
	ia, oka := p.vocab[ra]
	ib, okb := p.vocab[rb]
	im, okm := p.vocab[ra+rb]
	if !oka || !okb || !okm {
		return fmt.Errorf("%q %q: a token is not in the vocab", a, b)
	}
	if _, dup := p.merges[pairKey(ia, ib)]; !dup { // the first (best) rank wins
		p.merges[pairKey(ia, ib)] = merge{rank: rank, id: im}
	}
	return nil
}

// encode appends the ids of s, one pre-tokenized piece, to out.
func (p *bpe) encode(out []uint32, s string) []uint32 {
	if len(s) == 1 {
		return append(out, p.bytes[s[0]])
	}
	if p.ignoreMerges {
		if id, ok := p.vocab[s]; ok {
			return append(out, id)
		}
	}
	cacheable := len(s) <= maxCachedWord
	if cacheable {
		if ids, ok := p.cache.get(s); ok {
			return append(out, ids...)
		}
	}
	start := len(out)
	w := wordPool.Get().(*word)
	w.reset(p, s)
	w.mergeAll(p)
	for i := int32(0); i >= 0; i = w.syms[i].next {
		out = append(out, w.syms[i].id)
	}
	if cap(w.syms) <= maxPooledWord {
		wordPool.Put(w)
	}
	if cacheable {
		p.cache.put(s, out[start:])
	}
	return out
}

// word is a word being merged: a linked list of symbols and a heap of
// candidate merges, so a long word (a base64 blob) merges in n log n.
// Words are pooled: merging allocates nothing once warm.
type word struct {
	syms []symbol
	q    []candidate // a min-heap by (rank, pos)
}

var wordPool = sync.Pool{New: func() any { return new(word) }}

// maxPooledWord: longer words' buffers are left to the collector.
const maxPooledWord = 4096

type symbol struct {
	id         uint32
	prev, next int32 // -1 at the ends
}

// candidate is a merge of syms[pos] with its next symbol, valid while
// both still hold the ids it was made for.
type candidate struct {
	rank, left, right, id uint32
	pos                   int32
}

func (c candidate) before(d candidate) bool {
	return c.rank < d.rank || c.rank == d.rank && c.pos < d.pos
}

// dead marks a symbol merged into its left neighbour.
const dead = ^uint32(0)

func (w *word) reset(p *bpe, s string) {
	w.syms, w.q = w.syms[:0], w.q[:0]
	for i := range len(s) {
		w.syms = append(w.syms, symbol{id: p.bytes[s[i]], prev: int32(i - 1), next: int32(i + 1)})
	}
	w.syms[len(s)-1].next = -1
	for i := range int32(len(s) - 1) {
		w.push(p, i)
	}
}

// push queues the merge of syms[pos] with its next symbol, if there is one.
func (w *word) push(p *bpe, pos int32) {
	next := w.syms[pos].next
	if next < 0 {
		return
	}
	l, r := w.syms[pos].id, w.syms[next].id
	m, ok := p.merges[pairKey(l, r)]
	if !ok {
		return
	}
	w.q = append(w.q, candidate{rank: m.rank, left: l, right: r, id: m.id, pos: pos})
	for i := len(w.q) - 1; i > 0; { // sift up
		parent := (i - 1) / 2
		if !w.q[i].before(w.q[parent]) {
			break
		}
		w.q[i], w.q[parent] = w.q[parent], w.q[i]
		i = parent
	}
}

// pop removes the heap's first candidate.
func (w *word) pop() candidate {
	c := w.q[0]
	n := len(w.q) - 1
	w.q[0] = w.q[n]
	w.q = w.q[:n]
	for i := 0; ; { // sift down
		l, best := 2*i+1, i
		if l < n && w.q[l].before(w.q[best]) {
			best = l
		}
		if l+1 < n && w.q[l+1].before(w.q[best]) {
			best = l + 1
		}
		if best == i {
			break
		}
		w.q[i], w.q[best] = w.q[best], w.q[i]
		i = best
	}
	return c
}

// mergeAll applies merges lowest rank first, leftmost first among equals,
// as Hugging Face's BPE does.
func (w *word) mergeAll(p *bpe) {
	for len(w.q) > 0 {
		c := w.pop()
		s := &w.syms[c.pos]
		if s.id != c.left || s.next < 0 || w.syms[s.next].id != c.right {
			continue // stale: a neighbour merged first
		}
		gone := s.next
		s.id = c.id
		s.next = w.syms[gone].next
		if s.next >= 0 {
			w.syms[s.next].prev = c.pos
		}
		w.syms[gone].id = dead
		if s.prev >= 0 {
			w.push(p, s.prev)
		}
		w.push(p, c.pos)
	}
}
