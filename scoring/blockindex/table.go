package blockindex

import (
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
)

// A holder descriptor names one replica holding a key: 21 bits, the low 20
// the replica id plus one (0 marks an empty descriptor), bit 20 set when the
// holder is speculative. Up to three descriptors live inline in a slot's hold
// word; more spill into an overflow list.
const (
	descBits  = 21
	descMask  = 1<<descBits - 1
	descSpec  = 1 << 20
	descID    = 1<<20 - 1
	inlineMax = 3

	// maxReplicas is the number of replica ids a table can name.
	maxReplicas = descID - 1

	// holdOvf marks a hold word whose low 32 bits index the overflow list.
	holdOvf = uint64(1) << 63

	// fib is 2^64/φ, the multiplier of Fibonacci hashing, used to spread
	// keys over shards and slots whatever their distribution.
	fib = 0x9E3779B97F4A7C15

	// Tables grow by half when more than loadNum/loadDen of their slots are
	// taken, and shrink when fewer than 1/shrinkDiv are.
	loadNum   = 4
	loadDen   = 5
	shrinkDiv = 6
	minSlots  = 8
)

func descOf(id uint32, spec bool) uint32 {
	d := id + 1
	if spec {
		d |= descSpec
	}
	return d
}

func descReplica(d uint32) uint32 { return d&descID - 1 }

// slot is one entry of a shard's open-addressing table. key is the 61-bit
// key with its CLOCK counter above it (0 when the slot is empty); hold is the
// holder set.
// Both are atomics because readers do not lock (see shard).
type slot struct {
	key  atomic.Uint64
	hold atomic.Uint64
}

// ovfList is the holder set of a key held by more than inlineMax replicas.
// It is immutable once published: writers replace it.
type ovfList struct {
	d []uint32
}

// table is one published version of a shard's storage. slots is fixed in
// length; ovf elements are replaced in place. Writers publish a new table
// when either slice must grow.
type table struct {
	slots []slot
	ovf   []atomic.Pointer[ovfList]
}

// shard is one lock domain of a keyTable.
//
// Writers hold mu and bracket every change readers could observe with two
// increments of seq, so seq is odd while slots are inconsistent. Readers take
// no lock: they read seq, probe with atomic loads, and retry if seq was odd or
// has changed (a seqlock). Lookups therefore never block writers, and writers
// block lookups only for the few stores of one key's update.
type shard struct {
	mu  sync.Mutex
	seq atomic.Uint64
	tab atomic.Pointer[table]

	// Guarded by mu.
	keys    int      // occupied slots
	pairs   int      // (key, replica) pairs
	hand    int      // CLOCK hand, a slot index
	ovfFree []uint32 // free overflow indices
	ovfUsed int      // overflow indices ever handed out

	_ [64]byte // keep neighbouring shards' hot words off this cache line
}

// keyTable maps 61-bit keys to the set of replicas holding them. It is
// sharded by key; each shard is an open-addressing table with linear probing
// and backward-shift deletion.
type keyTable struct {
	shards    []shard
	shardBits uint
	capPairs  int // per shard; 0 for no bound
	// onEvict is called, under a shard lock, for each pair evicted for
	// capacity. It must not take locks.
	onEvict   func(id uint32, spec bool)
	evictions atomic.Int64
}

// newKeyTable returns a table with 2^shardBits shards and a bound of
// maxPairs (key, replica) pairs in all (0 for none).
func newKeyTable(shardBits uint, maxPairs int, onEvict func(uint32, bool)) *keyTable {
	kt := &keyTable{
		shards:    make([]shard, 1<<shardBits),
		shardBits: shardBits,
		onEvict:   onEvict,
	}
	if maxPairs > 0 {
		n := len(kt.shards)
		kt.capPairs = (maxPairs + n - 1) / n
	}
	for i := range kt.shards {
		kt.shards[i].tab.Store(&table{slots: make([]slot, minSlots)})
	}
	return kt
}

// locate returns the shard of k and its mixed hash.
func (kt *keyTable) locate(k uint64) (*shard, uint64) {
	h := k * fib
	return &kt.shards[h>>(64-kt.shardBits)&(1<<kt.shardBits-1)], h
}

// home returns the first slot probed for mixed hash h in a table of n slots:
// the bits below the shard bits, reduced to [0, n) by multiply-shift.
func (kt *keyTable) home(h uint64, n int) int {
	hi, _ := bits.Mul64(h<<kt.shardBits, uint64(n))
	return int(hi)
}

// addResult says what add did.
type addResult uint8

const (
	addedNew      addResult = iota // a new pair
	addedConfirm                   // a speculative pair became real
	addedExisting                  // the pair was already there (real, or speculative for a speculative add)
	addedRefused                   // a speculative add met a real pair: nothing to do
)

// add records that replica id holds k, speculatively or not. A real add
// confirms a speculative pair; a speculative add never demotes a real one.
func (kt *keyTable) add(k uint64, id uint32, spec bool) addResult {
	s, h := kt.locate(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tab.Load()
	i, found := kt.probe(t, k, h)
	if !found && (s.keys+1)*loadDen > len(t.slots)*loadNum {
		kt.resize(s, len(t.slots)+len(t.slots)/2)
		t = s.tab.Load()
		i, _ = kt.probe(t, k, h)
	}
	var res addResult
	if found {
		res = s.addHolder(t, i, id, spec)
		if kk := t.slots[i].key.Load(); kk&clockMask == 0 {
			t.slots[i].key.Store(kk | clockInsert)
		}
	} else {
		s.seq.Add(1)
		t.slots[i].hold.Store(uint64(descOf(id, spec)))
		t.slots[i].key.Store(k | clockInsert)
		s.seq.Add(1)
		s.keys++
		s.pairs++
		res = addedNew
	}
	if kt.capPairs > 0 && s.pairs > kt.capPairs {
		kt.evict(s)
	}
	return res
}

// probe returns the slot holding k, or the empty slot where it would go.
// The caller holds s.mu.
func (kt *keyTable) probe(t *table, k, h uint64) (int, bool) {
	n := len(t.slots)
	i := kt.home(h, n)
	for {
		kk := t.slots[i].key.Load()
		if kk == 0 {
			return i, false
		}
		if kk&keyMask == k {
			return i, true
		}
		if i++; i == n {
			i = 0
		}
	}
}

// addHolder adds (or confirms) id in the holder set of slot i.
func (s *shard) addHolder(t *table, i int, id uint32, spec bool) addResult {
	hold := t.slots[i].hold.Load()
	want := id + 1
	if hold&holdOvf == 0 {
		n := 0
		for j := range inlineMax {
			d := uint32(hold >> (j * descBits) & descMask)
			if d == 0 {
				break
			}
			n++
			if d&descID != want {
				continue
			}
			if d&descSpec == 0 {
				if spec {
					return addedRefused
				}
				return addedExisting
			}
			if spec {
				return addedExisting
			}
			s.seq.Add(1)
			t.slots[i].hold.Store(hold &^ (uint64(descSpec) << (j * descBits)))
			s.seq.Add(1)
			return addedConfirm
		}
		s.pairs++
		var ds [inlineMax + 1]uint32
		for j := range n {
			ds[j] = uint32(hold >> (j * descBits) & descMask)
		}
		d := insertSorted(ds[:n], descOf(id, spec))
		if n < inlineMax {
			s.seq.Add(1)
			t.slots[i].hold.Store(packInline(d))
			s.seq.Add(1)
			return addedNew
		}
		d = slices.Clone(d)
		s.seq.Add(1)
		o := s.ovfAlloc(&t)
		t.ovf[o].Store(&ovfList{d: d})
		t.slots[i].hold.Store(holdOvf | uint64(o))
		s.seq.Add(1)
		return addedNew
	}
	o := uint32(hold)
	old := t.ovf[o].Load().d
	for j, d := range old {
		if d&descID != want {
			continue
		}
		if d&descSpec == 0 {
			if spec {
				return addedRefused
			}
			return addedExisting
		}
		if spec {
			return addedExisting
		}
		nd := slices.Clone(old)
		nd[j] &^= descSpec
		s.seq.Add(1)
		t.ovf[o].Store(&ovfList{d: nd})
		s.seq.Add(1)
		return addedConfirm
	}
	nd := make([]uint32, len(old), len(old)+1)
	copy(nd, old)
	nd = insertSorted(nd, descOf(id, spec))
	s.pairs++
	s.seq.Add(1)
	t.ovf[o].Store(&ovfList{d: nd})
	s.seq.Add(1)
	return addedNew
}

// insertSorted inserts descriptor d into ds, kept in replica id order so
// that equal holder sets have equal encodings (see match). ds must have room
// for one more element or it is reallocated.
func insertSorted(ds []uint32, d uint32) []uint32 {
	at := len(ds)
	for j, x := range ds {
		if x&descID > d&descID {
			at = j
			break
		}
	}
	return slices.Insert(ds, at, d)
}

// packInline packs at most inlineMax descriptors into a hold word.
func packInline(ds []uint32) uint64 {
	var h uint64
	for j, d := range ds {
		h |= uint64(d) << (j * descBits)
	}
	return h
}

// ovfAlloc returns a free overflow index, growing the overflow array (and
// publishing a new table, updating *t) when none is free. The caller holds
// s.mu and has made seq odd.
func (s *shard) ovfAlloc(t **table) uint32 {
	if n := len(s.ovfFree); n > 0 {
		o := s.ovfFree[n-1]
		s.ovfFree = s.ovfFree[:n-1]
		return o
	}
	cur := *t
	if s.ovfUsed == len(cur.ovf) {
		grown := make([]atomic.Pointer[ovfList], max(4, 2*len(cur.ovf)))
		for j := range cur.ovf {
			grown[j].Store(cur.ovf[j].Load())
		}
		nt := &table{slots: cur.slots, ovf: grown}
		s.tab.Store(nt)
		*t = nt
	}
	o := uint32(s.ovfUsed)
	s.ovfUsed++
	return o
}

// remove drops replica id from the holders of k. With onlySpec it drops the
// pair only if it is speculative. It reports whether a pair was removed and
// whether it was speculative.
func (kt *keyTable) remove(k uint64, id uint32, onlySpec bool) (removed, spec bool) {
	s, h := kt.locate(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tab.Load()
	i, found := kt.probe(t, k, h)
	if !found {
		return false, false
	}
	want := id + 1
	hold := t.slots[i].hold.Load()
	if hold&holdOvf == 0 {
		var ds [inlineMax]uint32
		n, at := 0, -1
		for j := range inlineMax {
			d := uint32(hold >> (j * descBits) & descMask)
			if d == 0 {
				break
			}
			ds[n] = d
			if d&descID == want {
				at = n
			}
			n++
		}
		if at < 0 || (onlySpec && ds[at]&descSpec == 0) {
			return false, false
		}
		spec = ds[at]&descSpec != 0
		s.pairs--
		if n == 1 {
			kt.deleteSlot(s, t, i)
			return true, spec
		}
		copy(ds[at:], ds[at+1:n])
		s.seq.Add(1)
		t.slots[i].hold.Store(packInline(ds[:n-1]))
		s.seq.Add(1)
		return true, spec
	}
	o := uint32(hold)
	old := t.ovf[o].Load().d
	at := -1
	for j, d := range old {
		if d&descID == want {
			at = j
			break
		}
	}
	if at < 0 || (onlySpec && old[at]&descSpec == 0) {
		return false, false
	}
	spec = old[at]&descSpec != 0
	s.pairs--
	nd := make([]uint32, 0, len(old)-1)
	nd = append(nd, old[:at]...)
	nd = append(nd, old[at+1:]...)
	s.seq.Add(1)
	if len(nd) <= inlineMax {
		t.slots[i].hold.Store(packInline(nd))
		t.ovf[o].Store(nil)
		s.ovfFree = append(s.ovfFree, o)
	} else {
		t.ovf[o].Store(&ovfList{d: nd})
	}
	s.seq.Add(1)
	return true, spec
}

// deleteSlot empties slot i by backward-shift deletion and shrinks the table
// when it has become sparse. The caller holds s.mu and has already adjusted
// s.pairs; the slot's overflow list, if any, must already be released.
func (kt *keyTable) deleteSlot(s *shard, t *table, i int) {
	n := len(t.slots)
	s.seq.Add(1)
	j := i
	for {
		if j++; j == n {
			j = 0
		}
		kk := t.slots[j].key.Load()
		if kk == 0 {
			break
		}
		home := kt.home((kk&keyMask)*fib, n)
		// Move j into the hole when the hole lies cyclically in [home, j).
		if (j-home+n)%n >= (j-i+n)%n {
			t.slots[i].key.Store(kk)
			t.slots[i].hold.Store(t.slots[j].hold.Load())
			i = j
		}
	}
	t.slots[i].hold.Store(0)
	t.slots[i].key.Store(0)
	s.seq.Add(1)
	s.keys--
	if n > minSlots && s.keys*shrinkDiv < n {
		kt.resize(s, max(minSlots, 2*s.keys))
	}
}

// resize rebuilds s's slots with n slots and publishes them. Readers keep
// using the old table until the new one is published, so only the publication
// is bracketed by seq.
func (kt *keyTable) resize(s *shard, n int) {
	old := s.tab.Load()
	nt := &table{slots: make([]slot, n), ovf: old.ovf}
	for j := range old.slots {
		kk := old.slots[j].key.Load()
		if kk == 0 {
			continue
		}
		i := kt.home((kk&keyMask)*fib, n)
		for nt.slots[i].key.Load() != 0 {
			if i++; i == n {
				i = 0
			}
		}
		nt.slots[i].key.Store(kk)
		nt.slots[i].hold.Store(old.slots[j].hold.Load())
	}
	s.seq.Add(1)
	s.tab.Store(nt)
	s.seq.Add(1)
	s.hand = 0
}

// evict runs s's CLOCK hand until the shard is back within its bound: a key
// whose counter is above 0 has it decremented; a key at 0 is evicted with all
// its holders. The caller holds s.mu.
func (kt *keyTable) evict(s *shard) {
	for s.pairs > kt.capPairs && s.keys > 0 {
		t := s.tab.Load()
		n := len(t.slots)
		if s.hand >= n {
			s.hand = 0
		}
		i := s.hand
		kk := t.slots[i].key.Load()
		if kk == 0 {
			s.hand++
			continue
		}
		if c := kk & clockMask; c != 0 {
			t.slots[i].key.Store(kk&^clockMask | (c - clockInsert))
			s.hand++
			continue
		}
		hold := t.slots[i].hold.Load()
		sn := snapshot{hold: hold}
		if hold&holdOvf != 0 {
			sn.rec = t.ovf[uint32(hold)].Load()
		}
		count := 0
		sn.holders(func(d uint32) {
			count++
			if kt.onEvict != nil {
				kt.onEvict(descReplica(d), d&descSpec != 0)
			}
		})
		s.pairs -= count
		kt.evictions.Add(int64(count))
		kt.deleteSlot(s, t, i) // the hand stays: slot i now holds a shifted key
		if hold&holdOvf != 0 {
			// The slot no longer refers to the list; readers that saw it
			// before the deletion fail their seq check.
			o := uint32(hold)
			s.tab.Load().ovf[o].Store(nil)
			s.ovfFree = append(s.ovfFree, o)
		}
	}
}

// counts returns the number of keys and pairs in the table.
func (kt *keyTable) counts() (keys, pairs int64) {
	for i := range kt.shards {
		s := &kt.shards[i]
		s.mu.Lock()
		keys += int64(s.keys)
		pairs += int64(s.pairs)
		s.mu.Unlock()
	}
	return keys, pairs
}
