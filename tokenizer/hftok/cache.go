package hftok

import (
	"hash/maphash"
	"strings"
	"sync/atomic"
)

// wordCache remembers the ids of pre-tokenized pieces, as Hugging Face's
// BPE cache does: prompts repeat their words, and a cached word costs a
// hash and a compare instead of its merges (about 15 lookups in a merge
// table of megabytes for a 6-byte word). It is two-way set-associative
// (a word may sit in either slot of its pair; a new word takes the slot
// its pair did not fill last), lock-free and bounded: cacheSlots entries
// of words up to maxCachedWord bytes.
type wordCache struct {
	seed  maphash.Seed
	slots []atomic.Pointer[cachedWord]
}

type cachedWord struct {
	word string
	ids  []uint32 // never changed once stored
}

const (
	cacheSlots    = 1 << 16
	maxCachedWord = 256
)

func newWordCache() *wordCache {
	return &wordCache{seed: maphash.MakeSeed(), slots: make([]atomic.Pointer[cachedWord], cacheSlots)}
}

// pair returns the two slots word may sit in.
func (c *wordCache) pair(word string) []atomic.Pointer[cachedWord] {
	i := maphash.String(c.seed, word) & (cacheSlots - 2)
	return c.slots[i : i+2 : i+2]
}

// get returns word's ids, if cached.
func (c *wordCache) get(word string) ([]uint32, bool) {
	for i := range 2 {
		if e := c.pair(word)[i].Load(); e != nil && e.word == word {
			return e.ids, true
		}
	}
	return nil, false
}

// put caches a copy of word's ids: in an empty slot of its pair, else in
// the second, whose word moves to the first (so the older one goes).
func (c *wordCache) put(word string, ids []uint32) {
	// The word is copied: it is a slice of the prompt, which the cache
	// must not keep alive.
	e := &cachedWord{word: strings.Clone(word), ids: append([]uint32(nil), ids...)}
	p := c.pair(word)
	if p[0].CompareAndSwap(nil, e) || p[1].CompareAndSwap(nil, e) {
		return
	}
	p[0].Store(p[1].Swap(e))
}
