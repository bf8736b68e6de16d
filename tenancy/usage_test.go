package tenancy

import (
	"context"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/redistest"
)

// TestUsageRunFlushes: Record makes no round trip; Run writes the batch,
// and once more when its context ends.
func TestUsageRunFlushes(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e := newEnv(t, tp)
		labels := NewLabeler(1)
		u := NewUsage(e.r, testConfig(t), labels, nil)
		p := principal("acme", "k1", Limits{}, Limits{})
		q := principal("beta", "k2", Limits{}, Limits{})
		u.Record(p, Counts{Requests: 1, PromptTokens: 10, CachedTokens: 8, CompletionTokens: 2})
		u.Record(p, Counts{Requests: 1, PromptTokens: 10})
		u.Record(p, Counts{Uncached: Uncached{New: 1, ClientBreak: 2, Evicted: 3, RoutedAway: 4, StaleIndex: 5, ColdReplica: 6}})
		u.Record(q, Counts{Requests: 1, PromptTokens: 99})
		if n := usageKeys(t, e); len(n) != 0 {
			t.Fatalf("Record wrote to Redis: %v", n)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := u.Run(ctx); err != nil {
			t.Fatal(err)
		}
		from, to := time.Now().Add(-time.Hour), time.Now().Add(time.Minute)
		_, total, err := u.Query(t.Context(), "acme", "", from, to, time.Hour)
		if err != nil || total != (Counts{Requests: 2, PromptTokens: 20, CachedTokens: 8, CompletionTokens: 2,
			Uncached: Uncached{New: 1, ClientBreak: 2, Evicted: 3, RoutedAway: 4, StaleIndex: 5, ColdReplica: 6}}) {
			t.Fatalf("acme total = %+v, %v", total, err)
		}
		_, kt, _ := u.Query(t.Context(), "acme", "k1", from, to, time.Hour)
		_, other, _ := u.Query(t.Context(), "acme", "k2", from, to, time.Hour)
		if kt != total || other != (Counts{}) {
			t.Errorf("key totals: k1 %+v, beta's k2 under acme %+v", kt, other)
		}
		if labels.Label("acme") != "acme" || labels.Label("beta") != Other {
			t.Errorf("labels: acme %s beta %s", labels.Label("acme"), labels.Label("beta"))
		}
		ttl, _ := e.rdb.TTL(t.Context(), u.usageKey("acme", "", time.Now().UTC())).Result()
		if ttl <= testConfig(t).Usage.Retention {
			t.Errorf("usage TTL %v; want retention plus a day", ttl)
		}
	})
}

// TestLastUsed: written at most once a minute per key, by Store.Run.
func TestLastUsed(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e := newEnv(t, tp)
		mustTenant(t, e.store, Tenant{ID: "acme"})
		k, full := mustKey(t, e.store, "acme", KeySpec{})
		for range 3 {
			if _, err := e.auth.Authenticate(t.Context(), bearer(full)); err != nil {
				t.Fatal(err)
			}
		}
		if n := len(e.store.pending); n != 1 {
			t.Fatalf("%d last-used writes queued for three uses; want 1", n)
		}
		e.store.flushLastUsed(t.Context())
		e.clock.advance(30 * time.Second)
		_, _ = e.auth.Authenticate(t.Context(), bearer(full))
		if n := len(e.store.pending); n != 0 {
			t.Fatalf("a second write queued within the minute")
		}
		e.clock.advance(31 * time.Second)
		_, _ = e.auth.Authenticate(t.Context(), bearer(full))
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := e.store.Run(ctx); err != nil { // final flush
			t.Fatal(err)
		}
		got, err := e.store.GetKey(t.Context(), "acme", k.ID)
		if err != nil || got.LastUsed.IsZero() || got.LastUsed.Sub(e.clock.now()).Abs() > time.Millisecond {
			t.Fatalf("last used = %v (now %v), %v", got.LastUsed, e.clock.now(), err)
		}
	})
}

// usageKeys returns the usage keys under e's prefix, on every master.
func usageKeys(t *testing.T, e *env) []string {
	t.Helper()
	var keys []string
	err := redistest.ScanAll(t.Context(), e.rdb, e.r.Prefix+"usage:*", func(k string) error {
		keys = append(keys, k)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}
