package bench

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/redistest"
	"github.com/warmpath/warmpath/vllmsim"
)

// smokeConfig is the CI smoke configuration: the shared-prefix workload on
// two replicas (38 groups × 5 users, rates × 2/8) at 3 % of full size, its
// warm-up and first four ladder stages at half length (about 270 requests,
// 85 simulated seconds, under the fleet's capacity), at 20× speed, for
// round-robin and warmpath: a few seconds of wall-clock time per policy.
// With short set it keeps the first 100 requests.
func smokeConfig(short bool) Config {
	c := Config{
		Workload:   "shared-prefix",
		Policies:   []string{"round-robin", "warmpath"},
		Replicas:   2,
		Scale:      0.03,
		StageScale: 0.5,
		Duration:   85 * time.Second,
		Speed:      20,
	}
	if short {
		c.Limit = 100
	}
	return c
}

// runLogged runs cfg, logs its table and returns the report and the table.
func runLogged(t *testing.T, cfg Config) (*Report, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", table.String())
	return rep, table.String()
}

func TestRunSmoke(t *testing.T) {
	t.Parallel()
	rep, _ := runLogged(t, smokeConfig(testing.Short()))
	if len(rep.Results) != 2 || rep.Results[0].Policy != "round-robin" || rep.Results[1].Policy != "warmpath" {
		t.Fatalf("results = %+v", rep.Results)
	}
	rr, wp := rep.Results[0], rep.Results[1]
	for _, r := range rep.Results {
		switch {
		case r.Requests == 0 || r.Errors != 0:
			t.Errorf("%s: %d requests, %d errors (%s)", r.Policy, r.Requests, r.Errors, r.FirstError)
		case r.TTFTP50Ms <= 0 || r.TTFTP90Ms < r.TTFTP50Ms || r.TTFTP99Ms < r.TTFTP90Ms || r.EngineTTFTP50Ms <= 0:
			t.Errorf("%s: TTFT p50 %v p90 %v p99 %v engine %v", r.Policy, r.TTFTP50Ms, r.TTFTP90Ms, r.TTFTP99Ms, r.EngineTTFTP50Ms)
		case r.OutputTokensPerS <= 0 || r.RequestsPerS <= 0:
			t.Errorf("%s: %v output tokens/s, %v requests/s", r.Policy, r.OutputTokensPerS, r.RequestsPerS)
		case r.Ceiling <= 0 || r.Ceiling > 1 || r.CachedFraction <= 0 || r.CachedFraction > r.Ceiling*1.05:
			t.Errorf("%s: cached %v, ceiling %v", r.Policy, r.CachedFraction, r.Ceiling)
		case r.Imbalance < 1 || len(r.PrefillTokens) != 2 || r.ImbalanceSource != "engine":
			t.Errorf("%s: imbalance %v over %v (%s)", r.Policy, r.Imbalance, r.PrefillTokens, r.ImbalanceSource)
		}
	}
	if rr.Requests != wp.Requests {
		t.Errorf("policies saw different workloads: %d and %d requests", rr.Requests, wp.Requests)
	}
	if wp.CachedFraction <= rr.CachedFraction {
		t.Errorf("warmpath cached %v ≤ round-robin's %v", wp.CachedFraction, rr.CachedFraction)
	}
	if wp.TokenizerAvoided+wp.TokenizerCalls == 0 || wp.Gateway["warmpath_routing_decisions_total"] == 0 {
		t.Errorf("warmpath gateway counters: %v", wp.Gateway)
	}
	var html bytes.Buffer
	// TTFT CDFs, cached fraction and engine queues over time.
	if err := rep.WriteHTML(&html); err != nil || strings.Count(html.String(), "<svg") != 3 {
		t.Errorf("HTML report: %v, %d charts; want 3", err, strings.Count(html.String(), "<svg"))
	}
	if len(wp.Load) == 0 || len(wp.Load[0].Waiting) != 2 {
		t.Errorf("warmpath load samples: %d", len(wp.Load))
	}
}

// TestRunExternal drives the external-fleet and target paths against a
// simulated fleet served in the test.
// TestRunGateways runs warmpath as an HA pair: two gateways sharing one
// Redis, requests alternating between them. Both must route, and the pair
// must still cache more than round-robin: every gateway sees every KV
// event, and session bindings live in Redis.
func TestRunGateways(t *testing.T) {
	t.Parallel()
	cfg := smokeConfig(true)
	cfg.Gateways = 2
	cfg.KVBlocks = 2 * vllmsim.DefaultProfile().KVBlocks
	rep, table := runLogged(t, cfg)
	if !strings.Contains(table, "· 2 gateways") {
		t.Errorf("table header does not name the two gateways")
	}
	// Twice the default KV capacity, at scale 0.03.
	want := fmt.Sprintf("%d KV blocks", int(math.Round(float64(cfg.KVBlocks)*cfg.Scale)))
	if i := slices.IndexFunc(rep.Config, func(p Param) bool { return p.Name == "fleet" }); i < 0 || !strings.Contains(rep.Config[i].Value, want) {
		t.Errorf("report config %v; want a fleet of %s", rep.Config, want)
	}
	rr, wp := rep.Results[0], rep.Results[1]
	for _, r := range rep.Results {
		if r.Requests == 0 || r.Errors != 0 {
			t.Errorf("%s: %d requests, %d errors (%s)", r.Policy, r.Requests, r.Errors, r.FirstError)
		}
		if len(r.GatewayDecisions) != 2 || r.GatewayDecisions[0] == 0 || r.GatewayDecisions[1] == 0 ||
			r.GatewayDecisions[0]+r.GatewayDecisions[1] < float64(r.Requests) {
			t.Errorf("%s: decisions per gateway %v for %d requests; want both routing", r.Policy, r.GatewayDecisions, r.Requests)
		}
		// Gauges are each gateway's view of the same fleet: averaged, not
		// added up (two replicas, healthy in both gateways' eyes).
		if h := r.Gateway["warmpath_replica_healthy"]; h != 2 {
			t.Errorf("%s: warmpath_replica_healthy = %v over two gateways; want 2", r.Policy, h)
		}
	}
	if wp.CachedFraction <= rr.CachedFraction {
		t.Errorf("two warmpath gateways cached %v ≤ round-robin's %v", wp.CachedFraction, rr.CachedFraction)
	}
}

// With --redis the gateways share a real Redis server, each with its own
// client, under a key prefix per run that is gone once the run is.
func TestRunGatewaysRealRedis(t *testing.T) {
	t.Parallel()
	cfg := smokeConfig(true)
	cfg.Policies = []string{"warmpath"}
	cfg.Gateways = 2
	cfg.RedisAddr = redistest.Addr(t)
	cfg.redisPrefix = fmt.Sprintf("wp-bench-test-%d-", time.Now().UnixNano())
	rep, _ := runLogged(t, cfg)
	r := rep.Results[0]
	if r.Requests == 0 || r.Errors != 0 || len(r.GatewayDecisions) != 2 || r.GatewayDecisions[0] == 0 || r.GatewayDecisions[1] == 0 {
		t.Errorf("%d requests, %d errors (%s), decisions per gateway %v; want both routing without errors", r.Requests, r.Errors, r.FirstError, r.GatewayDecisions)
	}
	if r.redisKeys == 0 {
		t.Errorf("the run left no keys on %s to delete: the gateways did not use it", cfg.RedisAddr)
	}
	rdb := redis.NewClient(&redis.Options{Addr: cfg.RedisAddr})
	defer rdb.Close()
	left, err := rdb.Keys(t.Context(), cfg.redisPrefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("%d keys left under the run's prefix, e.g. %s", len(left), left[0])
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	for _, c := range []Config{
		{Workload: "shared-prefix", Gateways: 9},
		{Workload: "shared-prefix", Gateways: -1},
		{Workload: "shared-prefix", KVBlocks: -1},
		{Workload: "shared-prefix", Policies: []string{"nope"}},
		{Workload: "shared-prefix", Scale: 2},
	} {
		if _, err := Run(t.Context(), c); err == nil {
			t.Errorf("Run(%+v) succeeded", c)
		}
	}
}

func TestRunExternal(t *testing.T) {
	if testing.Short() {
		t.Skip("slow")
	}
	t.Parallel()
	fl, err := vllmsim.NewFleet(vllmsim.Config{Replicas: 2, Speed: 10, Profile: ScaledProfile(vllmsim.DefaultProfile(), 0.05), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- fl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("fleet: %v", err)
		}
	})
	var urls, kv []string
	for _, r := range fl.Replicas() {
		urls, kv = append(urls, r.Info().URL), append(kv, r.Info().KVEndpoint)
	}
	base := Config{Workload: "shared-prefix", Scale: 0.05, StageScale: 0.04, Speed: 10, Limit: 60}

	c := base
	c.Fleet, c.KVEvents, c.Policies = urls, kv, []string{"precise-prefix", "warmpath"}
	rep, err := Run(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Requests == 0 || r.Errors != 0 || r.ImbalanceSource != "responses" || len(r.PrefillTokens) != 2 || r.CachedFraction <= 0 {
			t.Errorf("fleet %s: %+v", r.Policy, r)
		}
	}
	// Both policies start cold: the caches were reset in between, so the
	// second run's cached fraction is not inflated by the first.
	if a, b := rep.Results[0].CachedFraction, rep.Results[1].CachedFraction; b > a+0.15 {
		t.Errorf("cached fraction %v then %v: caches not reset?", a, b)
	}

	c = base
	c.Target, c.Fleet = urls[0], urls
	rep, err = Run(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 1 || rep.Results[0].Policy != TargetPolicy || rep.Results[0].Requests == 0 || rep.Results[0].Errors != 0 {
		t.Errorf("target: %+v", rep.Results)
	}
}

func TestProgressDraw(t *testing.T) {
	var b bytes.Buffer
	d := newDriver([]string{"http://x"}, "m", "", 4, time.Minute)
	d.t0.Store(time.Now().Add(-10 * time.Second).UnixNano()) // 40 simulated seconds ago
	d.sent.Store(12)
	d.finished.Store(10)
	p := &progress{w: &b, policy: "warmpath", index: 1, total: 6, planned: 80 * time.Second}
	p.draw(d)
	got := b.String()
	for _, want := range []string{"\r", "[2/6] warmpath", " 50%", "sent 12", "done 10", "err 0"} {
		if !strings.Contains(got, want) {
			t.Errorf("progress line %q lacks %q", got, want)
		}
	}
	p.finish() // not started: a no-op
}
