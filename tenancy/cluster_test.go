package tenancy

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/redistest"
)

// TestEveryOperationOnEveryTopology runs every Redis operation of the
// package once on each topology: on a Cluster, a transaction or script
// whose keys span slots fails (CROSSSLOT), which a single server accepts.
func TestEveryOperationOnEveryTopology(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e := newEnv(t, tp)
		runStore(t, e.store)
		ctx := t.Context()
		mustTenant(t, e.store, Tenant{ID: "acme"})
		if _, err := e.store.UpdateTenant(ctx, "acme", func(tn *Tenant) error { tn.Name = "Acme"; return nil }); err != nil {
			t.Fatalf("update tenant: %v", err)
		}
		k, full := mustKey(t, e.store, "acme", KeySpec{Name: "ci"})
		nk, nfull, err := e.store.RotateKey(ctx, "acme", k.ID, time.Hour)
		if err != nil {
			t.Fatalf("rotate: %v", err)
		}
		imp, err := e.store.ImportKey(ctx, "acme", "sk-imported-0123", KeySpec{})
		if err != nil {
			t.Fatalf("import: %v", err)
		}
		for _, tok := range []string{full, nfull, "sk-imported-0123"} {
			if _, err := e.auth.Authenticate(ctx, bearer(tok)); err != nil {
				t.Fatalf("authenticate %.12s…: %v", tok, err)
			}
		}
		if _, err := e.store.RevokeKey(ctx, "acme", imp.ID); err != nil {
			t.Fatalf("revoke: %v", err)
		}
		ks, err := e.store.ListKeys(ctx, "acme")
		listed := map[string]Key{}
		for _, x := range ks {
			listed[x.ID] = x
		}
		if err != nil || len(ks) != 3 || listed[k.ID].RotatedTo != nk.ID || listed[nk.ID].ID == "" || listed[imp.ID].Revoked.IsZero() {
			t.Fatalf("list keys = %+v, %v", ks, err)
		}
		if ts, err := e.store.ListTenants(ctx); err != nil || len(ts) != 1 || ts[0].Name != "Acme" {
			t.Fatalf("list tenants = %+v, %v", ts, err)
		}
		e.store.noteUse(nk.ID, e.clock.now())
		e.store.flushLastUsed(ctx)
		if got, err := e.store.GetKey(ctx, "acme", nk.ID); err != nil || got.LastUsed.IsZero() {
			t.Fatalf("last used = %v, %v", got.LastUsed, err)
		}
		limitAndCount(t, e, nk.ID)
	})
}

// limitAndCount admits, renews and ends a request under every kind of
// limit, for a tenant and a key, and reads back its usage.
func limitAndCount(t *testing.T, e *env, key string) {
	t.Helper()
	ctx := t.Context()
	lim := NewLimiter(e.r, testConfig(t), nil)
	all := Limits{RequestsPerMinute: 10, TokensPerMinute: 1000, Concurrent: 2}
	p := principal("acme", key, all, all)
	le, err := lim.Admit(ctx, p, "m", 100)
	if err != nil {
		t.Fatalf("admit: %v", err)
	}
	if le.Header().Get("X-Ratelimit-Remaining-Tokens") == "" || le.Header().Get("X-Ratelimit-Remaining-Requests") == "" {
		t.Fatalf("admitted without limit headers: %v", le.Header())
	}
	lim.renew(ctx)
	for _, k := range []string{le.t.conc, le.k.conc} {
		if n, err := e.rdb.ZCard(ctx, k).Result(); err != nil || n != 1 {
			t.Fatalf("leases in %s = %d, %v", k, n, err)
		}
	}
	le.Done(50)
	if n, err := e.rdb.ZCard(ctx, le.t.conc).Result(); err != nil || n != 0 {
		t.Fatalf("leases after Done = %d, %v", n, err)
	}
	u := NewUsage(e.r, testConfig(t), nil, nil)
	u.Record(p, Counts{Requests: 1, PromptTokens: 40, CompletionTokens: 10})
	u.Record(principal("beta", "other", Limits{}, Limits{}), Counts{Requests: 1})
	if err := u.Flush(ctx); err != nil {
		t.Fatalf("flush usage: %v", err)
	}
	from, to := time.Now().Add(-time.Hour), time.Now().Add(time.Minute)
	for _, k := range []string{"", key} {
		_, total, err := u.Query(ctx, "acme", k, from, to, time.Hour)
		if err != nil || total != (Counts{Requests: 1, PromptTokens: 40, CompletionTokens: 10}) {
			t.Fatalf("usage of acme key %q = %+v, %v", k, total, err)
		}
	}
}

// TestConcurrentImports: importing one key from many gateways at once
// stores it once.
func TestConcurrentImports(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e := newEnv(t, tp)
		mustTenant(t, e.store, Tenant{ID: "acme"})
		const n = 8
		ids := make(chan string, n)
		var wg sync.WaitGroup
		for range n {
			f := e.peer(t, testConfig(t))
			wg.Go(func() {
				k, err := f.store.ImportKey(context.WithoutCancel(t.Context()), "acme", "sk-shared-key-0123", KeySpec{})
				if err != nil {
					t.Errorf("import: %v", err)
				}
				ids <- k.ID
			})
		}
		wg.Wait()
		close(ids)
		first := <-ids
		for id := range ids {
			if id != first {
				t.Fatalf("one key imported as %s and %s", first, id)
			}
		}
		if ks, err := e.store.ListKeys(t.Context(), "acme"); err != nil || len(ks) != 1 {
			t.Fatalf("listed %d keys, %v; want 1", len(ks), err)
		}
	})
}

// TestPartialKeyWrites: a key is written without a transaction, so a
// failure part way must leave nothing that breaks: an index entry without
// its record is skipped, and an imported key missing from the index is
// indexed again when imported again.
func TestPartialKeyWrites(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e := newEnv(t, tp)
		ctx := t.Context()
		mustTenant(t, e.store, Tenant{ID: "acme"})
		if err := e.rdb.SAdd(ctx, e.store.tenantKeysKey("acme"), "0123456789abcdef").Err(); err != nil {
			t.Fatal(err)
		}
		if ks, err := e.store.ListKeys(ctx, "acme"); err != nil || len(ks) != 0 {
			t.Fatalf("list with a dangling index entry = %+v, %v", ks, err)
		}
		k, err := e.store.ImportKey(ctx, "acme", "sk-half-written", KeySpec{})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.rdb.SRem(ctx, e.store.tenantKeysKey("acme"), k.ID).Err(); err != nil { // as if the index write failed
			t.Fatal(err)
		}
		again, err := e.store.ImportKey(ctx, "acme", "sk-half-written", KeySpec{})
		if err != nil || again.ID != k.ID {
			t.Fatalf("import again = %s, %v; want %s", again.ID, err, k.ID)
		}
		if ks, err := e.store.ListKeys(ctx, "acme"); err != nil || len(ks) != 1 || ks[0].ID != k.ID {
			t.Fatalf("list after re-import = %+v, %v", ks, err)
		}
		if _, err := e.store.ImportKey(ctx, "beta", "sk-half-written", KeySpec{}); err == nil {
			t.Fatal("another tenant imported acme's key")
		}
	})
}
