package fairq

import (
	"sync/atomic"
	"testing"
)

// placeable is a switch a ticket's Place reads, counting the calls.
type placeable struct {
	ok    atomic.Bool
	calls atomic.Int64
}

func (p *placeable) place() bool {
	p.calls.Add(1)
	return p.ok.Load()
}

func TestPlaceDispatchesFirstThatFits(t *testing.T) {
	q, _ := newTestQueue(t, Config{}, newCap(1), nil)
	s := newStepper(t, grantNow(t, q, Ticket{Tenant: "a", Model: "m"}))
	var bound, free placeable
	free.ok.Store(true)
	// A turn in progress heads the order, but its replica has no room; a
	// first turn behind it (and another tenant's) can start.
	head := enqueue(t, q, Ticket{Tenant: "a", Model: "m", Session: "s", Turn: 3, Place: bound.place})
	fresh := enqueue(t, q, Ticket{Tenant: "a", Model: "m", Place: free.place})
	s.add(head, fresh)
	if tk := s.step(1); tk.Place == nil || tk.Turn != 0 {
		t.Fatalf("dispatched %+v; want the first turn whose replica has room", tk)
	}
	if bound.calls.Load() == 0 {
		t.Error("the head was not asked first")
	}
	// Now nothing that waits can start where it goes: the first goes
	// anyway (to wait in its replica's engine), not held to its timeout.
	calls := bound.calls.Load()
	s.running.Done()
	if !ready(head) {
		t.Fatal("the head held though nothing else waits")
	}
	if bound.calls.Load() == calls {
		t.Error("the head was not asked again")
	}
}

// Refill dispatches what fits and never the fallback: when nothing that
// waits can start where it goes, all wait; then the first that can goes.
func TestRefillDispatchesOnlyWhatFits(t *testing.T) {
	c := newCap(1)
	q, _ := newTestQueue(t, Config{}, c, nil)
	c.forced.Store(true)
	var bound, free placeable
	head := enqueue(t, q, Ticket{Tenant: "a", Model: "m", Session: "s", Turn: 3, Place: bound.place})
	behind := enqueue(t, q, Ticket{Tenant: "a", Model: "m", Place: free.place})
	c.forced.Store(false)
	q.Refill()
	if ready(head) || ready(behind) {
		t.Fatal("Refill dispatched a request that cannot start where it goes")
	}
	if bound.calls.Load() == 0 || free.calls.Load() == 0 {
		t.Errorf("Place asked %d and %d times; want both asked", bound.calls.Load(), free.calls.Load())
	}
	free.ok.Store(true)
	q.Refill()
	if ready(head) || !ready(behind) {
		t.Fatalf("after Refill: head dispatched %v, the request that fits %v; want only the one that fits", ready(head), ready(behind))
	}
	behind.grant.Done() // a finish dispatches as before: with the fallback
	if !ready(head) {
		t.Error("the head held once room freed though nothing else waits")
	}
}

func TestPlaceScanIsBounded(t *testing.T) {
	q, _ := newTestQueue(t, Config{ScanDepth: 3}, newCap(1), nil)
	running := grantNow(t, q, Ticket{Tenant: "a", Model: "m"})
	var none, last placeable
	last.ok.Store(true)
	for range 5 {
		enqueue(t, q, Ticket{Tenant: "a", Model: "m", Place: none.place})
	}
	tail := enqueue(t, q, Ticket{Tenant: "a", Model: "m", Place: last.place})
	running.Done()
	if ready(tail) || last.calls.Load() != 0 {
		t.Fatalf("the sixth request was considered (%d calls) with scan depth 3", last.calls.Load())
	}
	if got := none.calls.Load(); got != 3 {
		t.Errorf("%d Place calls for one dispatch; want 3", got)
	}
}

// The scan follows the dispatch order across tenants: the least counter's
// flow first, each flow's requests in its own order.
func TestPlaceScanOrder(t *testing.T) {
	q, _ := newTestQueue(t, Config{}, newCap(1), nil)
	running := grantNow(t, q, Ticket{Tenant: "rich", Model: "m", Cost: 1000})
	var order []string
	ticket := func(tenant, name string, turn int, fits bool) Ticket {
		return Ticket{Tenant: tenant, Model: "m", Session: name, Turn: turn, Place: func() bool {
			order = append(order, name)
			return fits
		}}
	}
	// Poor arrives first, so it is lifted only to the last dispatch's
	// counter (0) and stays below rich's 1000.
	enqueue(t, q, ticket("poor", "poor-first", 0, false))
	enqueue(t, q, ticket("poor", "poor-turn", 1, false))
	enqueue(t, q, ticket("rich", "rich-first", 0, false))
	enqueue(t, q, ticket("rich", "rich-turn", 2, false))
	order = nil
	running.Done()
	want := []string{"poor-turn", "poor-first", "rich-turn", "rich-first"}
	if len(order) != len(want) {
		t.Fatalf("scan order %v; want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("scan order %v; want %v", order, want)
		}
	}
}

// When no interactive request can use the room, a background one that
// can takes it, without spending background's credit; background's own
// turn, when no background request can start, goes to interactive and
// keeps the credit.
func TestPlaceAcrossClasses(t *testing.T) {
	q, _ := newTestQueue(t, Config{BackgroundShare: 0.5}, newCap(1), nil)
	s := newStepper(t, grantNow(t, q, Ticket{Tenant: "a", Model: "m"}))
	var inter, bg placeable
	bg.ok.Store(true)
	s.add(enqueue(t, q, Ticket{Tenant: "a", Model: "m", Place: inter.place}))
	s.add(enqueue(t, q, Ticket{Tenant: "b", Class: Background, Model: "m", Place: bg.place}))
	s.add(enqueue(t, q, Ticket{Tenant: "b", Class: Background, Model: "m", Place: bg.place}))
	if tk := s.step(1); tk.Class != Background {
		t.Fatalf("dispatched %v; want the background request that fits", tk.Class)
	}
	inter.ok.Store(true)
	bg.ok.Store(false)
	// The share of 0.5 has now earned background a dispatch (credit 1):
	// none of it can start, so interactive goes, and background keeps it.
	if tk := s.step(1); tk.Class != Interactive {
		t.Fatalf("dispatched %v; want interactive", tk.Class)
	}
	bg.ok.Store(true)
	s.add(enqueue(t, q, Ticket{Tenant: "a", Model: "m", Place: inter.place}))
	if tk := s.step(1); tk.Class != Background {
		t.Fatalf("dispatched %v; want background, owed its share", tk.Class)
	}
}
