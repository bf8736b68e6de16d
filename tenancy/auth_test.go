package tenancy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/redistest"
)

// jwtEnv is an env whose Authenticator also takes JWTs.
func jwtEnv(t *testing.T, tp *redistest.Topology) *env {
	t.Helper()
	return newEnvConfig(t, tp, jwtConfig(t))
}

// whoami is the handler behind the middleware in these tests: it echoes
// the principal and the credential headers it still sees.
func whoami(w http.ResponseWriter, r *http.Request) {
	p, ok := FromContext(r.Context())
	if !ok {
		http.Error(w, "no principal", 500)
		return
	}
	_, _ = io.WriteString(w, p.TenantID+" "+p.KeyID+" "+r.Header.Get("Authorization")+r.Header.Get("X-Api-Key"))
}

func do(t *testing.T, srv *httptest.Server, h http.Header) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/v1/chat/completions", strings.NewReader("{}"))
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// TestBadCredentialsLookAlike is the "no hint which part was wrong" check:
// every bad credential gets a byte-identical 401.
func TestBadCredentialsLookAlike(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e := jwtEnv(t, tp)
		ctx := t.Context()
		now := e.clock.now()
		mustTenant(t, e.store, Tenant{ID: "acme"})
		mustTenant(t, e.store, Tenant{ID: "off", Disabled: true})
		good, goodKey := mustKey(t, e.store, "acme", KeySpec{})
		_, offKey := mustKey(t, e.store, "off", KeySpec{})
		rev, revKey := mustKey(t, e.store, "acme", KeySpec{})
		if _, err := e.store.RevokeKey(ctx, "acme", rev.ID); err != nil {
			t.Fatal(err)
		}
		_, expKey := mustKey(t, e.store, "acme", KeySpec{Expires: now.Add(time.Minute)})
		k := testKeys()
		hs := []byte(testHS)
		withClaim := func(name string, v any) jwt.MapClaims { c := claims("acme", now); c[name] = v; return c }
		noneTok, _ := jwt.NewWithClaims(jwt.SigningMethodNone, claims("acme", now)).SignedString(jwt.UnsafeAllowNoneSignatureType)
		srv := httptest.NewServer(e.auth.Middleware(http.HandlerFunc(whoami)))
		defer srv.Close()

		// The good credentials work, so the bad ones fail for their flaw only.
		for _, h := range []http.Header{bearer(goodKey), {"X-Api-Key": {goodKey}}, bearer(sign(t, jwt.SigningMethodRS256, k.rsa, "rs", claims("acme", now)))} {
			if code, body, _ := do(t, srv, h); code != 200 || strings.Contains(body, "wp-") || strings.Contains(body, "Bearer") {
				t.Fatalf("good credential %v: %d %q (credential headers must be stripped)", h, code, body)
			}
		}

		bad := map[string]http.Header{
			"wrong scheme":          {"Authorization": {"Basic " + goodKey}},
			"empty bearer":          {"Authorization": {"Bearer "}},
			"two authorizations":    {"Authorization": {"Bearer " + goodKey, "Bearer " + goodKey}},
			"non-ASCII byte":        bearer(goodKey[:10] + "\xe9" + goodKey[11:]),
			"truncated key":         bearer(goodKey[:len(goodKey)-1]),
			"upper-case key":        bearer(strings.ToUpper(goodKey)),
			"unknown key id":        bearer("wp-0123456789abcdef-" + goodKey[len(goodKey)-64:]),
			"wrong secret":          bearer(goodKey[:len(goodKey)-1] + flip(goodKey[len(goodKey)-1])),
			"revoked key":           bearer(revKey),
			"disabled tenant key":   bearer(offKey),
			"unknown imported key":  bearer("sk-not-a-known-key"),
			"x-api-key unknown":     {"X-Api-Key": {"sk-not-a-known-key"}},
			"jwt bad signature":     bearer(sign(t, jwt.SigningMethodHS256, []byte("another-secret-0123456789-0123456789"), "hs", claims("acme", now))),
			"jwt none":              bearer(noneTok),
			"jwt HS256 with RS key": bearer(sign(t, jwt.SigningMethodHS256, []byte(k.rsaPEM), "rs", claims("acme", now))),
			"jwt RS256 on HS kid":   bearer(sign(t, jwt.SigningMethodRS256, k.rsa, "hs", claims("acme", now))),
			"jwt ES256 on RS kid":   bearer(sign(t, jwt.SigningMethodES256, k.ec, "rs", claims("acme", now))),
			"jwt unknown kid":       bearer(sign(t, jwt.SigningMethodHS256, hs, "nope", claims("acme", now))),
			"jwt expired":           bearer(sign(t, jwt.SigningMethodHS256, hs, "hs", withClaim("exp", now.Add(-time.Hour).Unix()))),
			"jwt without exp":       bearer(sign(t, jwt.SigningMethodHS256, hs, "hs", withClaim("exp", nil))),
			"jwt wrong audience":    bearer(sign(t, jwt.SigningMethodHS256, hs, "hs", withClaim("aud", "someone-else"))),
			"jwt wrong issuer":      bearer(sign(t, jwt.SigningMethodHS256, hs, "hs", withClaim("iss", "https://evil.test"))),
			"jwt unknown tenant":    bearer(sign(t, jwt.SigningMethodHS256, hs, "hs", claims("ghost", now))),
			"jwt disabled tenant":   bearer(sign(t, jwt.SigningMethodHS256, hs, "hs", claims("off", now))),
			"jwt without tenant":    bearer(sign(t, jwt.SigningMethodHS256, hs, "hs", withClaim("tenant", nil))),
			"jwt garbage":           bearer("a.b.c"),
		}
		var want string
		var wantHdr http.Header
		for name, h := range bad {
			code, body, hdr := do(t, srv, h)
			if code != http.StatusUnauthorized {
				t.Errorf("%s: status %d; want 401 (%s)", name, code, body)
				continue
			}
			if want == "" {
				want, wantHdr = body, hdr
				if !strings.Contains(body, `"code":"invalid_api_key"`) || !strings.Contains(body, msgBadKey) {
					t.Fatalf("401 body %s; want invalid_api_key with %q", body, msgBadKey)
				}
			}
			if body != want {
				t.Errorf("%s: body %q differs from %q", name, body, want)
			}
			if hdr.Get("Content-Type") != wantHdr.Get("Content-Type") || hdr.Get("Content-Length") != wantHdr.Get("Content-Length") {
				t.Errorf("%s: headers %v differ from %v", name, hdr, wantHdr)
			}
		}

		// Expiry is checked locally on every request, cached or not.
		if code, _, _ := do(t, srv, bearer(expKey)); code != 200 {
			t.Fatalf("key before expiry: %d", code)
		}
		e.clock.advance(2 * time.Minute)
		if code, body, _ := do(t, srv, bearer(expKey)); code != 401 || body != want {
			t.Errorf("expired key: %d %q; want the same 401", code, body)
		}
		// A JWT is expired past exp plus the leeway, not before.
		_ = good
	})
}

func flip(c byte) string {
	if c == '0' {
		return "1"
	}
	return "0"
}

func TestMissingCredential(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e := newEnv(t, tp)
		srv := httptest.NewServer(e.auth.Middleware(http.HandlerFunc(whoami)))
		defer srv.Close()
		code, body, _ := do(t, srv, nil)
		if code != 401 || !strings.Contains(body, `"code":"invalid_api_key"`) || !strings.Contains(body, "didn't provide") {
			t.Fatalf("no credential: %d %s", code, body)
		}
	})
}

func TestPrincipalFromKeyAndJWT(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e := jwtEnv(t, tp)
		mustTenant(t, e.store, Tenant{ID: "acme", Name: "Acme", Isolated: true, Weight: 3, Models: []string{"qwen3-*", "llama"},
			Limits: Limits{RequestsPerMinute: 100, TokensPerMinute: 1000, Concurrent: 4}})
		k, full := mustKey(t, e.store, "acme", KeySpec{Models: []string{"qwen3-32b", "mistral"}, ClassCeiling: ClassBackground,
			Limits: Limits{Concurrent: 2}})
		p, err := e.auth.Authenticate(t.Context(), bearer(full))
		if err != nil {
			t.Fatal(err)
		}
		if p.TenantID != "acme" || p.TenantName != "Acme" || p.KeyID != k.ID || !p.Isolated || p.Weight != 3 ||
			p.ClassCeiling != ClassBackground || p.DefaultClass != ClassBackground || p.KeyLimits.Concurrent != 2 || p.Limits.TokensPerMinute != 1000 {
			t.Fatalf("principal = %+v", *p)
		}
		if p.Allows("qwen3-32b") != nil || p.Allows("mistral") == nil || p.Allows("llama") == nil {
			t.Errorf("allow-list %v: the key narrows the tenant's", p.Models)
		}
		if p.Class(ClassInteractive) != ClassBackground {
			t.Errorf("class above the ceiling was granted")
		}

		now := e.clock.now()
		c := claims("acme", now)
		c["warmpath_class"] = ClassBackground
		c["warmpath_limits"] = map[string]any{"requests_per_minute": 10, "tokens_per_minute": 5000}
		jp, err := e.auth.Authenticate(t.Context(), bearer(sign(t, jwt.SigningMethodES256, testKeys().ec, "es", c)))
		if err != nil {
			t.Fatal(err)
		}
		if jp.KeyID != "jwt:svc-1" || jp.ClassCeiling != ClassBackground || jp.KeyLimits.RequestsPerMinute != 10 ||
			jp.KeyLimits.TokensPerMinute != 1000 || jp.KeyLimits.Concurrent != 0 {
			t.Fatalf("jwt principal = %+v; claims lower (never raise) limits and class", *jp)
		}
		if jp.CacheSalt("") != p.CacheSalt("") || jp.CacheSalt("") == "" {
			t.Errorf("one tenant's salt must not depend on the credential")
		}
	})
}

func TestRotationGrace(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e := newEnv(t, tp)
		ctx := t.Context()
		mustTenant(t, e.store, Tenant{ID: "acme"})
		old, oldFull := mustKey(t, e.store, "acme", KeySpec{Name: "ci", Limits: Limits{RequestsPerMinute: 7}})
		nk, newFull, err := e.store.RotateKey(ctx, "acme", old.ID, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if nk.Name != "ci" || nk.Limits.RequestsPerMinute != 7 || nk.ID == old.ID {
			t.Fatalf("rotated key %+v does not inherit %+v", nk, old)
		}
		for _, k := range []string{oldFull, newFull} {
			if _, err := e.auth.Authenticate(ctx, bearer(k)); err != nil {
				t.Fatalf("within the grace period: %v", err)
			}
		}
		if _, _, err := e.store.RotateKey(ctx, "acme", old.ID, 0); err == nil {
			t.Errorf("a rotated key was rotated again")
		}
		e.clock.advance(time.Hour + time.Second)
		if _, err := e.auth.Authenticate(ctx, bearer(oldFull)); err == nil {
			t.Errorf("old key works after its grace period")
		}
		if _, err := e.auth.Authenticate(ctx, bearer(newFull)); err != nil {
			t.Errorf("new key: %v", err)
		}
	})
}

// TestRevocationReachesEveryGateway: a key revoked through one Store stops
// working on another within the stated bound: at once on the pub/sub
// message, and within CacheTTL without it.
func TestRevocationReachesEveryGateway(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		a := newEnv(t, tp)
		b := a.peer(t, testConfig(t))
		ctx := t.Context()
		mustTenant(t, a.store, Tenant{ID: "acme"})
		k, full := mustKey(t, a.store, "acme", KeySpec{})

		events := runStore(t, b.store)
		waitFor(t, events, "*") // b is subscribed
		if _, err := b.auth.Authenticate(ctx, bearer(full)); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := a.store.RevokeKey(ctx, "acme", k.ID); err != nil {
			t.Fatal(err)
		}
		waitFor(t, events, "k:"+k.ID)
		t.Logf("revocation reached the second gateway %v after the write", time.Since(start))
		if _, err := b.auth.Authenticate(ctx, bearer(full)); err == nil {
			t.Fatal("revoked key still works on the second gateway after the invalidation")
		}

		// Without pub/sub (c never runs), the cache TTL is the backstop.
		c := a.peer(t, testConfig(t))
		k2, full2 := mustKey(t, a.store, "acme", KeySpec{})
		if _, err := c.auth.Authenticate(ctx, bearer(full2)); err != nil {
			t.Fatal(err)
		}
		if _, err := a.store.RevokeKey(ctx, "acme", k2.ID); err != nil {
			t.Fatal(err)
		}
		c.clock.advance(testConfig(t).CacheTTL - time.Millisecond)
		if _, err := c.auth.Authenticate(ctx, bearer(full2)); err != nil {
			t.Fatalf("within cache_ttl the cached record may serve: %v", err)
		}
		c.clock.advance(time.Millisecond)
		if _, err := c.auth.Authenticate(ctx, bearer(full2)); err == nil {
			t.Fatal("revoked key works past cache_ttl without pub/sub")
		}
	})
}

// TestRevokeKeyInUse: a key in use is revoked even when a gateway writes
// its last-used time inside the revocation's transaction (between WATCH
// and EXEC): the revocation tries again rather than answering a conflict
// that leaves the key working.
func TestRevokeKeyInUse(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		a := newEnv(t, tp)
		ctx := t.Context()
		mustTenant(t, a.store, Tenant{ID: "acme"})
		k, full := mustKey(t, a.store, "acme", KeySpec{})
		if _, err := a.auth.Authenticate(ctx, bearer(full)); err != nil { // queues the last-used write
			t.Fatal(err)
		}
		// The transaction reads the clock between its read and its write: the
		// first time it does, the pending last-used time is flushed.
		var flushed atomic.Bool
		clk := a.store.now
		a.store.now = func() time.Time {
			if flushed.CompareAndSwap(false, true) {
				a.store.flushLastUsed(ctx)
			}
			return clk()
		}
		if _, err := a.store.RevokeKey(ctx, "acme", k.ID); err != nil {
			t.Fatalf("revoking a key whose last-used time was written meanwhile: %v", err)
		}
		if !flushed.Load() {
			t.Fatal("the last-used write did not happen inside the revocation")
		}
		got, err := a.store.readKey(ctx, k.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Revoked.IsZero() || got.LastUsed.IsZero() {
			t.Errorf("after the revocation: revoked %v, last used %v; want both set", got.Revoked, got.LastUsed)
		}
		if _, err := a.auth.Authenticate(ctx, bearer(full)); err == nil {
			t.Error("the revoked key still works")
		}
	})
}

func TestTenantUpdateReachesCache(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		a := newEnv(t, tp)
		b := a.peer(t, testConfig(t))
		mustTenant(t, a.store, Tenant{ID: "acme"})
		_, full := mustKey(t, a.store, "acme", KeySpec{})
		events := runStore(t, b.store)
		waitFor(t, events, "*")
		if _, err := b.auth.Authenticate(t.Context(), bearer(full)); err != nil {
			t.Fatal(err)
		}
		if _, err := a.store.UpdateTenant(t.Context(), "acme", func(t *Tenant) error { t.Disabled = true; return nil }); err != nil {
			t.Fatal(err)
		}
		waitFor(t, events, "t:acme")
		if _, err := b.auth.Authenticate(t.Context(), bearer(full)); err == nil {
			t.Fatal("a disabled tenant's key still works")
		}
	})
}

// TestRedisDown: cached keys keep working (stale, within cache_stale);
// uncached ones fail closed with 503, malformed ones still 401.
func TestRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	o := &redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		DialerRetries: 1, DialerRetryTimeout: time.Millisecond}
	rdb := redis.NewClient(o)
	defer rdb.Close()
	e := envWith(t, rdb, redis.NewClient(o), "down:", testConfig(t))
	mustTenant(t, e.store, Tenant{ID: "acme"})
	_, cachedKey := mustKey(t, e.store, "acme", KeySpec{})
	_, otherKey := mustKey(t, e.store, "acme", KeySpec{})
	if _, err := e.auth.Authenticate(t.Context(), bearer(cachedKey)); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	e.clock.advance(time.Minute) // past cache_ttl, within cache_stale
	if _, err := e.auth.Authenticate(t.Context(), bearer(cachedKey)); err != nil {
		t.Fatalf("cached key during the outage: %v", err)
	}
	h := httptest.NewServer(e.auth.Middleware(http.HandlerFunc(whoami)))
	defer h.Close()
	if code, body, hdr := do(t, h, bearer(otherKey)); code != 503 || !strings.Contains(body, "service_unavailable") || hdr.Get("Retry-After") == "" {
		t.Errorf("uncached key during the outage: %d %s; want 503 with Retry-After", code, body)
	}
	if code, _, _ := do(t, h, bearer("wp-short")); code != 401 {
		t.Errorf("malformed key during the outage: %d; want 401", code)
	}
	e.clock.advance(testConfig(t).CacheStale)
	if _, err := e.auth.Authenticate(t.Context(), bearer(cachedKey)); err == nil {
		t.Errorf("a cached key served past cache_ttl+cache_stale")
	}
}

func TestModeNone(t *testing.T) {
	a, err := NewAuthenticator(Config{Mode: ModeNone}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Middleware(http.HandlerFunc(whoami)))
	defer srv.Close()
	if code, body, _ := do(t, srv, nil); code != 200 || !strings.HasPrefix(body, "anonymous none") {
		t.Fatalf("mode none: %d %q", code, body)
	}
}

func TestDevKey(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e := newEnv(t, tp)
		ctx := t.Context()
		for range 2 { // idempotent across restarts
			k, err := EnsureDev(ctx, e.store, "sk-compose-dev")
			if err != nil || k != "sk-compose-dev" {
				t.Fatalf("EnsureDev = %q, %v", k, err)
			}
		}
		p, err := e.auth.Authenticate(ctx, http.Header{"X-Api-Key": {"sk-compose-dev"}})
		if err != nil || p.TenantID != DevTenant {
			t.Fatalf("dev key: %v %v", p, err)
		}
		keys, _ := e.store.ListKeys(ctx, DevTenant)
		if len(keys) != 1 || !keys[0].Imported {
			t.Fatalf("dev tenant keys = %+v; want one imported key", keys)
		}
		// Revoking the imported key reaches the hash-indexed cache entry too.
		if _, err := e.store.RevokeKey(ctx, DevTenant, keys[0].ID); err != nil {
			t.Fatal(err)
		}
		if _, err := e.auth.Authenticate(ctx, bearer("sk-compose-dev")); err == nil {
			t.Error("revoked dev key still works")
		}
		if _, err := EnsureDev(ctx, e.store, "sk-compose-dev"); err == nil {
			t.Error("EnsureDev returned a revoked key as usable")
		}
		full, err := EnsureDev(ctx, e.store, "")
		if err != nil || !bytes.HasPrefix([]byte(full), []byte("wp-")) {
			t.Fatalf("EnsureDev without a key = %q, %v", full, err)
		}
		if _, err := e.auth.Authenticate(ctx, bearer(full)); err != nil {
			t.Fatal(err)
		}
	})
}

// gateReads is a go-redis hook that counts HMGETs of one Redis key and
// holds them until open is closed.
type gateReads struct {
	key   string
	open  chan struct{}
	reads atomic.Int32
}

func (g *gateReads) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *gateReads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (g *gateReads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); cmd.Name() == "hmget" && len(args) > 1 && args[1] == g.key {
			g.reads.Add(1)
			<-g.open
		}
		return next(ctx, cmd)
	}
}

// A burst of requests with a key not yet cached costs one Redis read, and
// the read survives the first caller going away.
func TestConcurrentMissesShareARead(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e := newEnv(t, tp)
		mustTenant(t, e.store, Tenant{ID: "acme"})
		k, full := mustKey(t, e.store, "acme", KeySpec{})
		_, warm := mustKey(t, e.store, "acme", KeySpec{})
		if _, err := e.auth.Authenticate(t.Context(), bearer(warm)); err != nil { // the tenant is cached
			t.Fatal(err)
		}
		g := &gateReads{key: e.store.keyKey(k.ID), open: make(chan struct{})}
		e.r.Client.AddHook(g)
		waits := make(chan struct{}, 64)
		e.store.onWait = func(name string) {
			if name == "k:"+k.ID {
				waits <- struct{}{}
			}
		}
		const n = 16
		first, cancelFirst := context.WithCancel(t.Context())
		errs := make(chan error, n)
		auth := func(ctx context.Context) {
			_, err := e.auth.Authenticate(ctx, bearer(full))
			errs <- err
		}
		go auth(first)
		<-waits
		for range n - 1 {
			go auth(t.Context())
		}
		for range n - 1 {
			<-waits
		}
		cancelFirst()
		if err := <-errs; err == nil {
			t.Error("the caller that went away was answered")
		}
		close(g.open)
		for range n - 1 {
			if err := <-errs; err != nil {
				t.Errorf("a waiting caller: %v", err)
			}
		}
		if r := g.reads.Load(); r != 1 {
			t.Errorf("%d concurrent misses made %d reads of the key; want 1", n, r)
		}
	})
}
