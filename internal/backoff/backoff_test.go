package backoff

import (
	"slices"
	"testing"
	"time"
)

func TestJitter(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second, Jitter: true}
	bounds := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, hi := range bounds {
		hi *= time.Millisecond
		if d := b.Next(); d < hi/2 || d > hi {
			t.Errorf("wait %d = %v; want within [%v, %v]", i, d, hi/2, hi)
		}
	}
	b.Reset()
	if d := b.Next(); d > 100*time.Millisecond {
		t.Errorf("after reset: %v; want at most 100ms", d)
	}
	// Jitter: many draws at one bound are not all equal.
	seen := map[time.Duration]bool{}
	for range 50 {
		b.Reset()
		seen[b.Next()] = true
	}
	if len(seen) < 10 {
		t.Errorf("%d distinct waits in 50 draws; want jitter", len(seen))
	}
}

func TestExact(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	var got []time.Duration
	for range 8 {
		got = append(got, b.Next())
	}
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if !slices.Equal(got, want) {
		t.Errorf("waits = %v; want %v", got, want)
	}
	b.Reset()
	if d := b.Next(); d != 100*time.Millisecond {
		t.Errorf("after reset: %v; want 100ms", d)
	}
}
