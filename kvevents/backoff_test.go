package kvevents

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	b := backoff{min: 100 * time.Millisecond, max: time.Second}
	bounds := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, hi := range bounds {
		hi *= time.Millisecond
		if i == len(bounds)-1 {
			hi = time.Second
		}
		if d := b.next(); d < hi/2 || d > hi {
			t.Errorf("wait %d = %v; want within [%v, %v]", i, d, hi/2, hi)
		}
	}
	b.reset()
	if d := b.next(); d > 100*time.Millisecond {
		t.Errorf("after reset: %v; want at most 100ms", d)
	}
	// Jitter: many draws at one bound are not all equal.
	seen := map[time.Duration]bool{}
	for range 50 {
		b.reset()
		seen[b.next()] = true
	}
	if len(seen) < 10 {
		t.Errorf("%d distinct waits in 50 draws; want jitter", len(seen))
	}
}
