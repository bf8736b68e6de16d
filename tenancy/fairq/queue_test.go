package fairq

import (
	"math"
	"testing"
	"time"
)

func TestFastPathAndQueue(t *testing.T) {
	c := newCap(2)
	q, _ := newTestQueue(t, Config{}, c, nil)
	tk := Ticket{Tenant: "a", Model: "m", Cost: 10}
	g1, g2 := grantNow(t, q, tk), grantNow(t, q, tk)
	if g1.Waited() != 0 || g1.Class() != Interactive {
		t.Errorf("fast grant waited %v, class %v", g1.Waited(), g1.Class())
	}
	if w := q.Waiting(); w["interactive"] != 0 || w["background"] != 0 {
		t.Errorf("Waiting before any wait = %v", w)
	}
	it := enqueue(t, q, tk)
	if ready(it) {
		t.Fatal("dispatched past the capacity limit")
	}
	if w := q.Waiting(); w["interactive"] != 1 || w["background"] != 0 {
		t.Errorf("Waiting with one interactive request queued = %v", w)
	}
	g1.Done()
	if !ready(it) {
		t.Fatal("a freed slot did not dispatch the waiting request")
	}
	g1.Done() // idempotent: must not free a second slot
	if got := enqueue(t, q, tk); ready(got) {
		t.Fatal("a second Done freed capacity twice")
	}
	q.accountSaturated(time.Now())
	if m := metricValue(t, q.met.inflight.WithLabelValues("m")); m != 2 {
		t.Errorf("inflight gauge = %v; want 2", m)
	}
	g2.Done()
	if v := metricValue(t, q.met.dispatches.WithLabelValues("a", "interactive", "fast")); v != 2 {
		t.Errorf("fast dispatches = %v; want 2", v)
	}
	if v := metricValue(t, q.met.dispatches.WithLabelValues("a", "interactive", "queued")); v != 2 {
		t.Errorf("queued dispatches = %v; want 2", v)
	}
}

// A request arriving while others wait never overtakes them, even when
// capacity freed without a Kick.
func TestNoOvertaking(t *testing.T) {
	c := newCap(1)
	q, _ := newTestQueue(t, Config{}, c, nil)
	grantNow(t, q, Ticket{Tenant: "a", Model: "m"})
	old := enqueue(t, q, Ticket{Tenant: "a", Model: "m"})
	c.limit.Store(2) // freed, nobody told the queue
	late, _, _ := q.submit(Ticket{Tenant: "b", Model: "m"})
	if late != nil || !ready(old) {
		t.Fatalf("late arrival admitted at once (%v) or the waiting one not dispatched (%v)", late != nil, ready(old))
	}
}

func TestKick(t *testing.T) {
	c := newCap(10)
	c.forced.Store(true)
	q, _ := newTestQueue(t, Config{}, c, nil)
	its := []*item{enqueue(t, q, Ticket{Model: "m"}), enqueue(t, q, Ticket{Model: "n"})}
	q.Kick()
	if ready(its[0]) || ready(its[1]) {
		t.Fatal("dispatched while saturated")
	}
	c.forced.Store(false)
	q.Kick()
	if !ready(its[0]) || !ready(its[1]) {
		t.Fatal("Kick did not dispatch after capacity freed")
	}
}

func TestInProgressSessionsFirst(t *testing.T) {
	q, _ := newTestQueue(t, Config{}, newCap(1), nil)
	s := newStepper(t, grantNow(t, q, Ticket{Tenant: "a", Model: "m"}))
	// Interleave first turns (and a request without a session) with turns
	// of sessions in progress.
	tickets := []Ticket{
		{Session: "new1", Turn: 0}, {Session: "s1", Turn: 4, Attained: 900}, {Session: "", Turn: 7},
		{Session: "new2"}, {Session: "s2", Turn: 1, Attained: 300}, {Session: "s3", Turn: 2, Attained: 600},
	}
	for _, tk := range tickets {
		tk.Tenant, tk.Model = "a", "m"
		s.add(enqueue(t, q, tk))
	}
	var got []string
	for range tickets {
		tk := s.step(0)
		got = append(got, tk.Session+"/"+string(rune('0'+tk.Turn)))
	}
	want := []string{"s2/1", "s3/2", "s1/4", "new1/0", "/7", "new2/0"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("dispatch order %v; want %v (in progress by attained service, then first turns by arrival)", got, want)
		}
	}
}

func TestLeastAttainedFirst(t *testing.T) {
	q, _ := newTestQueue(t, Config{}, newCap(1), nil)
	s := newStepper(t, grantNow(t, q, Ticket{Tenant: "a", Model: "m"}))
	attained := []float64{5000, 100, 2000, 100, 40}
	for i, a := range attained {
		s.add(enqueue(t, q, Ticket{Tenant: "a", Model: "m", Session: string(rune('A' + i)), Turn: 3, Attained: a}))
	}
	var got string
	for range attained {
		got += s.step(0).Session
	}
	if got != "EBDCA" {
		t.Fatalf("dispatch order %s; want EBDCA (least attained first, ties by arrival)", got)
	}
}

// Background keeps its minimum share of dispatches under sustained
// interactive load, and gets no more than that.
func TestBackgroundNotStarved(t *testing.T) {
	for _, tt := range []struct {
		policy string
		share  float64
		wantBg int // of 1000 dispatches
	}{{PolicyFair, 0, 100}, {PolicyFair, 0.25, 250}, {PolicyFair, -1, 0}, {PolicyStrict, 0, 0}, {PolicyStrict, 0.5, 0}} {
		q, _ := newTestQueue(t, Config{Policy: tt.policy, BackgroundShare: tt.share}, newCap(1), nil)
		s := newStepper(t, grantNow(t, q, Ticket{Tenant: "chat", Model: "m"}))
		inter := Ticket{Tenant: "chat", Model: "m", Class: Interactive, Cost: 50}
		bg := Ticket{Tenant: "agents", Model: "m", Class: Background, Cost: 50}
		for range 20 {
			s.add(enqueue(t, q, inter), enqueue(t, q, bg))
		}
		nbg := 0
		for range 1000 {
			tk := s.step(10)
			if tk.Class == Background {
				nbg++
			}
			s.add(enqueue(t, q, tk)) // sustained load of both classes
		}
		if nbg != tt.wantBg {
			t.Errorf("%s, share %v: background got %d of 1000 dispatches; want %d", tt.policy, tt.share, nbg, tt.wantBg)
		}
	}
}

// countShares runs n dispatches at capacity one, resubmitting every
// dispatched ticket so that both tenants stay backlogged, and returns each
// tenant's dispatches.
func countShares(t *testing.T, q *Queue, tickets []Ticket, backlog, n int, output float64) map[string]int {
	t.Helper()
	s := newStepper(t, grantNow(t, q, Ticket{Tenant: "warmup", Model: tickets[0].Model}))
	for range backlog {
		for _, tk := range tickets {
			s.add(enqueue(t, q, tk))
		}
	}
	got := map[string]int{}
	for range n {
		tk := s.step(output)
		got[tk.Tenant]++
		s.add(enqueue(t, q, tk))
	}
	return got
}

func TestWeightedShares(t *testing.T) {
	t.Run("weights 1:3", func(t *testing.T) {
		q, _ := newTestQueue(t, Config{}, newCap(1), nil)
		got := countShares(t, q, []Ticket{
			{Tenant: "a", Weight: 1, Model: "m", Cost: 100},
			{Tenant: "b", Weight: 3, Model: "m", Cost: 100},
		}, 50, 1000, 0)
		if sb := float64(got["b"]) / 1000; math.Abs(sb-0.75) > 0.01 {
			t.Errorf("b's share = %.3f (%v); want 0.75 ± 0.01", sb, got)
		}
	})
	t.Run("by token cost", func(t *testing.T) {
		// Equal weights, b's requests cost three times a's: equal service
		// means a gets three dispatches for each of b's.
		q, _ := newTestQueue(t, Config{}, newCap(1), nil)
		got := countShares(t, q, []Ticket{
			{Tenant: "a", Model: "m", Cost: 100},
			{Tenant: "b", Model: "m", Cost: 300},
		}, 50, 1000, 0)
		if sa := float64(got["a"]) / 1000; math.Abs(sa-0.75) > 0.01 {
			t.Errorf("a's share = %.3f (%v); want 0.75 ± 0.01", sa, got)
		}
	})
	t.Run("output tokens count", func(t *testing.T) {
		// Every request charges 100 output tokens (×2) on top of a prompt
		// cost of 100 for a and 700 for b: service 300 vs 900 per request.
		q, _ := newTestQueue(t, Config{}, newCap(1), nil)
		got := countShares(t, q, []Ticket{
			{Tenant: "a", Model: "m", Cost: 100},
			{Tenant: "b", Model: "m", Cost: 700},
		}, 50, 1000, 100)
		if sa := float64(got["a"]) / 1000; math.Abs(sa-0.75) > 0.01 {
			t.Errorf("a's share = %.3f (%v); want 0.75 ± 0.01", sa, got)
		}
	})
	t.Run("strict ignores tenants", func(t *testing.T) {
		q, _ := newTestQueue(t, Config{Policy: PolicyStrict}, newCap(1), nil)
		got := countShares(t, q, []Ticket{
			{Tenant: "a", Weight: 1, Model: "m", Cost: 100},
			{Tenant: "b", Weight: 3, Model: "m", Cost: 100},
		}, 50, 1000, 0)
		if got["a"] != 500 {
			t.Errorf("strict shares %v; want arrival order (500 each)", got)
		}
	})
}

// A tenant returning from idle is lifted to the active tenants' counters:
// it shares from now on instead of cashing in its idle time.
func TestIdleTimeNotBanked(t *testing.T) {
	q, _ := newTestQueue(t, Config{}, newCap(1), nil)
	s := newStepper(t, grantNow(t, q, Ticket{Tenant: "a", Model: "m"}))
	a, b := Ticket{Tenant: "a", Model: "m", Cost: 100}, Ticket{Tenant: "b", Model: "m", Cost: 100}
	for range 100 {
		s.add(enqueue(t, q, a))
	}
	for range 50 {
		s.step(0) // a alone: its counter reaches 5000
	}
	for range 50 {
		s.add(enqueue(t, q, b))
	}
	nb := 0
	for range 20 {
		if s.step(0).Tenant == "b" {
			nb++
		}
	}
	if nb < 9 || nb > 11 {
		t.Errorf("returning tenant got %d of 20 dispatches; want about half", nb)
	}
}

// A grant whose client left as it was dispatched is given back: the cost
// is refunded and the slot passes on.
func TestGiveBack(t *testing.T) {
	q, _ := newTestQueue(t, Config{}, newCap(1), nil)
	g0 := grantNow(t, q, Ticket{Tenant: "x", Model: "m"})
	it1 := enqueue(t, q, Ticket{Tenant: "a", Model: "m", Cost: 100})
	it2 := enqueue(t, q, Ticket{Tenant: "b", Model: "m", Cost: 100})
	m := q.modelFor("m")
	before := m.counters["a"].value()
	g0.Done()
	if !ready(it1) || ready(it2) {
		t.Fatal("want it1 dispatched first")
	}
	g := q.leave(it1, false)
	if g == nil {
		t.Fatal("leave of a dispatched item returned no grant")
	}
	g.giveBack()
	if !ready(it2) {
		t.Fatal("the given-back slot did not pass on")
	}
	if after := m.counters["a"].value(); after != before {
		t.Errorf("counter %v after refund; want %v", after, before)
	}
}

func TestSettle(t *testing.T) {
	q, _ := newTestQueue(t, Config{}, newCap(5), nil)
	g := grantNow(t, q, Ticket{Tenant: "a", Model: "m", Cost: 1000, Weight: 2})
	c := q.modelFor("m").counters["a"]
	if v := c.value(); v != 500 {
		t.Fatalf("counter = %v; want 1000/2", v)
	}
	g.Settle(300, 100) // the prediction was wrong: 200 tokens computed
	g.Settle(5000, 0)  // ignored
	g.Charge(50)       // 50 output tokens × 2
	g.Charge(math.NaN())
	g.Charge(-3)
	if v := c.value(); v != 150 {
		t.Fatalf("counter = %v; want (200 + 2×50)/2", v)
	}
	if v := metricValue(t, q.met.service.WithLabelValues("a", "interactive")); v != 1100 {
		t.Errorf("service counter = %v; want 1000 + 100 (refunds are not subtracted)", v)
	}
}

func TestConfigValidation(t *testing.T) {
	bad := []Config{
		{Policy: "lifo"}, {BackgroundShare: 1.5}, {BackgroundShare: math.NaN()}, {OutputWeight: -1},
		{MaxQueued: -1}, {MaxQueuedPerTenant: -2}, {Timeout: -1}, {AgeCredit: math.Inf(1)},
	}
	for _, cfg := range bad {
		if _, err := New(cfg, newCap(1), nil, nil, nil); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	if _, err := New(Config{}, nil, nil, nil, nil); err == nil {
		t.Error("New accepted a nil Capacity")
	}
	q, err := New(Config{BackgroundShare: -1, AgeCredit: -1}, newCap(1), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q.cfg.BackgroundShare != 0 || q.cfg.AgeCredit != 0 || q.cfg.Timeout != DefaultTimeout || q.cfg.MaxQueued != DefaultMaxQueued {
		t.Errorf("defaults: %+v", q.cfg)
	}
}

func TestSanitize(t *testing.T) {
	got := sanitize(Ticket{Weight: math.NaN(), Cost: math.Inf(1), Attained: -4, Class: 9, Turn: -1})
	if got.Weight != 1 || got.Cost != 0 || got.Attained != 0 || got.Class != Background || got.Turn != 0 {
		t.Errorf("sanitize = %+v", got)
	}
	if w := sanitize(Ticket{Weight: 1e-9}).Weight; w != 0.001 {
		t.Errorf("tiny weight → %v; want 0.001", w)
	}
}

// A tenant whose queue empties while its requests run is not idle: it is
// not lifted, so a closed-loop client (each request sent when the last
// one ends, two at a time) keeps the credit its weight gives it against a
// backlogged one. Lifting it at every return to an empty queue, as if it
// had idled, hands that credit to the other tenant: equal shares (0.5)
// at weights 1:3. Here the most b can get is 2/3: the slot one of its
// requests frees goes to the waiting a before b sends its next one, so b
// takes the slot of every other dispatch and of each of a's.
func TestClosedLoopTenantKeepsItsShare(t *testing.T) {
	q, _ := newTestQueue(t, Config{}, newCap(2), nil)
	a := Ticket{Tenant: "a", Weight: 1, Model: "m", Cost: 100}
	b := Ticket{Tenant: "b", Weight: 3, Model: "m", Cost: 100}
	type run struct {
		g  *Grant
		it *item
		tk Ticket
	}
	var running, waiting []run
	submit := func(tk Ticket) {
		g, it, err := q.submit(tk)
		if err != nil {
			t.Fatal(err)
		}
		if it == nil {
			running = append(running, run{g: g, tk: tk})
		} else {
			waiting = append(waiting, run{it: it, tk: tk})
		}
	}
	submit(b)
	submit(b)
	for range 40 {
		submit(a)
	}
	got := map[string]int{}
	for range 2000 {
		r := running[0]
		running = running[1:]
		r.g.Done() // frees a slot: the queue dispatches at once
		kept := waiting[:0]
		for _, w := range waiting {
			if ready(w.it) {
				running = append(running, run{g: &w.it.grant, tk: w.tk})
				got[w.tk.Tenant]++
			} else {
				kept = append(kept, w)
			}
		}
		waiting = kept
		submit(r.tk) // the client sends its next request
	}
	sb := float64(got["b"]) / float64(got["a"]+got["b"])
	t.Logf("dispatches %v: b's share %.3f", got, sb)
	if sb < 0.65 || sb > 0.67 {
		t.Errorf("closed-loop weight-3 tenant's share = %.3f (%v); want 2/3, all it can take", sb, got)
	}
}
