package fairq

import (
	"math"
	"math/rand/v2"
	"testing"
)

// Any sequence of charges and lifts composes into one (add, floor) pair
// that gives the same result on any starting value.
func TestOpsCompose(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		var seq []func(float64) float64
		o := identity
		for range rng.IntN(8) {
			if rng.IntN(2) == 0 {
				c := float64(rng.IntN(200) - 50)
				seq = append(seq, func(x float64) float64 { return x + c })
				o = o.then(ops{add: c, floor: math.Inf(-1)})
			} else {
				f := float64(rng.IntN(1000))
				seq = append(seq, func(x float64) float64 { return max(x, f) })
				o = o.then(ops{floor: f})
			}
		}
		for range 5 {
			x := float64(rng.IntN(2000) - 500)
			want := x
			for _, fn := range seq {
				want = fn(want)
			}
			if got := o.apply(x); got != want {
				t.Fatalf("composed %+v gives %v from %v; want %v", o, got, x, want)
			}
		}
	}
}

// A shared counter's value is the same whether its updates are applied
// one by one or sent in batches, whatever exchanges fail.
func TestSharedCounterLifecycle(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		shared, local := newCounter("t", true), newCounter("t", false)
		remote := 0.0 // what Redis holds
		for range 50 {
			switch rng.IntN(4) {
			case 0:
				v := float64(rng.IntN(100))
				shared.charge(v)
				local.charge(v)
			case 1:
				f := local.value() + float64(rng.IntN(100)-50)
				shared.lift(f)
				local.lift(f)
			case 2: // a successful exchange
				remote = shared.snapshot().apply(remote)
				shared.synced(remote, true)
			case 3: // a failed one
				shared.snapshot()
				shared.unsent()
			}
			if a, b := shared.value(), local.value(); a != b {
				t.Fatalf("shared counter %v, local %v", a, b)
			}
		}
	}
}

// A counter Redis lost is re-seeded with the local value.
func TestCounterReseed(t *testing.T) {
	c := newCounter("t", true)
	c.charge(500)
	c.synced(c.snapshot().apply(0), true)
	c.charge(7)
	c.snapshot()
	c.synced(0, false) // the server forgot everything
	if v := c.value(); v != 507 {
		t.Fatalf("value %v after reseed; want 507", v)
	}
	if got := c.snapshot().apply(0); got != 507 {
		t.Fatalf("next exchange would write %v; want 507", got)
	}
}
