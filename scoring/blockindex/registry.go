package blockindex

import (
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
)

// errTooManyReplicas is returned when a table would need more replica ids
// than its holder descriptors can name.
var errTooManyReplicas = errors.New("blockindex: too many replicas")

// registry interns replica names to small dense ids. Lookups read an
// immutable snapshot through an atomic pointer and take no lock; a new name
// publishes a new snapshot (copy-on-write), which is rare. Ids are never
// reused, so a registry names at most maxReplicas replicas in its lifetime.
type registry[R any] struct {
	mu   sync.Mutex // serialises registration
	snap atomic.Pointer[regSnap[R]]
	make func(name string, id uint32) *R
}

// regSnap is one immutable version of a registry.
type regSnap[R any] struct {
	ids  map[string]uint32
	byID []*R
}

func newRegistry[R any](mk func(name string, id uint32) *R) *registry[R] {
	g := &registry[R]{make: mk}
	g.snap.Store(&regSnap[R]{ids: map[string]uint32{}})
	return g
}

// get returns the replica registered as name.
func (g *registry[R]) get(name string) (*R, bool) {
	s := g.snap.Load()
	id, ok := s.ids[name]
	if !ok {
		return nil, false
	}
	return s.byID[id], true
}

// byID returns the replica with id, or nil.
func (g *registry[R]) byID(id uint32) *R {
	s := g.snap.Load()
	if int(id) >= len(s.byID) {
		return nil
	}
	return s.byID[id]
}

// intern returns the replica registered as name, registering it if needed.
func (g *registry[R]) intern(name string) (*R, error) {
	if r, ok := g.get(name); ok {
		return r, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.snap.Load()
	if id, ok := s.ids[name]; ok {
		return s.byID[id], nil
	}
	if len(s.byID) >= maxReplicas {
		return nil, fmt.Errorf("register %q: %w", name, errTooManyReplicas)
	}
	id := uint32(len(s.byID))
	r := g.make(name, id)
	ns := &regSnap[R]{ids: maps.Clone(s.ids), byID: append(s.byID[:len(s.byID):len(s.byID)], r)}
	ns.ids[name] = id
	g.snap.Store(ns)
	return r, nil
}

// all returns the registered replicas, in id order.
func (g *registry[R]) all() []*R { return g.snap.Load().byID }
