package scoring

import (
	"math"
	"math/rand/v2"
	"testing"
)

// A prefix's count is the requests that shared it before, decayed with
// the horizon; other prefixes, key 0 and an unknown horizon count
// nothing.
func TestDemand(t *testing.T) {
	var d Demand
	if got := d.Observe(7, 0, 0, 100); got != 0 {
		t.Fatalf("first request: %v earlier; want 0", got)
	}
	if got := d.Observe(7, 0, 0, 100); got != 1 {
		t.Errorf("second request at once: %v earlier; want 1", got)
	}
	if got, want := d.Observe(7, 0, 100, 100), 2/math.E; !nearly(got, want) {
		t.Errorf("a horizon later: %v earlier; want 2/e = %v", got, want)
	}
	if got := d.Observe(8, 0, 100, 100); got != 0 {
		t.Errorf("another prefix: %v earlier; want 0", got)
	}
	if d.Observe(0, 0, 100, 100) != 0 || d.Observe(0, 0, 100, 100) != 0 {
		t.Error("key 0 counted")
	}
	if d.Observe(9, 0, 0, 0) != 0 || d.Observe(9, 0, 0, 0) != 0 || d.Observe(9, 0, 0, math.Inf(1)) != 0 {
		t.Error("counted without a horizon")
	}
}

// Sharers are other conversations: a session that observed the prefix
// last adds nothing by observing it again, another session does, and an
// anonymous request always counts.
func TestDemandCountsOtherSessions(t *testing.T) {
	var d Demand
	a, b := SessionID("a"), SessionID("b")
	if a == 0 || b == 0 || a == b || SessionID("") != 0 {
		t.Fatalf("SessionID: a %x, b %x, none %x", a, b, SessionID(""))
	}
	d.Observe(7, a, 0, 100)
	for range 5 {
		if got := d.Observe(7, a, 0, 100); got != 1 {
			t.Fatalf("the same conversation again: %v earlier; want its first request only", got)
		}
	}
	if got := d.Observe(7, b, 0, 100); got != 1 {
		t.Errorf("another conversation: %v earlier; want 1", got)
	}
	if got := d.Observe(7, a, 0, 100); got != 2 {
		t.Errorf("the first conversation after another: %v earlier; want 2", got)
	}
	if got := d.Observe(7, 0, 0, 100); got != 3 {
		t.Errorf("an anonymous request: %v earlier; want 3", got)
	}
	if got := d.Observe(7, 0, 0, 100); got != 4 {
		t.Errorf("a second anonymous request: %v earlier; want 4", got)
	}
}

// A full table keeps the most demanded prefixes: a newcomer replaces the
// least demanded of the slots it may take.
func TestDemandEvictsTheLeastDemanded(t *testing.T) {
	var d Demand
	const hot = 12345
	for range 50 {
		d.Observe(hot, 0, 0, 1e6)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 * demandSlots {
		d.Observe(rng.Uint64()|1, 0, 1, 1e6)
	}
	if got := d.Observe(hot, 0, 2, 1e6); got < 49 {
		t.Errorf("hot prefix: %v earlier after a flood of one-off prefixes; want its 50", got)
	}
}

// HeldPrefix names the deepest block any replica holds.
func TestHeldPrefix(t *testing.T) {
	keys := []uint64{11, 22, 33, 44}
	for _, c := range []struct {
		matched []int
		want    uint64
	}{
		{[]int{0, 0}, 0},
		{[]int{15, 0}, 0},      // not a whole block
		{[]int{16, 40}, 22},    // two whole blocks on the second
		{[]int{99, 0}, 44},     // capped at the keys
		{nil, 0},               // no matches
		{[]int{64, 63}, 44},    // the best, not the first
		{[]int{32, 48, 0}, 33}, // three blocks
	} {
		if got := HeldPrefix(c.matched, nil, keys, 16); got != c.want {
			t.Errorf("HeldPrefix(%v) = %d; want %d", c.matched, got, c.want)
		}
	}
	if HeldPrefix([]int{64}, nil, keys, 0) != 0 {
		t.Error("block size 0 named a prefix")
	}
	// A CPU tier's blocks continue the GPU's: the second replica holds
	// one block on GPU and two more in its CPU tier.
	if got := HeldPrefix([]int{32, 16}, []int{0, 32}, keys, 16); got != 33 {
		t.Errorf("with CPU tiers: %d; want 33", got)
	}
}

// The calibrator counts a model's prefix demand over its conversations'
// lifetime: nothing before it has seen conversations.
func TestCalibratorObservePrefix(t *testing.T) {
	c := NewCalibrator(DefaultCost())
	if c.ObservePrefix("m", 5, 0, 0) != 0 || c.ObservePrefix("m", 5, 0, 0) != 0 {
		t.Fatal("demand counted before any conversation was seen")
	}
	for range 10 {
		c.ObserveTurn("m", 1, 0)
		c.ObserveTurn("m", 2, 8)
		c.ObserveTurn("m", 3, 8)
	}
	st := c.Sessions("m")
	if life := st.Lifetime(); !(life > 0) {
		t.Fatalf("lifetime %v", life)
	}
	c.ObservePrefix("m", 5, 0, 10)
	if got := c.ObservePrefix("m", 5, 0, 10); got != 1 {
		t.Errorf("demand %v; want the one request before", got)
	}
	if got := c.ObservePrefix("other", 5, 0, 10); got != 0 {
		t.Errorf("another model's demand %v; want 0", got)
	}
}

// The replication term costs a scored decision no allocation: compare
// allocs/op with and without demand.
func BenchmarkDecideShared(b *testing.B) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	for _, sharers := range []float64{0, 30} {
		b.Run(map[bool]string{false: "no-demand", true: "demand"}[sharers > 0], func(b *testing.B) {
			in := harnessInput(3000, sharers)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := warm.Decide(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkObservePrefix(b *testing.B) {
	c := NewCalibrator(DefaultCost())
	for range 10 {
		c.ObserveTurn("m", 1, 0)
		c.ObserveTurn("m", 2, 60)
	}
	b.ReportAllocs()
	var now float64
	for b.Loop() {
		now += 0.01
		c.ObservePrefix("m", uint64(now)%64+1, 0, now)
	}
}
