// Package lru is an exact least-recently-used set of keys: a map to the
// nodes of a circular doubly linked list kept in one slice (node 0 the
// sentinel, its next the most recent key and its prev the least), with a
// free list of nodes, so that touching a held key allocates nothing and
// the set's memory is a few slices rather than a node object per key.
//
// It is the one copy shared by the approximate prefix index's per-replica
// chunk LRUs (scoring/blockindex), the simulator's CPU offload tier
// (vllmsim) and the sessions' last prompt fingerprints (misses.Previous).
// The set has no capacity of its own: callers evict with RemoveOldest,
// after whatever bookkeeping their eviction needs.
//
// A Set is not safe for concurrent use.
package lru

// Set is an LRU set of keys. The zero value is empty and ready to use.
type Set[K comparable] struct {
	idx   map[K]int32
	nodes []node[K]
	free  []int32
}

type node[K comparable] struct {
	key        K
	prev, next int32
}

// Len returns the number of keys held.
func (s *Set[K]) Len() int { return len(s.idx) }

// Contains reports whether k is held, without touching it.
func (s *Set[K]) Contains(k K) bool {
	_, ok := s.idx[k]
	return ok
}

// Touch makes k the most recent key, adding it if absent; it reports
// whether k was added.
func (s *Set[K]) Touch(k K) bool {
	if s.MoveToFront(k) {
		return false
	}
	if s.idx == nil {
		s.idx = map[K]int32{}
		s.nodes = []node[K]{{}} // the sentinel links to itself
	}
	var i int32
	if n := len(s.free); n > 0 {
		i = s.free[n-1]
		s.free = s.free[:n-1]
	} else {
		i = int32(len(s.nodes))
		s.nodes = append(s.nodes, node[K]{})
	}
	s.nodes[i].key = k
	s.pushFront(i)
	s.idx[k] = i
	return true
}

// MoveToFront makes k the most recent key if it is held, reporting whether
// it is; an absent k is not added.
func (s *Set[K]) MoveToFront(k K) bool {
	i, ok := s.idx[k]
	if ok {
		s.unlink(i)
		s.pushFront(i)
	}
	return ok
}

// RemoveOldest removes and returns the least recent key, or reports false
// if the set is empty.
func (s *Set[K]) RemoveOldest() (k K, ok bool) {
	if len(s.idx) == 0 {
		return k, false
	}
	i := s.nodes[0].prev
	k = s.nodes[i].key
	s.unlink(i)
	delete(s.idx, k)
	var zero K
	s.nodes[i].key = zero // a pointer-holding key is not kept alive
	s.free = append(s.free, i)
	return k, true
}

// Clear empties the set and releases its memory.
func (s *Set[K]) Clear() { *s = Set[K]{} }

func (s *Set[K]) unlink(i int32) {
	n := &s.nodes[i]
	s.nodes[n.prev].next = n.next
	s.nodes[n.next].prev = n.prev
}

func (s *Set[K]) pushFront(i int32) {
	n := &s.nodes[i]
	n.prev, n.next = 0, s.nodes[0].next
	s.nodes[n.next].prev = i
	s.nodes[0].next = i
}
