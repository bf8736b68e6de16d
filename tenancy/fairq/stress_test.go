package fairq

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/redistest"
)

// Many clients admit, charge, cancel and finish concurrently with Kick and
// Run (which syncs through Redis); afterwards nothing is left waiting or
// running. Run it with -race.
func TestConcurrentAdmission(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		rdb, prefix := tp.Client(t)
		c := newCap(4)
		q, _ := newTestQueue(t, Config{KeyPrefix: prefix, SyncInterval: time.Millisecond, RecheckInterval: time.Millisecond,
			MaxQueuedPerTenant: 50}, c, rdb)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		runDone := make(chan error)
		go func() { runDone <- q.Run(ctx) }()

		// A canceller ends some requests' contexts at whatever point they have
		// reached: before, while or after waiting.
		cancels := make(chan context.CancelFunc, 64)
		cancellerDone := make(chan struct{})
		go func() {
			defer close(cancellerDone)
			for cf := range cancels {
				cf()
			}
		}()
		var wg sync.WaitGroup
		var mu sync.Mutex
		outcomes := map[string]int{}
		for w := range 16 {
			wg.Go(func() {
				for i := range 200 {
					rctx, rcancel := context.WithCancel(ctx)
					switch i % 7 {
					case 0:
						rcancel() // gone before it asks
					case 3:
						cancels <- rcancel
					}
					tk := Ticket{Tenant: tenantNames[w%5], Weight: float64(1 + w%3), Class: Class(i % 2), Model: []string{"m", "n"}[i%2],
						Session: tenantNames[i%9], Turn: i % 4, Attained: float64(i), Cost: float64(i % 50)}
					g, err := q.Admit(rctx, tk)
					rcancel()
					mu.Lock()
					switch {
					case err == nil:
						outcomes["granted"]++
					case errors.Is(err, context.Canceled):
						outcomes["canceled"]++
					case errors.Is(err, ErrFull):
						outcomes["full"]++
					default:
						outcomes[err.Error()]++
					}
					mu.Unlock()
					if g != nil {
						g.Charge(3)
						g.Settle(float64(i%50), 1)
						g.Done()
					}
					if i%13 == 0 {
						q.Kick()
					}
				}
			})
		}
		wg.Wait()
		close(cancels)
		<-cancellerDone
		cancel()
		if err := <-runDone; err != nil {
			t.Fatal(err)
		}
		t.Logf("outcomes: %v", outcomes)
		if outcomes["granted"] == 0 || len(outcomes) > 3 {
			t.Errorf("outcomes %v", outcomes)
		}
		if n := q.total.Load(); n != 0 {
			t.Errorf("%d requests still counted as waiting", n)
		}
		for _, m := range q.models.snapshot() {
			m.mu.Lock()
			if m.running != 0 || m.queued != 0 {
				t.Errorf("model %s: %d running, %d queued at the end", m.name, m.running, m.queued)
			}
			m.mu.Unlock()
		}
	})
}
