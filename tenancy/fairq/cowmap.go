package fairq

import (
	"sync"
	"sync/atomic"
)

// cowMap is a read-mostly map published copy-on-write: a lookup is one
// atomic load and never allocates; an insert or a sweep copies the map.
type cowMap[V any] struct {
	mu sync.Mutex // serializes writers
	p  atomic.Pointer[map[string]V]
}

// get returns the value for k.
func (c *cowMap[V]) get(k string) (V, bool) {
	if m := c.p.Load(); m != nil {
		v, ok := (*m)[k]
		return v, ok
	}
	var zero V
	return zero, false
}

// getOrAdd returns the value for k, adding mk() if there is none.
func (c *cowMap[V]) getOrAdd(k string, mk func() V) V {
	if v, ok := c.get(k); ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.snapshot()
	if v, ok := old[k]; ok {
		return v
	}
	next := make(map[string]V, len(old)+1)
	for kk, vv := range old {
		next[kk] = vv
	}
	v := mk()
	next[k] = v
	c.p.Store(&next)
	return v
}

// snapshot returns the current map; do not modify it.
func (c *cowMap[V]) snapshot() map[string]V {
	if m := c.p.Load(); m != nil {
		return *m
	}
	return nil
}

// retain keeps the entries for which keep returns true.
func (c *cowMap[V]) retain(keep func(k string, v V) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.snapshot()
	next := make(map[string]V, len(old))
	for k, v := range old {
		if keep(k, v) {
			next[k] = v
		}
	}
	if len(next) != len(old) {
		c.p.Store(&next)
	}
}
