package gateway

import (
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/redistest"
)

// Claims and the shared backlog through every topology a gateway
// supports: a claim's keys spread over a Cluster's slots, written and read
// each in one pipeline, and the backlog hash exchanged by two gateways.
// The topologies are private (the gateway tests have no shared ones).
func TestClaimsAndBacklogOnTopologies(t *testing.T) {
	for _, k := range redistest.Wanted() {
		t.Run(string(k), func(t *testing.T) {
			tp := redistest.StartTopology(t, k)
			rdb := tp.NewClient()
			t.Cleanup(func() { rdb.Close() })
			const prefix = "wp:"
			c := &prefixClaims{rdb: rdb, prefix: prefix + claimPrefix, ttl: time.Minute, timeout: 2 * time.Second,
				min: 1, peers: func() int { return 1 }}
			keys := make([]uint64, 64)
			slots := map[int]bool{}
			for i := range keys {
				keys[i] = rand.Uint64()
				slots[redistest.Slot(c.key(keys[i]))] = true
			}
			if err := c.write(t.Context(), "r1", keys); err != nil {
				t.Fatalf("write claims: %v", err)
			}
			for _, from := range []int{0, 10} {
				got, err := c.read(t.Context(), keys, from)
				if err != nil || len(got) != 1 || got["r1"] != len(keys) {
					t.Fatalf("read claims beyond %d = %v, %v; want r1 at %d (keys in %d slots)", from, got, err, len(keys), len(slots))
				}
			}
			if ttl := rdb.PTTL(t.Context(), c.key(keys[len(keys)-1])).Val(); ttl <= 0 || ttl > time.Minute {
				t.Errorf("claim TTL %v; want (0, 1m]", ttl)
			}
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
			if a.of("m") != 4 || b.of("m") != 4 {
				t.Errorf("backlogs %d and %d; want 4 each (3 + 1)", a.of("m"), b.of("m"))
			}
		})
	}
}
