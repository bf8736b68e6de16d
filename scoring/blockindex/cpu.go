package blockindex

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/warmpath/warmpath/kvevents"
)

// DefaultCPUMaxEntries is the default bound on one replica's CPU-tier keys:
// 32 Ki blocks, 512 Ki tokens at 16-token blocks (about 128 GiB of KV for
// a 32B model at 256 KiB a token), at roughly 200 bytes a key.
const DefaultCPUMaxEntries = 1 << 15

// cpuTier is one replica's CPU tier: the engine blocks its ranks offloaded
// to CPU memory, in an LRU list bounded by cap own keys. Engines that
// offload this way (LMCache in particular) may never report removals, so
// the bound, not BlockRemoved, is what keeps the tier in step: it evicts
// the block least recently stored or loaded back to GPU (a GPU store of an
// offloaded key touches it, as the engine's own LRU is touched by the load
// that produced that store).
//
// Writers hold the replica's mu and then the tier's mu; Match holds only
// the tier's read lock.
type cpuTier struct {
	mu         sync.RWMutex
	keys       cpuKeys   // own key → blocks holding it
	head, tail *cpuBlock // most recently stored first
	n          int       // own keys referenced by the list, with multiplicity
	cap        int       // bound on n

	keysHeld atomic.Int64 // keys.len(), for Stats and Match's fast path
}

// cpuBlock is one engine block in a CPU tier.
type cpuBlock struct {
	st         *rankState
	eh         uint64   // engine hash, group mixed in
	state      uint64   // chain state at the block's end
	own        []uint64 // own keys it completes
	part       []uint32 // tokens of the unfinished own block at its end
	root       bool     // no own block of the chain is complete yet
	prev, next *cpuBlock
}

func (c *cpuTier) init(capacity int) { c.cap = capacity }

// SetCPUCapacity bounds replica's CPU tier to blocks own keys (blocks of
// the index's block size), evicting the least recently stored beyond it;
// for a vLLM engine, num_cpu_blocks × its block size ÷ BlockSize. Zero
// restores Config.CPUMaxEntries. It fails only on a negative bound or
// when the index already holds the maximum number of replicas.
func (ix *Index) SetCPUCapacity(replica string, blocks int) error {
	if blocks < 0 {
		return fmt.Errorf("blockindex: negative CPU capacity %d", blocks)
	}
	if blocks == 0 {
		blocks = ix.cpuCap
	}
	r, err := ix.reg.intern(replica)
	if err != nil {
		return fmt.Errorf("blockindex: set CPU capacity: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cpu.mu.Lock()
	defer r.cpu.mu.Unlock()
	r.cpu.cap = blocks
	ix.cpuEvict(&r.cpu)
	return nil
}

// applyOffload applies a CPU BlockStored without tokens: each engine block
// is one the rank's GPU tier holds (vLLM's native offloading stores
// blocks the GPU computed) or already holds on CPU; the CPU tier takes
// its keys and chain state. Unknown blocks are skipped (and the event
// counted once as SkipUnknownBlock). The caller holds r.mu.
func (ix *Index) applyOffload(r *replica, st *rankState, e *kvevents.BlockStored) {
	g := groupMix(e.GroupIdx)
	unknown := false
	defer func() {
		if unknown {
			ix.skip(SkipUnknownBlock, 1)
		}
	}()
	for _, h := range e.BlockHashes {
		eh := h ^ g
		if eh == 0 {
			unknown = true
			continue
		}
		if b := st.cpu[eh]; b != nil {
			r.cpu.mu.Lock()
			r.cpu.moveToFront(b)
			r.cpu.mu.Unlock()
			r.stored[tierCPU]++
			continue
		}
		v, ok := st.eng.get(eh)
		if !ok {
			unknown = true
			continue
		}
		r.stored[tierCPU]++
		if v&auxFlag == 0 {
			ix.cpuRecord(r, st, eh, v, []uint64{v}, nil, false)
			continue
		}
		a := st.aux[eh]
		ix.cpuRecord(r, st, eh, v&^auxFlag, a.own, a.partial, a.root)
	}
}

// cpuRecord stores engine block eh of rank st in r's CPU tier, or
// refreshes it there. The caller holds r.mu.
func (ix *Index) cpuRecord(r *replica, st *rankState, eh, state uint64, keys []uint64, part []uint32, atRoot bool) {
	c := &r.cpu
	c.mu.Lock()
	defer c.mu.Unlock()
	b := st.cpu[eh]
	if b != nil {
		c.unlink(b)
		ix.cpuUnref(c, b)
	} else {
		b = &cpuBlock{st: st, eh: eh}
		if st.cpu == nil {
			st.cpu = map[uint64]*cpuBlock{}
		}
		st.cpu[eh] = b
	}
	b.state, b.root = state, atRoot && len(keys) == 0
	b.own = append(b.own[:0], keys...)
	b.part = append(b.part[:0], part...)
	for _, k := range b.own {
		if c.keys.ref(k, b) {
			ix.cpuKeys.Add(1)
		}
	}
	c.n += len(b.own)
	c.keysHeld.Store(int64(c.keys.len()))
	c.pushFront(b)
	ix.cpuEvict(c)
}

// cpuRemove drops engine block eh of rank st from r's CPU tier, reporting
// whether it was there. The caller holds r.mu.
func (ix *Index) cpuRemove(r *replica, st *rankState, eh uint64) bool {
	b := st.cpu[eh]
	if b == nil {
		return false
	}
	c := &r.cpu
	c.mu.Lock()
	ix.cpuDrop(c, b)
	c.mu.Unlock()
	return true
}

// cpuDropRank drops every CPU-tier block of rank st of r. The caller holds
// r.mu.
func (ix *Index) cpuDropRank(r *replica, st *rankState) {
	if len(st.cpu) == 0 {
		return
	}
	c := &r.cpu
	c.mu.Lock()
	for _, b := range st.cpu {
		ix.cpuDrop(c, b)
	}
	c.mu.Unlock()
	st.cpu = nil
}

// cpuEvict drops blocks from the tail of c until it is within its bound.
// The caller holds c.mu (and the replica's mu).
func (ix *Index) cpuEvict(c *cpuTier) {
	for c.n > c.cap && c.tail != nil {
		ix.cpuEvictions.Add(int64(len(c.tail.own)))
		ix.cpuDrop(c, c.tail)
	}
}

// cpuDrop unlinks b from c and forgets it. The caller holds c.mu.
func (ix *Index) cpuDrop(c *cpuTier, b *cpuBlock) {
	c.unlink(b)
	ix.cpuUnref(c, b)
	delete(b.st.cpu, b.eh)
	c.keysHeld.Store(int64(c.keys.len()))
}

// cpuUnref releases b's references to its own keys. The caller holds c.mu.
func (ix *Index) cpuUnref(c *cpuTier, b *cpuBlock) {
	for _, k := range b.own {
		if c.keys.unref(k, b) {
			ix.cpuKeys.Add(-1)
		}
	}
	c.n -= len(b.own)
}

// touch moves the blocks that last stored keys to the front. The caller
// holds the replica's mu.
func (c *cpuTier) touch(keys []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		if blk := c.keys.last(k); blk != nil {
			c.moveToFront(blk)
		}
	}
}

func (c *cpuTier) pushFront(b *cpuBlock) {
	b.prev, b.next = nil, c.head
	if c.head != nil {
		c.head.prev = b
	} else {
		c.tail = b
	}
	c.head = b
}

func (c *cpuTier) unlink(b *cpuBlock) {
	if b.prev != nil {
		b.prev.next = b.next
	} else if c.head == b {
		c.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else if c.tail == b {
		c.tail = b.prev
	}
	b.prev, b.next = nil, nil
}

func (c *cpuTier) moveToFront(b *cpuBlock) {
	if c.head == b {
		return
	}
	c.unlink(b)
	c.pushFront(b)
}

// continuation returns how many of keys, from the first, c holds.
func (c *cpuTier) continuation(keys []uint64) int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := 0
	for _, k := range keys {
		if !c.keys.has(k & keyMask) {
			break
		}
		n++
	}
	return n
}

// cpuKeys maps own key to the CPU blocks holding it: how many, and the one
// that stored it last (nil once that one is gone), for touches. Match probes
// it once per key of a CPU continuation, so it is a u64Map, not a Go map. The
// zero value is empty.
type cpuKeys struct{ m u64Map[cpuKeyRefs] }

type cpuKeyRefs struct {
	n   int32
	blk *cpuBlock
}

func (t *cpuKeys) len() int { return t.m.len() }

func (t *cpuKeys) has(k uint64) bool { return t.m.find(k) >= 0 }

// last returns the block that stored k last, or nil.
func (t *cpuKeys) last(k uint64) *cpuBlock {
	if e := t.m.ref(k); e != nil {
		return e.blk
	}
	return nil
}

// ref records that b holds k, reporting whether k is new.
func (t *cpuKeys) ref(k uint64, b *cpuBlock) bool {
	if e := t.m.ref(k); e != nil {
		e.n++
		e.blk = b
		return false
	}
	t.m.put(k, cpuKeyRefs{n: 1, blk: b})
	return true
}

// unref records that b no longer holds k, reporting whether k is gone.
func (t *cpuKeys) unref(k uint64, b *cpuBlock) bool {
	e := t.m.ref(k)
	switch {
	case e == nil:
		return false
	case e.n > 1:
		e.n--
		if e.blk == b {
			e.blk = nil
		}
		return false
	}
	t.m.del(k)
	return true
}

// matchCPU sets Hit.CPU for the candidates whose CPU tier holds keys: how
// many keys after the GPU run it continues.
func (ix *Index) matchCPU(keys []uint64, candidates []string, dst []Hit) {
	snap := ix.reg.snap.Load()
	for j, name := range candidates {
		id, ok := snap.ids[name]
		if !ok {
			continue
		}
		r := snap.byID[id]
		if r.cpu.keysHeld.Load() == 0 {
			continue
		}
		if d := dst[j].Blocks; d < len(keys) {
			dst[j].CPU = r.cpu.continuation(keys[d:])
		}
	}
}
