package bench

// blockLRU is an exact LRU set of dense block ids in [0, universe): a
// doubly linked list threaded through arrays indexed by id, with a
// sentinel at index universe whose next is the most recent id and whose
// prev the least recent.
type blockLRU struct {
	capacity, n int
	sentinel    int32
	prev, next  []int32
	in          []bool
}

// newBlockLRU returns an empty LRU of capacity ids from [0, universe).
func newBlockLRU(universe, capacity int) *blockLRU {
	l := &blockLRU{
		sentinel: int32(universe),
		prev:     make([]int32, universe+1),
		next:     make([]int32, universe+1),
		in:       make([]bool, universe),
	}
	l.reset(capacity)
	return l
}

// reset empties the LRU and sets its capacity (at least 1).
func (l *blockLRU) reset(capacity int) {
	clear(l.in)
	l.n, l.capacity = 0, max(1, capacity)
	l.prev[l.sentinel], l.next[l.sentinel] = l.sentinel, l.sentinel
}

// contains reports whether id is cached.
func (l *blockLRU) contains(id int32) bool { return l.in[id] }

// prefix returns the length of the longest run of ids, from ids[0], that
// is cached.
func (l *blockLRU) prefix(ids []int32) int {
	for k, id := range ids {
		if !l.in[id] {
			return k
		}
	}
	return len(ids)
}

// touch makes ids the most recent entries, deepest first so that ids[0]
// ends up most recent, adding the absent ones and evicting the least
// recent beyond capacity.
func (l *blockLRU) touch(ids []int32) {
	for k := len(ids) - 1; k >= 0; k-- {
		id := ids[k]
		if l.in[id] {
			l.unlink(id)
		} else {
			l.in[id] = true
			l.n++
		}
		l.pushFront(id)
		if l.n > l.capacity {
			l.evict()
		}
	}
}

func (l *blockLRU) unlink(id int32) {
	p, n := l.prev[id], l.next[id]
	l.next[p], l.prev[n] = n, p
}

func (l *blockLRU) pushFront(id int32) {
	s := l.sentinel
	first := l.next[s]
	l.prev[id], l.next[id] = s, first
	l.prev[first], l.next[s] = id, id
}

// evict drops the least recent id.
func (l *blockLRU) evict() {
	id := l.prev[l.sentinel]
	l.unlink(id)
	l.in[id] = false
	l.n--
}

// oldest returns the ids from least to most recent (for tests).
func (l *blockLRU) oldest() []int32 {
	var out []int32
	for id := l.prev[l.sentinel]; id != l.sentinel; id = l.prev[id] {
		out = append(out, id)
	}
	return out
}
