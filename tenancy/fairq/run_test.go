package fairq

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// Run's periodic re-check dispatches when capacity frees without a Kick.
func TestRunRechecks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCap(1)
		c.forced.Store(true)
		q, _ := newTestQueue(t, Config{}, c, nil)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- q.Run(ctx) }()
		it := enqueue(t, q, Ticket{Model: "m"})
		time.Sleep(time.Second) // simulated
		if ready(it) {
			t.Fatal("dispatched while saturated")
		}
		c.forced.Store(false)
		time.Sleep(DefaultRecheckInterval)
		synctest.Wait()
		if !ready(it) {
			t.Fatal("not dispatched one recheck interval after capacity freed")
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v; want nil", err)
		}
	})
}

func TestShareGauges(t *testing.T) {
	label := func(id string) string {
		if strings.HasPrefix(id, "big") {
			return id
		}
		return "other"
	}
	q, _ := newTestQueue(t, Config{Label: label}, newCap(1), nil)
	countShares(t, q, []Ticket{
		{Tenant: "big", Weight: 2, Model: "m", Cost: 100},
		{Tenant: "small1", Weight: 1, Model: "m", Cost: 100},
		{Tenant: "small2", Weight: 1, Model: "m", Cost: 100},
	}, 10, 400, 0)
	q.publishShares()
	for lbl, want := range map[string]float64{"big": 0.5, "other": 0.5} {
		if got := metricValue(t, q.met.weightShare.WithLabelValues(lbl)); got != want {
			t.Errorf("weight share of %s = %v; want %v", lbl, got, want)
		}
		if got := metricValue(t, q.met.dispatchShare.WithLabelValues(lbl)); got < want-0.02 || got > want+0.02 {
			t.Errorf("dispatch share of %s = %v; want %v ± 0.02", lbl, got, want)
		}
	}
	if got := metricValue(t, q.met.depth.WithLabelValues("other", "interactive")); got != 20 {
		t.Errorf("depth of other = %v; want 20", got)
	}
}

// A tenant whose label changes moves to its new series; depth stays
// consistent because each waiting request remembers its series.
func TestLabelRefresh(t *testing.T) {
	top := map[string]bool{"a": true}
	q, _ := newTestQueue(t, Config{Label: func(id string) string {
		if top[id] {
			return id
		}
		return "other"
	}}, newCap(0), nil)
	enqueue(t, q, Ticket{Tenant: "a", Model: "m"})
	delete(top, "a")
	q.refreshLabels()
	it := enqueue(t, q, Ticket{Tenant: "a", Model: "m"})
	if got := metricValue(t, q.met.depth.WithLabelValues("a", "interactive")); got != 1 {
		t.Errorf("depth under the old label = %v; want 1", got)
	}
	if got := metricValue(t, q.met.depth.WithLabelValues("other", "interactive")); got != 1 {
		t.Errorf("depth under the new label = %v; want 1", got)
	}
	q.leave(it, false)
	if got := metricValue(t, q.met.depth.WithLabelValues("other", "interactive")); got != 0 {
		t.Errorf("depth under the new label after leaving = %v; want 0", got)
	}
}

func TestSweepForgetsIdleTenants(t *testing.T) {
	q, _ := newTestQueue(t, Config{}, newCap(1), nil)
	g := grantNow(t, q, Ticket{Tenant: "busy", Model: "m"})
	grantNow(t, q, Ticket{Tenant: "idle", Model: "other"}).Done()
	q.sweep() // marks
	q.sweep() // forgets what was unused since the mark
	m := q.modelFor("m")
	if m.counters["busy"] == nil {
		t.Error("forgot a tenant with a request running")
	}
	if q.modelFor("other").counters["idle"] != nil {
		t.Error("kept an idle tenant's counter")
	}
	if _, ok := q.tenants.get("idle"); ok {
		t.Error("kept an idle tenant")
	}
	g.Done()
}
