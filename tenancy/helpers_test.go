package tenancy

import (
	"context"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/redistest"
)

const (
	testSalt  = "test-salt-secret-0123456789"
	testAdmin = "admin-key-0123456789abcdef"
)

// testConfig is a valid keys+jwt configuration with no JWT keys yet.
func testConfig(t testing.TB) Config {
	t.Helper()
	cfg, err := Config{Mode: ModeKeys, SaltSecret: testSalt, AdminKey: testAdmin}.Validate()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// env is one gateway's tenancy components on a shared test Redis.
type env struct {
	tp    *redistest.Topology // nil for a private server
	rdb   redis.UniversalClient
	r     Redis
	store *Store
	auth  *Authenticator
	clock *clock
}

// clock is a settable time source shared by a Store and an Authenticator.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestMain stops the shared Cluster and Sentinel topologies after the tests.
func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

// newEnv returns components over a fresh prefix of tp.
func newEnv(t testing.TB, tp *redistest.Topology) *env {
	t.Helper()
	return newEnvConfig(t, tp, testConfig(t))
}

// newEnvConfig is newEnv with cfg.
func newEnvConfig(t testing.TB, tp *redistest.Topology, cfg Config) *env {
	t.Helper()
	rdb, prefix := tp.Client(t)
	t.Cleanup(func() { cleanRate(rdb, prefix) })
	e := envWith(t, rdb, tp.NewClient(), prefix, cfg)
	e.tp = tp
	return e
}

// peer builds a second (third, …) gateway's components on e's Redis and
// prefix, with its own client, as another process would have.
func (e *env) peer(t testing.TB, cfg Config) *env {
	t.Helper()
	f := envWith(t, e.rdb, e.tp.NewClient(), e.r.Prefix, cfg)
	f.tp = e.tp
	return f
}

// envWith builds components using own (closed when the test ends) on
// prefix; rdb is the test's own client of the same Redis.
func envWith(t testing.TB, rdb, own redis.UniversalClient, prefix string, cfg Config) *env {
	t.Helper()
	t.Cleanup(func() { own.Close() })
	r := Redis{Client: own, Prefix: prefix, Timeout: 2 * time.Second}
	c := &clock{t: time.Now()}
	st := NewStore(r, cfg, nil)
	st.now = c.now
	var jv *JWTVerifier
	if cfg.Mode == ModeJWT || cfg.Mode == ModeKeysJWT {
		var err error
		if jv, err = NewJWTVerifier(cfg, c.now, nil); err != nil {
			t.Fatal(err)
		}
	}
	a, err := NewAuthenticator(cfg, st, jv, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.now = c.now
	return &env{rdb: rdb, r: r, store: st, auth: a, clock: c}
}

// cleanRate deletes redis_rate's keys, which live outside the prefix.
func cleanRate(rdb redis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = redistest.ScanAll(ctx, rdb, "rate:"+prefix+"*", func(k string) error { return rdb.Del(ctx, k).Err() })
}

func bearer(tok string) http.Header {
	return http.Header{"Authorization": {"Bearer " + tok}}
}

func mustTenant(t testing.TB, st *Store, tn Tenant) Tenant {
	t.Helper()
	out, err := st.CreateTenant(t.Context(), tn)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func mustKey(t testing.TB, st *Store, tenant string, sp KeySpec) (Key, string) {
	t.Helper()
	k, full, err := st.IssueKey(t.Context(), tenant, sp)
	if err != nil {
		t.Fatal(err)
	}
	return k, full
}

// runStore runs st until the test ends and returns a channel of the cache
// entries it invalidates ("*" for the whole cache).
func runStore(t testing.TB, st *Store) <-chan string {
	t.Helper()
	ch := make(chan string, 64)
	st.onInvalidate = func(name string) {
		select {
		case ch <- name:
		default:
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = st.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ch
}

// waitFor receives from ch until want arrives, failing after a generous
// bound (an event wait, not a sleep).
func waitFor(t testing.TB, ch <-chan string, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-ch:
			if got == want {
				return
			}
		case <-timeout:
			t.Fatalf("no invalidation of %q within 10s", want)
		}
	}
}

// deadClient is a client of a port nobody listens on, failing fast.
func deadClient() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 10 * time.Millisecond,
		DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
}
