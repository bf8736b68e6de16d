package blockindex

import "math/bits"

// engSlot maps one engine block hash (k, never 0) to a chain state v: the
// own key of the last own block completed at or before the end of the
// engine block (or the chain seed), with auxFlag set when the replica's aux
// map holds more (see engAux).
type engSlot struct {
	k, v uint64
}

// auxFlag marks an engSlot value whose engine block has an engAux entry.
// Keys and seeds are 61-bit, so the top bit is free.
const auxFlag = uint64(1) << 63

// engAux describes an engine block that does not complete exactly one own
// block: one that completes several (our block size is smaller than the
// engine's), none, or ends inside an own block (ours is larger, or the sizes
// do not divide).
type engAux struct {
	// own are the keys of the own blocks completed within this engine block,
	// in chain order.
	own []uint64
	// partial are the tokens after the last own-block boundary at the end of
	// this engine block: the start of the next own block.
	partial []uint32
	// root is set when no own block of the chain is complete yet, so that
	// the chain state is a Root.Seed rather than a key.
	root bool
}

// engTable is a plain open-addressing map from engine hash to chain state,
// with linear probing and backward-shift deletion. It is owned by one
// replica and guarded by that replica's mutex. The zero value is empty.
type engTable struct {
	s []engSlot
	n int
}

func (t *engTable) home(k uint64) int {
	hi, _ := bits.Mul64(k*fib, uint64(len(t.s)))
	return int(hi)
}

// get returns the value stored for k.
func (t *engTable) get(k uint64) (uint64, bool) {
	n := len(t.s)
	if n == 0 {
		return 0, false
	}
	i := t.home(k)
	for {
		e := &t.s[i]
		if e.k == k {
			return e.v, true
		}
		if e.k == 0 {
			return 0, false
		}
		if i++; i == n {
			i = 0
		}
	}
}

// full reports whether one more key would make the table grow.
func (t *engTable) full() bool { return (t.n+1)*loadDen > len(t.s)*loadNum }

// put stores v for k, returning the previous value if there was one.
func (t *engTable) put(k, v uint64) (old uint64, existed bool) {
	if t.full() {
		t.resize(max(minSlots, len(t.s)+len(t.s)/2))
	}
	n := len(t.s)
	i := t.home(k)
	for {
		e := &t.s[i]
		if e.k == k {
			old, e.v = e.v, v
			return old, true
		}
		if e.k == 0 {
			e.k, e.v = k, v
			t.n++
			return 0, false
		}
		if i++; i == n {
			i = 0
		}
	}
}

// del removes k, returning its value if it was there.
func (t *engTable) del(k uint64) (uint64, bool) {
	n := len(t.s)
	if n == 0 {
		return 0, false
	}
	i := t.home(k)
	for {
		e := &t.s[i]
		if e.k == 0 {
			return 0, false
		}
		if e.k == k {
			break
		}
		if i++; i == n {
			i = 0
		}
	}
	v := t.s[i].v
	j := i
	for {
		if j++; j == n {
			j = 0
		}
		e := t.s[j]
		if e.k == 0 {
			break
		}
		home := t.home(e.k)
		if (j-home+n)%n >= (j-i+n)%n {
			t.s[i] = e
			i = j
		}
	}
	t.s[i] = engSlot{}
	t.n--
	if n > minSlots && t.n*shrinkDiv < n {
		t.resize(max(minSlots, 2*t.n))
	}
	return v, true
}

// resize rehashes the table into n slots.
func (t *engTable) resize(n int) {
	old := t.s
	t.s = make([]engSlot, n)
	for _, e := range old {
		if e.k == 0 {
			continue
		}
		i := t.home(e.k)
		for t.s[i].k != 0 {
			if i++; i == n {
				i = 0
			}
		}
		t.s[i] = e
	}
}

// all calls fn for every entry; fn must not modify the table.
func (t *engTable) all(fn func(k, v uint64)) {
	for _, e := range t.s {
		if e.k != 0 {
			fn(e.k, e.v)
		}
	}
}

// len returns the number of entries.
func (t *engTable) len() int { return t.n }
