package vllmsim

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"github.com/warmpath/warmpath/internal/lru"
	"github.com/warmpath/warmpath/kvevents"
)

// kvCache is a paged KV cache with vLLM's prefix-caching bookkeeping:
// reference-counted blocks, a hash → block map of full cached blocks, and an
// LRU queue of free blocks (cached or not) from which allocation evicts.
// It is owned by the engine and guarded by the engine's mutex.
type kvCache struct {
	blockSize int
	blocks    []kvBlock
	byHash    map[uint64]int32
	root      uint64 // the chain's root hash (vLLM's NONE_HASH), per process
	// Free queue: doubly linked through kvBlock.prev/next; head is evicted first.
	head, tail int32
	nfree      int
	evictions  uint64
	digest     *xxhash.Digest
	scratch    []byte
	events     []kvevents.Event // produced since the last takeEvents
	typedExtra bool             // salted events carry event_version 2 (typed extra keys)
	promptOnly bool             // cache only blocks made of prompt tokens
	cpu        cpuTier          // CPU offload tier; zero capacity when disabled
}

// cacheConfig configures a kvCache.
type cacheConfig struct {
	numBlocks, blockSize int
	root                 uint64 // the chain's root hash
	typedExtra           bool   // salted events carry event_version 2
	promptOnly           bool   // cache only blocks made of prompt tokens
	cpuBlocks            int    // CPU tier size in blocks; 0 for none
	cpuStoreOnly         bool   // the CPU tier publishes no removals
}

type kvBlock struct {
	hash       uint64
	ref        int32
	prev, next int32
	registered bool // hash is in byHash pointing at this block
	free       bool
}

const nilBlock = -1

func newKVCache(cfg cacheConfig) *kvCache {
	c := &kvCache{
		typedExtra: cfg.typedExtra,
		promptOnly: cfg.promptOnly,
		blockSize:  cfg.blockSize,
		blocks:     make([]kvBlock, cfg.numBlocks),
		byHash:     make(map[uint64]int32, cfg.numBlocks),
		root:       cfg.root,
		digest:     xxhash.New(),
		scratch:    make([]byte, 0, 8+4*cfg.blockSize),
		cpu:        cpuTier{capacity: cfg.cpuBlocks, storeOnly: cfg.cpuStoreOnly},
	}
	c.reset(cfg.root)
	return c
}

// reset empties the cache (a process restart), CPU tier included: no
// events.
func (c *kvCache) reset(root uint64) {
	c.root = root
	c.evictions = 0
	c.cpu.reset()
	clear(c.byHash)
	c.head, c.tail, c.nfree = nilBlock, nilBlock, 0
	for i := range c.blocks {
		c.blocks[i] = kvBlock{prev: nilBlock, next: nilBlock}
		c.pushFree(int32(i))
	}
	c.events = c.events[:0]
}

func (c *kvCache) pushFree(id int32) {
	b := &c.blocks[id]
	b.free, b.prev, b.next = true, c.tail, nilBlock
	if c.tail != nilBlock {
		c.blocks[c.tail].next = id
	} else {
		c.head = id
	}
	c.tail = id
	c.nfree++
}

func (c *kvCache) unlinkFree(id int32) {
	b := &c.blocks[id]
	if b.prev != nilBlock {
		c.blocks[b.prev].next = b.next
	} else {
		c.head = b.next
	}
	if b.next != nilBlock {
		c.blocks[b.next].prev = b.prev
	} else {
		c.tail = b.prev
	}
	b.free, b.prev, b.next = false, nilBlock, nilBlock
	c.nfree--
}

// blockHash chains one block: xxhash64(parent ‖ tokens ‖ salt) where parent
// is the root for block 0 and the salt is mixed into block 0 only.
func (c *kvCache) blockHash(parent uint64, tokens []uint32, salt string) uint64 {
	buf := binary.LittleEndian.AppendUint64(c.scratch[:0], parent)
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, t)
	}
	c.scratch = buf
	if salt == "" {
		return xxhash.Sum64(buf)
	}
	c.digest.Reset()
	_, _ = c.digest.Write(buf)
	_, _ = c.digest.WriteString("\x00cache_salt\x00")
	_, _ = c.digest.WriteString(salt)
	return c.digest.Sum64()
}

// extendHashes computes the hashes of s's full blocks not hashed yet.
func (c *kvCache) extendHashes(s *seq) {
	bs := c.blockSize
	for n := len(s.hashes); (n+1)*bs <= len(s.tokens); n++ {
		parent, salt := c.root, s.salt
		if n > 0 {
			parent, salt = s.hashes[n-1], ""
		}
		s.hashes = append(s.hashes, c.blockHash(parent, s.tokens[n*bs:(n+1)*bs], salt))
	}
}

// lookup returns how many leading blocks of s are cached, never counting the
// block holding the last token (at most (len−1)/blockSize blocks), and how
// many of those are currently free (they leave the free pool when touched).
func (c *kvCache) lookup(s *seq) (hit, freeHit int) {
	c.extendHashes(s)
	limit := (len(s.tokens) - 1) / c.blockSize
	for hit < limit {
		id, ok := c.byHash[s.hashes[hit]]
		if !ok {
			break
		}
		if c.blocks[id].free {
			freeHit++
		}
		hit++
	}
	return hit, freeHit
}

// acquireHits references the first hit cached blocks for s.
func (c *kvCache) acquireHits(s *seq, hit int) {
	for i := 0; i < hit; i++ {
		id := c.byHash[s.hashes[i]]
		b := &c.blocks[id]
		if b.free {
			c.unlinkFree(id)
		}
		b.ref++
		s.blockIDs = append(s.blockIDs, id)
	}
	s.stored = hit
}

// blocksFor is the number of blocks holding n tokens.
func (c *kvCache) blocksFor(n int) int { return (n + c.blockSize - 1) / c.blockSize }

// ensure gives s enough blocks for n tokens, evicting free cached blocks
// (one BlockRemoved each). It reports false, allocating nothing, when the
// free pool is too small.
func (c *kvCache) ensure(s *seq, n int) bool {
	need := c.blocksFor(n) - len(s.blockIDs)
	if need <= 0 {
		return true
	}
	if need > c.nfree {
		return false
	}
	for ; need > 0; need-- {
		id := c.head
		c.unlinkFree(id)
		b := &c.blocks[id]
		if b.registered {
			delete(c.byHash, b.hash)
			c.evictions++
			c.events = append(c.events, &kvevents.BlockRemoved{BlockHashes: []uint64{b.hash}, Medium: kvevents.MediumGPU, GroupIdx: new(0)})
		}
		b.hash, b.registered, b.ref = 0, false, 1
		s.blockIDs = append(s.blockIDs, id)
	}
	return true
}

// storeFull caches the blocks of s that are full once n tokens are computed
// and emits one BlockStored for them (vLLM's cache_full_blocks), then
// offloads them to the CPU tier. With promptOnly, blocks holding generated
// tokens are not cached.
func (c *kvCache) storeFull(s *seq, n int) {
	full := n / c.blockSize
	if c.promptOnly {
		full = min(full, s.promptLen/c.blockSize)
	}
	if full <= s.stored {
		return
	}
	c.extendHashes(s)
	for i := s.stored; i < full; i++ {
		h := s.hashes[i]
		b := &c.blocks[s.blockIDs[i]]
		b.hash = h
		if _, dup := c.byHash[h]; !dup {
			c.byHash[h] = s.blockIDs[i]
			b.registered = true
		}
	}
	bs := c.blockSize
	ev := &kvevents.BlockStored{
		BlockHashes:     s.hashes[s.stored:full:full],
		TokenIDs:        s.tokens[s.stored*bs : full*bs : full*bs],
		BlockSize:       bs,
		Medium:          kvevents.MediumGPU,
		ExtraKeys:       make([][]kvevents.ExtraKey, full-s.stored),
		GroupIdx:        new(0),
		KVCacheSpecKind: "full_attention",
		SessionID:       s.session,
	}
	if s.stored > 0 {
		ev.ParentBlockHash = new(s.hashes[s.stored-1])
	} else if s.salt != "" {
		ev.ExtraKeys[0] = []kvevents.ExtraKey{{Kind: kvevents.ExtraCacheSalt, Value: s.salt}}
		ev.CacheSalt = s.salt
		if c.typedExtra {
			ev.EventVersion = 2
		}
	}
	c.events = append(c.events, ev)
	c.offload(ev.BlockHashes)
	s.stored = full
}

// release drops s's references, freeing its blocks tail first so that a
// sequence's last blocks are evicted before its prefix (as vLLM does).
func (c *kvCache) release(s *seq) {
	for i := len(s.blockIDs) - 1; i >= 0; i-- {
		id := s.blockIDs[i]
		b := &c.blocks[id]
		b.ref--
		if b.ref == 0 {
			if !b.registered {
				b.hash = 0
			}
			c.pushFree(id)
		}
	}
	s.blockIDs = s.blockIDs[:0]
	s.stored = 0
}

// resetPrefixCache forgets every cached hash (vLLM's reset_prefix_cache)
// and emits AllBlocksCleared. Blocks in use keep their contents but are no
// longer found by lookups. The CPU tier is kept, as vLLM's reset keeps the
// offloading connector's cache unless asked to reset it.
func (c *kvCache) resetPrefixCache() {
	clear(c.byHash)
	for i := range c.blocks {
		c.blocks[i].registered = false
		c.blocks[i].hash = 0
	}
	c.events = append(c.events, &kvevents.AllBlocksCleared{})
}

// used is the number of blocks referenced by a sequence.
func (c *kvCache) used() int { return len(c.blocks) - c.nfree }

// takeEvents returns the events produced since the last call.
func (c *kvCache) takeEvents() []kvevents.Event {
	if len(c.events) == 0 {
		return nil
	}
	ev := c.events
	c.events = nil
	return ev
}

// offload copies newly cached GPU blocks to the CPU tier, emitting one
// BlockStored with medium CPU for those it did not hold (the GPU hashes,
// no tokens, as vLLM's offloading connector reports them) and a
// BlockRemoved for each block it evicts (unless store-only).
func (c *kvCache) offload(hashes []uint64) {
	if c.cpu.capacity == 0 {
		return
	}
	var stored []uint64
	for _, h := range hashes {
		added, evicted, ok := c.cpu.store(h)
		if ok && !c.cpu.storeOnly {
			c.events = append(c.events, &kvevents.BlockRemoved{BlockHashes: []uint64{evicted}, Medium: kvevents.MediumCPU})
		}
		if added {
			stored = append(stored, h)
		}
	}
	if len(stored) > 0 {
		c.events = append(c.events, &kvevents.BlockStored{
			BlockHashes: stored, BlockSize: c.blockSize, Medium: kvevents.MediumCPU, Locality: "LOCAL",
		})
	}
}

// cpuLookup returns how many blocks of s after its first hit blocks the
// CPU tier holds, consecutively, never counting the block holding the
// prompt's last token.
func (c *kvCache) cpuLookup(s *seq, hit int) int {
	if c.cpu.len() == 0 {
		return 0
	}
	limit := (len(s.tokens) - 1) / c.blockSize
	n := 0
	for hit+n < limit && c.cpu.has(s.hashes[hit+n]) {
		n++
	}
	return n
}

// cpuLoad marks the loaded blocks [hit, hit+n) of s as used in the CPU
// tier (its LRU).
func (c *kvCache) cpuLoad(s *seq, hit, n int) {
	for _, h := range s.hashes[hit : hit+n] {
		c.cpu.touch(h)
	}
}

// cpuTier is an LRU set of block hashes: the blocks offloaded to CPU
// memory. It belongs to its kvCache.
type cpuTier struct {
	capacity  int
	storeOnly bool
	hashes    lru.Set[uint64]
	evictions uint64
}

func (t *cpuTier) reset() {
	t.hashes.Clear()
	t.evictions = 0
}

func (t *cpuTier) len() int { return t.hashes.Len() }

func (t *cpuTier) has(h uint64) bool { return t.hashes.Contains(h) }

// store adds h (or touches it); it reports whether h is new and which
// block, if any, it evicted.
func (t *cpuTier) store(h uint64) (added bool, evicted uint64, didEvict bool) {
	if t.touch(h) {
		return false, 0, false
	}
	if t.hashes.Len() >= t.capacity {
		if evicted, didEvict = t.hashes.RemoveOldest(); didEvict {
			t.evictions++
		}
	}
	t.hashes.Touch(h)
	return true, evicted, didEvict
}

// touch moves h to the front, reporting whether it is held.
func (t *cpuTier) touch(h uint64) bool { return t.hashes.MoveToFront(h) }
