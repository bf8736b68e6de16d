package gateway

import (
	"log/slog"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/redistest"
)

// The shared backlog through every topology a gateway supports: the
// backlog hash exchanged by two gateways. The topologies are private (the
// gateway tests have no shared ones).
func TestBacklogOnTopologies(t *testing.T) {
	for _, k := range redistest.Wanted() {
		t.Run(string(k), func(t *testing.T) {
			tp := redistest.StartTopology(t, k)
			rdb := tp.NewClient()
			t.Cleanup(func() { rdb.Close() })
			const prefix = "wp:"
			var a, b backlog
			mk := func(bl *backlog, id string) *backlogSync {
				return &backlogSync{b: bl, rdb: rdb, key: prefix + backlogHash, id: id, every: 100 * time.Millisecond,
					limit: 2 * time.Second, failed: func() {}, log: slog.Default()}
			}
			sa, sb := mk(&a, "a"), mk(&b, "b")
			a.counter("m").Add(3)
			b.counter("m").Add(1)
			now := time.Now()
			for _, s := range []*backlogSync{sa, sb, sa} {
				if err := s.exchange(t.Context(), now); err != nil {
					t.Fatalf("exchange: %v", err)
				}
			}
			if a.Of("m") != 4 || b.Of("m") != 4 {
				t.Errorf("backlogs %d and %d; want 4 each (3 + 1)", a.Of("m"), b.Of("m"))
			}
		})
	}
}
