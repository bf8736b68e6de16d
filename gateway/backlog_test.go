package gateway

import (
	"testing"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/scoring"
)

// A request counts in its model's backlog while the Admitter holds it,
// and not before or after.
func TestBacklogCountsWaiting(t *testing.T) {
	var b backlog
	entered, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		_, _ = b.wait(&Request{model: "m"}, func() (func(Usage), error) {
			close(entered)
			<-release
			return releaseNothing, nil
		})
	}()
	<-entered
	if got := b.of("m"); got != 1 {
		t.Errorf("backlog while admitting = %d; want 1", got)
	}
	if got := b.of("other"); got != 0 {
		t.Errorf("another model's backlog = %d; want 0", got)
	}
	close(release)
	<-done
	if got := b.of("m"); got != 0 {
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
	p1, p2, p3 := new(placement), new(placement), new(placement)
	for _, p := range []*placement{p1, p2, p3} {
		b.enter(p)
	}
	plan := func(prompt, hit int) *scoring.Plan {
		return &scoring.Plan{PromptTokens: prompt, Predicted: []int{hit}}
	}
	b.plan(p1, a, plan(1000, 200), false)
	b.plan(p3, a, plan(500, 0), false)
	b.plan(p2, c, plan(300, 100), false)
	fill := func(p *placement) []scoring.Endpoint {
		eps := make([]scoring.Endpoint, len(reps))
		b.fill(p, reps, eps)
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
	b.plan(p2, c, plan(300, 100), true) // room on c: dispatched
	check("p3 on c once p2 has room", fill(p3)[1], 0, 0, 0)
	b.plan(p2, a, plan(300, 0), false)
	b.leave(p2)
	eps = fill(p2)
	check("p2 routed, on a", eps[0], 0, 0, 2)
	// A plan made after the request left the queue is not kept.
	b.plan(p2, c, plan(300, 0), false)
	check("p3 on c after p2 left", fill(p3)[1], 0, 0, 0)
}
