package tenancy

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/redistest"
)

// twoLimiters returns two Limiters sharing one Redis through their own
// clients, as two gateway processes would.
func twoLimiters(t *testing.T, tp *redistest.Topology, cfg Config) (*Limiter, *Limiter, Redis) {
	t.Helper()
	e := newEnv(t, tp)
	f := e.peer(t, testConfig(t))
	return NewLimiter(e.r, cfg, nil), NewLimiter(f.r, cfg, nil), e.r
}

func principal(tenant, key string, tl, kl Limits) *Principal {
	return &Principal{TenantID: tenant, TenantName: tenant, KeyID: key, Limits: tl, KeyLimits: kl, Weight: 1,
		DefaultClass: ClassInteractive, ClassCeiling: ClassInteractive}
}

// admitAll sends n requests alternately through the limiters, concurrently
// in 6 workers, and returns the leases admitted and the 429s.
func admitAll(t *testing.T, ls []*Limiter, p *Principal, n, est int) (leases []*Lease, denied []*apierror.Error) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	for w := range 6 {
		wg.Go(func() {
			for i := range next {
				le, err := ls[(i+w)%len(ls)].Admit(t.Context(), p, "m", est)
				mu.Lock()
				if err == nil {
					leases = append(leases, le)
				} else if he, ok := errors.AsType[*apierror.Error](err); ok && he.Status == 429 {
					denied = append(denied, he)
				} else {
					t.Errorf("admit: %v", err)
				}
				mu.Unlock()
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return leases, denied
}

// slack is how many units a per-minute limit refills during elapsed.
func slack(perMinute int, elapsed time.Duration, per int) int {
	return int(math.Ceil(float64(perMinute)*elapsed.Minutes()/float64(per))) + 1
}

func TestRequestsPerMinuteAcrossGateways(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		a, b, _ := twoLimiters(t, tp, testConfig(t))
		p := principal("acme", "k1", Limits{RequestsPerMinute: 30}, Limits{})
		start := time.Now()
		leases, denied := admitAll(t, []*Limiter{a, b}, p, 90, 1)
		el := time.Since(start)
		if n := len(leases); n < 30 || n > 30+slack(30, el, 1) {
			t.Fatalf("admitted %d of 90 across two gateways in %v; limit 30/min", n, el)
		}
		he := denied[0]
		if he.Type != "requests" || he.Code != "rate_limit_exceeded" || he.Header.Get("Retry-After") == "" ||
			he.Header.Get("Retry-After-Ms") == "" {
			t.Errorf("429 = %+v", he)
		}
		h := leases[0].Header()
		if h.Get("X-Ratelimit-Limit-Requests") != "30" || h.Get("X-Ratelimit-Remaining-Requests") == "" || h.Get("X-Ratelimit-Reset-Requests") == "" {
			t.Errorf("success headers = %v", h)
		}
		for _, le := range leases {
			le.Done(-1)
		}
	})
}

func TestKeyLimitBesidesTenantLimit(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		a, b, _ := twoLimiters(t, tp, testConfig(t))
		k1 := principal("acme", "k1", Limits{RequestsPerMinute: 40}, Limits{RequestsPerMinute: 10})
		k2 := principal("acme", "k2", Limits{RequestsPerMinute: 40}, Limits{})
		start := time.Now()
		l1, _ := admitAll(t, []*Limiter{a, b}, k1, 30, 1)
		l2, _ := admitAll(t, []*Limiter{a, b}, k2, 60, 1)
		el := time.Since(start)
		if n := len(l1); n < 10 || n > 10+slack(10, el, 1) {
			t.Errorf("key with 10/min admitted %d of 30", n)
		}
		// The tenant's 40 are shared: k2 gets what k1 left.
		if n := len(l1) + len(l2); n < 40 || n > 40+slack(40, el, 1) {
			t.Errorf("tenant with 40/min admitted %d in total", n)
		}
	})
}

func TestTokensPerMinuteAcrossGateways(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		a, b, _ := twoLimiters(t, tp, testConfig(t))
		p := principal("acme", "k1", Limits{TokensPerMinute: 3000}, Limits{})
		start := time.Now()
		leases, denied := admitAll(t, []*Limiter{a, b}, p, 90, 100) // 3× the limit
		el := time.Since(start)
		if n := len(leases); n < 30 || n > 30+slack(3000, el, 100) {
			t.Fatalf("admitted %d requests of 100 tokens under 3000 tokens/min", n)
		}
		if denied[0].Type != "tokens" {
			t.Errorf("429 type %q; want tokens", denied[0].Type)
		}
		if h := leases[0].Header(); h.Get("X-Ratelimit-Limit-Tokens") != "3000" || h.Get("X-Ratelimit-Remaining-Tokens") == "" {
			t.Errorf("token headers = %v", h)
		}
	})
}

// TestTokenCorrection: the estimate charged at admission is corrected to
// actual usage: refunds reopen the budget, overruns go into debt.
func TestTokenCorrection(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		a, _, _ := twoLimiters(t, tp, testConfig(t))
		p := principal("acme", "k1", Limits{TokensPerMinute: 6000}, Limits{})
		le, err := a.Admit(t.Context(), p, "m", 6000)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Admit(t.Context(), p, "m", 1000); err == nil {
			t.Fatal("budget spent by the estimate, yet admitted")
		}
		le.Done(100) // used far less than estimated: refund
		le2, err := a.Admit(t.Context(), p, "m", 5000)
		if err != nil {
			t.Fatalf("after the refund: %v", err)
		}
		le2.Done(5000 + 60000) // a big overrun: ten minutes of debt
		_, err = a.Admit(t.Context(), p, "m", 1)
		he, ok := errors.AsType[*apierror.Error](err)
		if !ok || he.Status != 429 {
			t.Fatalf("in debt, admit = %v", err)
		}
		if ra, _ := strconv.Atoi(he.Header.Get("Retry-After")); ra < 540 {
			t.Errorf("Retry-After %ds after ten minutes of debt", ra)
		}
	})
}

func TestConcurrencyAcrossGateways(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		a, b, r := twoLimiters(t, tp, testConfig(t))
		p := principal("acme", "k1", Limits{Concurrent: 4}, Limits{})
		leases, denied := admitAll(t, []*Limiter{a, b}, p, 12, 0)
		if len(leases) != 4 || len(denied) != 8 {
			t.Fatalf("admitted %d (denied %d) of 12 with 4 slots", len(leases), len(denied))
		}
		leases[0].Done(0)
		leases[0].Done(0) // a second Done frees nothing more
		more, _ := admitAll(t, []*Limiter{a, b}, p, 3, 0)
		if len(more) != 1 {
			t.Fatalf("after one Done, %d more admitted; want 1", len(more))
		}

		// A crashed gateway: c admits and is never heard of again. Its lease is
		// not renewed; once its expiry passes, the slot is reclaimed.
		for _, le := range append(leases[1:], more...) {
			le.Done(0)
		}
		c := NewLimiter(r, testConfig(t), nil)
		var crashed []*Lease
		for range 4 {
			le, err := c.Admit(t.Context(), p, "m", 0)
			if err != nil {
				t.Fatal(err)
			}
			crashed = append(crashed, le)
		}
		if _, err := a.Admit(t.Context(), p, "m", 0); err == nil {
			t.Fatal("a fifth slot was admitted")
		}
		expireLeases(t, r.Client, crashed[0].t.conc)
		le, err := a.Admit(t.Context(), p, "m", 0)
		if err != nil {
			t.Fatalf("a crashed gateway's slots were not reclaimed after lease_ttl: %v", err)
		}
		le.Done(0)
	})
}

// expireLeases moves every lease's expiry into the past, which is what
// lease_ttl passing without renewal does.
func expireLeases(t *testing.T, rdb redis.UniversalClient, key string) {
	t.Helper()
	ms, err := rdb.ZRangeWithScores(t.Context(), key, 0, -1).Result()
	if err != nil || len(ms) == 0 {
		t.Fatalf("leases in %s: %v %v", key, ms, err)
	}
	for _, m := range ms {
		rdb.ZAdd(t.Context(), key, redis.Z{Score: 1, Member: m.Member})
	}
}

func TestLeaseRenewal(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		a, _, r := twoLimiters(t, tp, testConfig(t))
		p := principal("acme", "k1", Limits{Concurrent: 1}, Limits{Concurrent: 1})
		le, err := a.Admit(t.Context(), p, "m", 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{le.t.conc, le.k.conc} {
			r.Client.ZAdd(t.Context(), key, redis.Z{Score: 1, Member: le.id}) // about to expire
		}
		a.renew(t.Context())
		for _, key := range []string{le.t.conc, le.k.conc} {
			s, err := r.Client.ZScore(t.Context(), key, le.id).Result()
			if err != nil || s < float64(time.Now().UnixMilli()) {
				t.Fatalf("lease in %s not renewed: %v %v", key, s, err)
			}
		}
		le.Done(0)
		a.renew(t.Context()) // a released lease is not brought back
		if n, _ := r.Client.ZCard(t.Context(), le.t.conc).Result(); n != 0 {
			t.Fatalf("released lease renewed back (%d members)", n)
		}
	})
}

// TestDeniedAdmissionChargesNothing: a request refused by one limit
// leaves the others as they were.
func TestDeniedAdmissionChargesNothing(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		a, _, _ := twoLimiters(t, tp, testConfig(t))
		p := principal("acme", "k1", Limits{RequestsPerMinute: 1, Concurrent: 5, TokensPerMinute: 1000}, Limits{})
		le, err := a.Admit(t.Context(), p, "m", 100)
		if err != nil {
			t.Fatal(err)
		}
		for range 4 {
			if _, err := a.Admit(t.Context(), p, "m", 100); err == nil {
				t.Fatal("second request in a minute admitted under 1/min")
			}
		}
		le.Done(100)
		q := principal("acme", "k1", Limits{Concurrent: 1, TokensPerMinute: 1000}, Limits{})
		le, err = a.Admit(t.Context(), q, "m", 900)
		if err != nil {
			t.Fatalf("slots or tokens leaked by requests refused on rate: %v", err)
		}
		le.Done(900)
	})
}

func TestNoLimitsNoRedis(t *testing.T) {
	l := NewLimiter(Redis{Client: redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})}, testConfig(t), nil)
	le, err := l.Admit(t.Context(), principal("acme", "k", Limits{}, Limits{}), "m", 10)
	if err != nil || len(le.Header()) != 0 {
		t.Fatalf("unlimited principal: %v %v", le, err)
	}
	le.Done(5)
}

func TestLimiterRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
	defer rdb.Close()
	srv.Stop()
	p := principal("acme", "k", Limits{RequestsPerMinute: 1, Concurrent: 1}, Limits{})
	open := NewLimiter(Redis{Client: rdb, Prefix: "x:"}, testConfig(t), nil)
	le, err := open.Admit(t.Context(), p, "m", 1)
	if err != nil {
		t.Fatalf("fail-open limiter refused: %v", err)
	}
	le.Done(1)
	cfg := testConfig(t)
	cfg.RedisFailure = FailureConfig{RateLimits: FailOpen, Concurrency: FailClosed}
	closed := NewLimiter(Redis{Client: rdb, Prefix: "x:"}, cfg, nil)
	_, err = closed.Admit(t.Context(), p, "m", 1)
	if he, ok := errors.AsType[*apierror.Error](err); !ok || he.Status != http.StatusServiceUnavailable {
		t.Fatalf("fail-closed concurrency admitted or wrong error: %v", err)
	}
}
