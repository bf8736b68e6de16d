package lru

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// oldestFirst drains s, returning its keys least recent first.
func oldestFirst[K comparable](s *Set[K]) []K {
	var out []K
	for {
		k, ok := s.RemoveOldest()
		if !ok {
			return out
		}
		out = append(out, k)
	}
}

func TestOrder(t *testing.T) {
	var s Set[string]
	if _, ok := s.RemoveOldest(); ok {
		t.Fatal("RemoveOldest on the zero Set reported a key")
	}
	for _, k := range []string{"a", "b", "c", "d"} {
		if !s.Touch(k) {
			t.Fatalf("Touch(%q) on a new key reported not added", k)
		}
	}
	if s.Touch("b") {
		t.Error("Touch of a held key reported added")
	}
	if !s.MoveToFront("a") || s.MoveToFront("x") {
		t.Error("MoveToFront misreported what is held")
	}
	if s.Contains("x") || !s.Contains("c") || s.Len() != 4 {
		t.Errorf("Contains/Len wrong: len %d", s.Len())
	}
	if got, want := oldestFirst(&s), []string{"c", "d", "b", "a"}; !slices.Equal(got, want) {
		t.Errorf("eviction order %v; want %v", got, want)
	}
	if s.Len() != 0 {
		t.Errorf("len after draining = %d", s.Len())
	}
	s.Touch("z") // nodes are reused from the free list
	if got := oldestFirst(&s); !slices.Equal(got, []string{"z"}) {
		t.Errorf("after reuse: %v", got)
	}
	s.Touch("y")
	s.Clear()
	if s.Len() != 0 || s.Contains("y") {
		t.Error("Clear kept keys")
	}
}

// TestAgainstModel checks random operations against a slice kept in
// recency order.
func TestAgainstModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var s Set[uint64]
	var model []uint64 // most recent last
	for range 20000 {
		k := r.Uint64N(64)
		i := slices.Index(model, k)
		switch op := r.IntN(4); op {
		case 0, 1:
			added := s.Touch(k)
			if added != (i < 0) {
				t.Fatalf("Touch(%d) added = %v; model holds it: %v", k, added, i >= 0)
			}
			if i >= 0 {
				model = slices.Delete(model, i, i+1)
			}
			model = append(model, k)
		case 2:
			if held := s.MoveToFront(k); held != (i >= 0) {
				t.Fatalf("MoveToFront(%d) = %v", k, held)
			}
			if i >= 0 {
				model = append(slices.Delete(model, i, i+1), k)
			}
		case 3:
			got, ok := s.RemoveOldest()
			if ok != (len(model) > 0) || ok && got != model[0] {
				t.Fatalf("RemoveOldest = %d, %v; model %v", got, ok, model)
			}
			if ok {
				model = model[1:]
			}
		}
		if s.Len() != len(model) {
			t.Fatalf("Len = %d; model %d", s.Len(), len(model))
		}
	}
}

func BenchmarkTouch(b *testing.B) {
	var s Set[uint64]
	keys := make([]uint64, 1<<16)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range keys {
		keys[i] = r.Uint64()
	}
	b.ResetTimer()
	for i := range b.N {
		s.Touch(keys[i&(1<<16-1)])
		if s.Len() > 1<<15 {
			s.RemoveOldest()
		}
	}
}
