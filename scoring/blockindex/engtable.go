package blockindex

import "math/bits"

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

// engTable maps engine hash to chain state. It is owned by one replica and
// guarded by that replica's mutex. The zero value is empty.
type engTable = u64Map[uint64]

// u64Map is a plain open-addressing map from a nonzero uint64 key to V, with
// Fibonacci hashing, linear probing and backward-shift deletion, growing by
// half past loadNum/loadDen and shrinking below 1/shrinkDiv: the engine
// tables and the CPU tiers' key maps. Lookups probe a flat slice and never
// hash the key again, which is why it is not a Go map. It is not safe for
// concurrent use. The zero value is empty.
type u64Map[V any] struct {
	s []u64Slot[V]
	n int
	// floor is the fewest slots del shrinks the table to (minSlots when
	// smaller), for a table that fills and empties over and over.
	floor int
}

// u64Slot is one slot; k is 0 when it is empty.
type u64Slot[V any] struct {
	k uint64
	v V
}

func (t *u64Map[V]) home(k uint64) int {
	hi, _ := bits.Mul64(k*fib, uint64(len(t.s)))
	return int(hi)
}

// find returns k's slot index, or -1.
func (t *u64Map[V]) find(k uint64) int {
	n := len(t.s)
	if n == 0 {
		return -1
	}
	for i := t.home(k); ; {
		switch t.s[i].k {
		case k:
			return i
		case 0:
			return -1
		}
		if i++; i == n {
			i = 0
		}
	}
}

// get returns the value stored for k.
func (t *u64Map[V]) get(k uint64) (V, bool) {
	if i := t.find(k); i >= 0 {
		return t.s[i].v, true
	}
	var zero V
	return zero, false
}

// ref returns a pointer to k's value, valid until the next put, del or
// resize; nil when k is absent.
func (t *u64Map[V]) ref(k uint64) *V {
	if i := t.find(k); i >= 0 {
		return &t.s[i].v
	}
	return nil
}

// full reports whether one more key would make the table grow.
func (t *u64Map[V]) full() bool { return (t.n+1)*loadDen > len(t.s)*loadNum }

// put stores v for k, returning the previous value if there was one.
func (t *u64Map[V]) put(k uint64, v V) (old V, existed bool) {
	if t.full() {
		t.resize(max(minSlots, len(t.s)+len(t.s)/2))
	}
	n := len(t.s)
	for i := t.home(k); ; {
		e := &t.s[i]
		if e.k == k {
			old, e.v = e.v, v
			return old, true
		}
		if e.k == 0 {
			e.k, e.v = k, v
			t.n++
			return old, false
		}
		if i++; i == n {
			i = 0
		}
	}
}

// del removes k, returning its value if it was there.
func (t *u64Map[V]) del(k uint64) (V, bool) {
	i := t.find(k)
	if i < 0 {
		var zero V
		return zero, false
	}
	v := t.s[i].v
	n := len(t.s)
	for j := i; ; {
		if j++; j == n {
			j = 0
		}
		e := t.s[j]
		if e.k == 0 {
			break
		}
		if home := t.home(e.k); (j-home+n)%n >= (j-i+n)%n {
			t.s[i] = e
			i = j
		}
	}
	t.s[i] = u64Slot[V]{}
	t.n--
	if low := max(minSlots, t.floor); n > low && t.n*shrinkDiv < n {
		t.resize(max(low, 2*t.n))
	}
	return v, true
}

// resize rehashes the table into n slots.
func (t *u64Map[V]) resize(n int) {
	old := t.s
	t.s = make([]u64Slot[V], n)
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
func (t *u64Map[V]) all(fn func(k uint64, v V)) {
	for _, e := range t.s {
		if e.k != 0 {
			fn(e.k, e.v)
		}
	}
}

// len returns the number of entries.
func (t *u64Map[V]) len() int { return t.n }
