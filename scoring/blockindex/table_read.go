package blockindex

import (
	"math/bits"
	"runtime"
	"slices"
)

// snapshot is a consistent read of one key's holders.
type snapshot struct {
	hold uint64
	rec  *ovfList // when hold&holdOvf != 0
	tab  *table
	at   int // slot index in tab, -1 when absent
}

// read returns the holders of k without locking.
func (kt *keyTable) read(k uint64) snapshot {
	s, h := kt.locate(k)
	for spins := 0; ; spins++ {
		s1 := s.seq.Load()
		if s1&1 != 0 {
			if spins > 32 {
				runtime.Gosched()
			}
			continue
		}
		t := s.tab.Load()
		sn := snapshot{tab: t, at: -1}
		n := len(t.slots)
		i := kt.home(h, n)
		for range n {
			kk := t.slots[i].key.Load()
			if kk == 0 {
				break
			}
			if kk&keyMask == k {
				sn.at = i
				sn.hold = t.slots[i].hold.Load()
				if sn.hold&holdOvf != 0 {
					if o := int(uint32(sn.hold)); o < len(t.ovf) {
						sn.rec = t.ovf[o].Load()
					}
				}
				break
			}
			if i++; i == n {
				i = 0
			}
		}
		if s.seq.Load() == s1 {
			if sn.hold&holdOvf != 0 && sn.rec == nil {
				sn.hold, sn.at = 0, -1 // cannot happen when consistent
			}
			return sn
		}
	}
}

// readFast is read without the retry loop, for the lookup hot path: one
// attempt, falling back to read when a writer is active on the shard.
func (kt *keyTable) readFast(k uint64) snapshot {
	h := k * fib
	s := &kt.shards[h>>(64-kt.shardBits)&(1<<kt.shardBits-1)]
	s1 := s.seq.Load()
	t := s.tab.Load()
	slots := t.slots
	n := len(slots)
	hi, _ := bits.Mul64(h<<kt.shardBits, uint64(n))
	i := int(hi)
	sn := snapshot{tab: t, at: -1}
	for range n {
		kk := slots[i].key.Load()
		if kk&keyMask == k {
			sn.at = i
			sn.hold = slots[i].hold.Load()
			break
		}
		if kk == 0 {
			break
		}
		if i++; i == n {
			i = 0
		}
	}
	if sn.hold&holdOvf != 0 {
		if o := int(uint32(sn.hold)); o < len(t.ovf) {
			sn.rec = t.ovf[o].Load()
		}
		if sn.rec == nil {
			return kt.read(k)
		}
	}
	if s1&1 != 0 || s.seq.Load() != s1 {
		return kt.read(k)
	}
	return sn
}

// touch raises the CLOCK counter of the key read into sn to clockHit, if it
// is lower. The compare-and-swap fails harmlessly if a writer moved or
// changed the slot; racing writers may also lower the counter again, which
// only makes the LRU approximate.
func (sn snapshot) touch() {
	if sn.at < 0 {
		return
	}
	w := &sn.tab.slots[sn.at].key
	if kk := w.Load(); kk&clockMask != clockHit && kk != 0 {
		w.CompareAndSwap(kk, kk|clockHit)
	}
}

// sameHolders reports whether sn and o hold the same descriptors (holders
// and speculative bits). Descriptors are kept sorted, so equal sets compare
// equal.
func (sn snapshot) sameHolders(o snapshot) bool {
	if sn.hold&holdOvf == 0 || o.hold&holdOvf == 0 {
		return sn.hold == o.hold
	}
	return slices.Equal(sn.rec.d, o.rec.d)
}

// holders calls fn for each holder descriptor in sn.
func (sn snapshot) holders(fn func(d uint32)) {
	if sn.hold&holdOvf != 0 {
		for _, d := range sn.rec.d {
			fn(d)
		}
		return
	}
	for h := sn.hold; h != 0; h >>= descBits {
		if d := uint32(h & descMask); d != 0 {
			fn(d)
		}
	}
}

// heldSpec reports whether replica id holds k speculatively.
func (kt *keyTable) heldSpec(k uint64, id uint32) bool {
	spec := false
	kt.read(k).holders(func(d uint32) {
		if descReplica(d) == id {
			spec = d&descSpec != 0
		}
	})
	return spec
}

// holds reports whether replica id holds k (speculatively or not).
func (kt *keyTable) holds(k uint64, id uint32) bool {
	found := false
	kt.read(k).holders(func(d uint32) {
		if descReplica(d) == id {
			found = true
		}
	})
	return found
}
