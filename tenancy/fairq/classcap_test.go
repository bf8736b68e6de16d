package fairq

import (
	"sync/atomic"
	"testing"
)

// classCap is a ClassCapacity with headroom for Interactive: Background
// has room below bgLimit running grants, Interactive below limit.
type classCap struct {
	limit, bgLimit atomic.Int64
}

func (c *classCap) Saturated(model string, inflight int) bool {
	return c.SaturatedFor(model, inflight, Interactive)
}

func (c *classCap) SaturatedFor(_ string, inflight int, cl Class) bool {
	if cl == Background {
		return int64(inflight) >= c.bgLimit.Load()
	}
	return int64(inflight) >= c.limit.Load()
}

func TestClassCapacityHeadroom(t *testing.T) {
	c := &classCap{}
	c.limit.Store(3)
	c.bgLimit.Store(2)
	q, _ := newTestQueue(t, Config{}, c, nil)
	bg := Ticket{Tenant: "b", Class: Background, Model: "m", Cost: 10}
	in := Ticket{Tenant: "a", Class: Interactive, Model: "m", Cost: 10}

	bg1, _ := grantNow(t, q, bg), grantNow(t, q, bg)
	// Background is at its limit: it waits, though the model has room.
	bg3 := enqueue(t, q, bg)
	// An interactive request takes the headroom at once, even with
	// background waiting ahead of it (queued, dispatched in the same call).
	in1 := enqueue(t, q, in)
	if !ready(in1) {
		t.Fatal("interactive request not dispatched into the headroom")
	}
	if ready(bg3) {
		t.Fatal("background dispatched past its limit")
	}
	bg1.Done() // two running, one of them interactive: still no room for background
	if ready(bg3) {
		t.Fatal("background dispatched into the headroom")
	}
	in1.grant.Done()
	if !ready(bg3) {
		t.Fatal("background not dispatched once it had room")
	}
}

func TestClassCapacityCreditNotBanked(t *testing.T) {
	c := &classCap{}
	c.limit.Store(1)
	c.bgLimit.Store(0) // no room for background at all
	q, _ := newTestQueue(t, Config{BackgroundShare: 0.5}, c, nil)
	s := newStepper(t, grantNow(t, q, Ticket{Tenant: "a", Model: "m"}))
	bg := enqueue(t, q, Ticket{Tenant: "b", Class: Background, Model: "m"})
	for range 6 {
		s.add(enqueue(t, q, Ticket{Tenant: "a", Model: "m"}))
	}
	// Six interactive dispatches while background has no room: it gets
	// none of them, and its credit stays one dispatch.
	for range 6 {
		if tk := s.step(1); tk.Class != Interactive {
			t.Fatalf("dispatched %v without room for it", tk.Class)
		}
	}
	c.bgLimit.Store(1)
	s.add(bg)
	s.add(enqueue(t, q, Ticket{Tenant: "a", Model: "m"}), enqueue(t, q, Ticket{Tenant: "a", Model: "m"}))
	var order []Class
	for range 3 {
		order = append(order, s.step(1).Class)
	}
	// The banked credit buys exactly one background dispatch, at once.
	if order[0] != Background || order[1] != Interactive || order[2] != Interactive {
		t.Errorf("order %v; want background once, then interactive", order)
	}
}
