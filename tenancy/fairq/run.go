package fairq

import (
	"context"
	"math"
	"time"
)

// Run owns the queue's background work until ctx ends, then returns nil:
// every SyncInterval it exchanges counter updates with Redis (when the
// queue has a client); every RecheckInterval it re-checks capacity for
// models with waiting requests (as Kick does) and accounts saturated time;
// every ShareWindow it publishes the dispatch-share gauges and refreshes
// tenant labels; every IdleAfter it forgets idle tenants. Admission works
// without Run, but counters are then never shared and waiting requests
// move only on Done and Kick.
func (q *Queue) Run(ctx context.Context) error {
	recheck := time.NewTicker(q.cfg.RecheckInterval)
	defer recheck.Stop()
	var syncC <-chan time.Time
	if q.rdb != nil {
		st := time.NewTicker(q.cfg.SyncInterval)
		defer st.Stop()
		syncC = st.C
	}
	lastWindow, lastSweep := time.Now(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-syncC:
			_ = q.sync(ctx) // logged and counted by sync
		case now := <-recheck.C:
			q.Kick()
			q.accountSaturated(now)
			if now.Sub(lastWindow) >= q.cfg.ShareWindow {
				q.publishShares()
				q.refreshLabels()
				lastWindow = now
			}
			if now.Sub(lastSweep) >= q.cfg.IdleAfter {
				q.sweep()
				lastSweep = now
			}
		}
	}
}

// accountSaturated adds the time models have had requests waiting so far,
// so the counter advances during a long saturation too, and publishes the
// in-flight gauges (kept off the request path).
func (q *Queue) accountSaturated(now time.Time) {
	for _, m := range q.models.snapshot() {
		m.mu.Lock()
		m.inflight.Set(float64(m.running))
		if m.queued > 0 && now.After(m.backlogSince) {
			m.satTotal.Add(now.Sub(m.backlogSince).Seconds())
			m.backlogSince = now
		}
		m.mu.Unlock()
	}
}

// publishShares sets, per tenant label, the share of queued dispatches in
// the window just ended and the fair share: the label's weight over the
// weights of all tenants that waited in it.
func (q *Queue) publishShares() {
	type agg struct {
		dispatched int64
		weight     float64
	}
	byLabel := map[string]*agg{}
	var total int64
	var totalW float64
	for _, t := range q.tenants.snapshot() {
		d := t.winDispatched.Swap(0)
		waited := t.winBacklogged.Swap(false) || t.queued.Load() > 0
		if d == 0 && !waited {
			continue
		}
		lbl := t.series.Load().label
		a := byLabel[lbl]
		if a == nil {
			a = &agg{}
			byLabel[lbl] = a
		}
		a.dispatched += d
		total += d
		if waited {
			w := math.Float64frombits(t.weight.Load())
			a.weight += w
			totalW += w
		}
	}
	for lbl := range q.met.shared {
		if byLabel[lbl] == nil {
			q.met.dispatchShare.WithLabelValues(lbl).Set(0)
			q.met.weightShare.WithLabelValues(lbl).Set(0)
			delete(q.met.shared, lbl)
		}
	}
	for lbl, a := range byLabel {
		share, fair := 0.0, 0.0
		if total > 0 {
			share = float64(a.dispatched) / float64(total)
		}
		if totalW > 0 {
			fair = a.weight / totalW
		}
		q.met.dispatchShare.WithLabelValues(lbl).Set(share)
		q.met.weightShare.WithLabelValues(lbl).Set(fair)
		q.met.shared[lbl] = true
	}
}

// refreshLabels re-asks Config.Label for every known tenant.
func (q *Queue) refreshLabels() {
	for _, t := range q.tenants.snapshot() {
		if lbl := q.cfg.Label(t.id); lbl != t.series.Load().label {
			t.series.Store(q.met.seriesFor(lbl))
		}
	}
}

// sweep forgets tenants and counters unused since the last sweep, with
// nothing waiting or running and nothing left to sync.
func (q *Queue) sweep() {
	for _, m := range q.models.snapshot() {
		m.mu.Lock()
		for id, c := range m.counters {
			idle := c.queued == 0 && c.inflight == 0 && c.uses == c.seenUses &&
				c.sent.isIdentity() && c.pending.isIdentity()
			if idle {
				delete(m.counters, id)
			}
			c.seenUses = c.uses
		}
		m.mu.Unlock()
	}
	q.tenants.retain(func(_ string, t *tenant) bool {
		u := t.uses.Load()
		keep := u != t.seenUses || t.queued.Load() > 0
		t.seenUses = u
		return keep
	})
}
