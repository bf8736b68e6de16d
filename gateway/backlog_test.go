package gateway

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/gateway/routing"
	"github.com/warmpath/warmpath/internal/redistest"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/tenancy/fairq"
)

// A request counts in its model's backlog while admission holds it,
// and not before or after.
func TestBacklogCountsWaiting(t *testing.T) {
	var b backlog
	entered, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		_, _ = b.wait(testTurn(t, "m", fairq.Interactive), func() (func(request.Usage), error) {
			close(entered)
			<-release
			return releaseNothing, nil
		})
	}()
	<-entered
	if got := b.Of("m"); got != 1 {
		t.Errorf("backlog while admitting = %d; want 1", got)
	}
	if got := b.Of("other"); got != 0 {
		t.Errorf("another model's backlog = %d; want 0", got)
	}
	close(release)
	<-done
	if got := b.Of("m"); got != 0 {
		t.Errorf("backlog after admission = %d; want 0", got)
	}
}

// The queue's plans: a request held for a replica is ahead of the
// requests that arrived after it and behind those that arrived before,
// a request with room is no longer held (the room it claimed counts it),
// and once a request has left the queue every waiting one is behind it.
func TestBacklogPlans(t *testing.T) {
	var b backlog
	a, c := new(fleet.Replica), new(fleet.Replica)
	reps := []*fleet.Replica{a, c}
	p1, p2, p3 := new(routing.Placement), new(routing.Placement), new(routing.Placement)
	for _, p := range []*routing.Placement{p1, p2, p3} {
		b.enter(p)
	}
	plan := func(prompt, hit int) *scoring.Plan {
		return &scoring.Plan{PromptTokens: prompt, Predicted: []int{hit}}
	}
	b.Plan(p1, a, plan(1000, 200), false)
	b.Plan(p3, a, plan(500, 0), false)
	b.Plan(p2, c, plan(300, 100), false)
	fill := func(p *routing.Placement) []scoring.Endpoint {
		eps := make([]scoring.Endpoint, len(reps))
		b.Fill(p, reps, eps)
		return eps
	}
	check := func(name string, e scoring.Endpoint, ahead int, tokens int64, behind int) {
		t.Helper()
		if e.GatewayAhead != ahead || e.GatewayAheadTokens != tokens || e.GatewayBehind != behind {
			t.Errorf("%s: ahead %d (%d tokens), behind %d; want %d (%d), %d",
				name, e.GatewayAhead, e.GatewayAheadTokens, e.GatewayBehind, ahead, tokens, behind)
		}
	}
	eps := fill(p2)
	check("p2 on a", eps[0], 1, 800, 1)
	check("p2 on c (its own plan)", eps[1], 0, 0, 0)
	eps = fill(p3)
	check("p3 on a", eps[0], 1, 800, 0)
	check("p3 on c", eps[1], 1, 200, 0)
	eps = fill(p1)
	check("p1 on a", eps[0], 0, 0, 1)
	check("p1 on c", eps[1], 0, 0, 1)
	b.Plan(p2, c, plan(300, 100), true) // room on c: dispatched
	check("p3 on c once p2 has room", fill(p3)[1], 0, 0, 0)
	b.Plan(p2, a, plan(300, 0), false)
	b.leave(p2)
	eps = fill(p2)
	check("p2 routed, on a", eps[0], 0, 0, 2)
	// A plan made after the request left the queue is not kept.
	b.Plan(p2, c, plan(300, 0), false)
	check("p3 on c after p2 left", fill(p3)[1], 0, 0, 0)
}

// Two gateways share their backlogs through a real Redis: each counts
// the other's waiting requests, and the other's requests held for a
// replica (named alike in both fleets) as ahead of its own when they
// arrived earlier. A gateway that stops writing drops out, and one that
// stops removes its part.
func TestBacklogShared(t *testing.T) {
	rdb, prefix := redistest.Client(t)
	key := prefix + backlogHash
	var a, b backlog
	mk := func(bl *backlog, id string) *backlogSync {
		return &backlogSync{b: bl, rdb: rdb, key: key, id: id, every: 100 * time.Millisecond, limit: 2 * time.Second,
			failed: func() { t.Errorf("%s: exchange failed", id) }, log: slog.Default()}
	}
	sa, sb := mk(&a, "a"), mk(&b, "b")
	repA, repB := &fleet.Replica{Spec: fleet.ReplicaSpec{Name: "r1"}}, &fleet.Replica{Spec: fleet.ReplicaSpec{Name: "r1"}}
	a.counter("m").Add(3)
	b.counter("m").Add(1)
	held, early, late := new(routing.Placement), new(routing.Placement), new(routing.Placement)
	a.enter(held)
	b.enter(early)
	b.enter(late)
	// Arrival times set apart (the clock may not tick between enters).
	a.order[held] = arrival{seq: 1, at: 200}
	b.order[early], b.order[late] = arrival{seq: 1, at: 100}, arrival{seq: 2, at: 300}
	a.Plan(held, repA, &scoring.Plan{PromptTokens: 1000, Predicted: []int{200}}, false)

	ctx := t.Context()
	now := time.Now()
	for _, s := range []*backlogSync{sa, sb, sa} {
		if err := s.exchange(ctx, now); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.Of("m"); got != 4 {
		t.Errorf("b's backlog %d; want 4 (1 + a's 3)", got)
	}
	if got := a.Of("m"); got != 4 {
		t.Errorf("a's backlog %d; want 4 (3 + b's 1)", got)
	}
	fill := func(p *routing.Placement) scoring.Endpoint {
		eps := make([]scoring.Endpoint, 1)
		b.Fill(p, []*fleet.Replica{repB}, eps)
		return eps[0]
	}
	if e := fill(late); e.GatewayAhead != 1 || e.GatewayAheadTokens != 800 || e.GatewayBehind != 0 {
		t.Errorf("late arrival at b: ahead %d (%d tokens), behind %d; want a's held request ahead (800)", e.GatewayAhead, e.GatewayAheadTokens, e.GatewayBehind)
	}
	if e := fill(early); e.GatewayAhead != 0 || e.GatewayBehind != 1 {
		t.Errorf("early arrival at b: ahead %d, behind %d; want a's held request behind", e.GatewayAhead, e.GatewayBehind)
	}

	// a stops writing: past the TTL b no longer counts it, and b's next
	// exchange deletes its part.
	later := now.Add(backlogTTL(sb.every) + time.Second)
	for range 2 {
		if err := sb.exchange(ctx, later); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.Of("m"); got != 1 {
		t.Errorf("b's backlog with a gone %d; want 1", got)
	}
	if n, err := rdb.HExists(ctx, key, "a").Result(); err != nil || n {
		t.Errorf("a's part still in Redis (%v, %v)", n, err)
	}

	// b stops: Run removes its part.
	rctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := sb.Run(rctx); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.HExists(ctx, key, "b").Result(); err != nil || n {
		t.Errorf("b's part still in Redis after Run (%v, %v)", n, err)
	}
}
