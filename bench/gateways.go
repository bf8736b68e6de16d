package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/gateway"
	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/tenancy"
)

// runGateway starts cfg.Gateways gateways with the policy in front of the
// replicas, on a fresh in-process Redis or under a fresh key prefix on
// cfg.RedisAddr, drives the plan through them and stops them.
func runGateway(ctx context.Context, cfg Config, policy string, urls, kv, replay []string, plan *Plan, pr *progress) (res *Result, err error) {
	st, err := openStore(cfg, policy)
	if err != nil {
		return nil, err
	}
	defer func() {
		if n := st.close(); res != nil {
			res.redisKeys = n
		}
	}()
	gc := gatewayConfig(cfg, policy, urls, kv, replay, plan, st.prefix)
	gctx, stop := context.WithCancel(ctx)
	g := &gateways{}
	defer func() { stop(); g.wait() }()
	addrs, err := g.start(gctx, cfg, policy, gc, st, len(urls), plan.Tenants)
	if err != nil {
		return nil, err
	}
	d := newDriver(addrs, cfg.Model, "", cfg.Speed, cfg.Drain)
	pr.start(d)
	samples, err := d.run(ctx, plan.Sessions)
	if err != nil {
		return nil, err
	}
	res = summarize(policy, samples, cfg.Scale)
	res.t0, res.speed = time.Unix(0, d.t0.Load()), cfg.Speed
	g.report(res)
	stop()
	if err := g.wait(); err != nil {
		return nil, err
	}
	return res, nil
}

// store is a run's Redis: an in-process one, or a fresh key prefix on a
// server, with one client per gateway, as separate processes would have.
type store struct {
	addr, prefix string
	mr           *miniredis.Miniredis // nil on a server
	clients      []*redis.Client
}

// openStore starts or reaches the run's Redis.
func openStore(cfg Config, policy string) (*store, error) {
	st := &store{addr: cfg.RedisAddr}
	if st.addr == "" {
		st.mr = miniredis.NewMiniRedis()
		if err := st.mr.Start(); err != nil {
			return nil, fmt.Errorf("in-process redis: %w", err)
		}
		st.addr = st.mr.Addr()
	} else {
		st.prefix = fmt.Sprintf("%s%d-%s:", cmp.Or(cfg.redisPrefix, "wp-bench-"), time.Now().UnixNano(), policy)
	}
	st.clients = make([]*redis.Client, max(1, cfg.Gateways))
	for i := range st.clients {
		st.clients[i] = redis.NewClient(&redis.Options{Addr: st.addr})
	}
	return st, nil
}

// close closes the clients and drops the run's keys from a server, and
// returns how many it dropped.
func (st *store) close() int {
	for _, c := range st.clients {
		c.Close()
	}
	if st.mr != nil {
		st.mr.Close()
		return 0
	}
	return dropPrefix(st.addr, st.prefix)
}

// gatewayConfig is the configuration every gateway of a run gets.
func gatewayConfig(cfg Config, policy string, urls, kv, replay []string, plan *Plan, prefix string) gateway.Config {
	// Debug headers name the replica, the reason and the predicted hit of
	// each request, for every policy alike.
	gc := gateway.Config{Listen: "127.0.0.1:0", Debug: true}
	gc.Redis.KeyPrefix = prefix
	for i, u := range urls {
		gc.Replicas = append(gc.Replicas, fleet.ReplicaSpec{URL: u, Model: cfg.Model, KVEndpoint: kv[i], ReplayEndpoint: replay[i]})
	}
	gc.Routing.Policy = policy
	gc.Auth.Mode = tenancy.ModeNone // the load generator is one anonymous tenant
	if len(plan.Tenants) > 0 {
		// The workload's tenants, each with its own API key.
		gc.Auth = tenancy.Config{Mode: tenancy.ModeKeys, SaltSecret: "bench-salt-secret-0123456789abcdef"}
	}
	gc.Server.PreStop = -1           // nothing in front of the gateway to drain
	gc.Server.MaxConnsPerClient = -1 // the load generator is one client address
	// The gateway's one token-denominated threshold scales with the
	// workload's tokens, so that saturation trips at the same load.
	gc.Routing.MaxInflightPrefillTokens = int64(math.Round(scoring.DefaultMaxInflightPrefillTokens * cfg.Scale))
	timeGateway(&gc, cfg.Speed)
	if cfg.tweak != nil {
		cfg.tweak(&gc)
	}
	return gc
}

// timeGateway sets gc's periodic work for a fleet simulated at speed.
func timeGateway(gc *gateway.Config, speed float64) {
	// The gateway runs on wall-clock time and the fleet on simulated time.
	// Its periodic work is scheduled at its defaults divided by Speed, so
	// that in simulated time it behaves as deployed: metrics scraped every
	// 250 ms, health checked every second, speculative index entries kept
	// 2 s. Staleness is judged in wall-clock time (a host hiccup is a
	// wall-clock event), generously.
	wall := func(d time.Duration) time.Duration {
		return max(5*time.Millisecond, time.Duration(float64(d)/speed))
	}
	gc.Health = fleet.HealthConfig{Interval: wall(time.Second), Timeout: 2 * time.Second, Failures: 3,
		ScrapeInterval: wall(250 * time.Millisecond), StaleAfter: 2 * time.Second}
	gc.Routing.SpeculativeTTL = wall(2 * time.Second)
	// The in-process Redis answers in microseconds unless the host stalls;
	// a stall is a wall-clock event, so its calls get a generous bound
	// rather than failing over to in-process state (which only the
	// session-keeping policy would pay for).
	gc.Redis.Timeout = 2 * time.Second
}

// gateways are a run's running gateways.
type gateways struct {
	wg   sync.WaitGroup
	gws  []*gateway.Gateway
	errs []error
}

// start starts cfg.Gateways gateways on gc, each waiting for the n
// replicas, and creates the workload's tenants once the first is up; it
// returns their base URLs. The gateways run until ctx ends.
func (g *gateways) start(ctx context.Context, cfg Config, policy string, gc gateway.Config, st *store, n int, tenants []Tenant) ([]string, error) {
	g.gws, g.errs = make([]*gateway.Gateway, cfg.Gateways), make([]error, cfg.Gateways)
	var addrs []string
	for i := range g.gws {
		logger := cfg.Logger.With("component", "gateway")
		if cfg.Gateways > 1 {
			logger = logger.With("gateway", i)
		}
		recordTo(&gc, cfg, policy, i)
		gw, err := gateway.New(gc, gateway.Options{Redis: st.clients[i], Logger: logger})
		if err != nil {
			return nil, err
		}
		g.gws[i] = gw
		g.wg.Go(func() { g.errs[i] = gw.Run(ctx) })
		if err := waitFleet(ctx, gw.Registry(), n); err != nil {
			return nil, err
		}
		addrs = append(addrs, "http://"+gw.Addr())
		if i == 0 {
			if err := createTenants(ctx, st.clients[0], gc, tenants); err != nil {
				return nil, err
			}
		}
	}
	return addrs, nil
}

// wait waits for the gateways to stop and returns their errors.
func (g *gateways) wait() error {
	g.wg.Wait()
	return errors.Join(g.errs...)
}

// report adds the gateways' metrics to res. Counters add up over the
// gateways; gauges (index sizes, replica state, fractions) are each
// gateway's view of the same thing, and are averaged.
func (g *gateways) report(res *Result) {
	res.Gateway = map[string]float64{}
	for _, gw := range g.gws {
		c, gg := gatherMetrics(gw.Registry())
		for k, v := range c {
			res.Gateway[k] += v
		}
		for k, v := range gg {
			res.Gateway[k] += v / float64(len(g.gws))
		}
		if len(g.gws) > 1 {
			res.GatewayDecisions = append(res.GatewayDecisions, c["warmpath_routing_decisions_total"])
		}
	}
	res.Mispredicted = res.Gateway["warmpath_mispredicted_hits_total"]
	res.TokenizerAvoided = res.Gateway["warmpath_tokenizer_avoided_total"]
	res.TokenizerCalls = res.Gateway[`warmpath_tokenizer_calls_total{result="ok"}`]
}

// dropPrefix deletes, best effort, the keys a run left under prefix on
// the Redis server at addr, and returns how many it deleted.
func dropPrefix(addr, prefix string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	it := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	n := 0
	for it.Next(ctx) {
		keys = append(keys, it.Val())
		if len(keys) == 1000 {
			n += int(rdb.Unlink(ctx, keys...).Val())
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		n += int(rdb.Unlink(ctx, keys...).Val())
	}
	return n
}

// createTenants creates the workload's tenants and imports their keys
// through the tenancy store of the gateways' Redis (after the first
// gateway has migrated the keyspace).
func createTenants(ctx context.Context, rdb redis.UniversalClient, gc gateway.Config, tenants []Tenant) error {
	if len(tenants) == 0 {
		return nil
	}
	ac, err := gc.Auth.Validate()
	if err != nil {
		return fmt.Errorf("bench: tenants: %w", err)
	}
	st := tenancy.NewStore(tenancy.Redis{Client: rdb, Prefix: cmp.Or(gc.Redis.KeyPrefix, "wp:"), Timeout: 5 * time.Second}, ac, nil)
	for _, t := range tenants {
		if _, err := st.CreateTenant(ctx, tenancy.Tenant{ID: t.ID, Weight: t.Weight, DefaultClass: t.DefaultClass}); err != nil {
			return fmt.Errorf("bench: tenant %s: %w", t.ID, err)
		}
		if _, err := st.ImportKey(ctx, t.ID, t.Key(), tenancy.KeySpec{Name: "bench"}); err != nil {
			return fmt.Errorf("bench: key of tenant %s: %w", t.ID, err)
		}
	}
	return nil
}

// waitFleet waits until the gateway reports every replica healthy and
// scraped, then lets the KV-event subscribers settle.
func waitFleet(ctx context.Context, reg *prometheus.Registry, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		healthy, scraped := 0, 0
		mfs, err := reg.Gather()
		if err != nil {
			return fmt.Errorf("gateway metrics: %w", err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				switch mf.GetName() {
				case "warmpath_replica_healthy":
					if m.GetGauge().GetValue() == 1 {
						healthy++
					}
				case "warmpath_replica_metrics_age_seconds":
					scraped++
				}
			}
		}
		if healthy == n && scraped == n {
			break
		}
		if !sleepUntil(ctx, time.Now().Add(20*time.Millisecond)) {
			return fmt.Errorf("gateway: %d of %d replicas healthy, %d scraped: %w", healthy, n, scraped, ctx.Err())
		}
	}
	if !sleepUntil(ctx, time.Now().Add(250*time.Millisecond)) {
		return ctx.Err()
	}
	return nil
}

// gatherMetrics sums each counter and each gauge of reg by name, and also
// by name and label value for series with one label besides "policy",
// keyed like name{label="value"}; a histogram's sum and count become the
// counters name_sum and name_count.
func gatherMetrics(reg *prometheus.Registry) (counters, gauges map[string]float64) {
	counters, gauges = map[string]float64{}, map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		return counters, gauges
	}
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "warmpath_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			var v float64
			out := counters
			switch {
			case m.Counter != nil:
				v = m.Counter.GetValue()
			case m.Gauge != nil:
				v, out = m.Gauge.GetValue(), gauges
			case m.Histogram != nil:
				// A histogram's sum and count, as counters.
				counters[name+"_sum"] += m.Histogram.GetSampleSum()
				counters[name+"_count"] += float64(m.Histogram.GetSampleCount())
				continue
			default:
				continue
			}
			out[name] += v
			var labels []string
			for _, lp := range m.GetLabel() {
				if lp.GetName() != "policy" {
					labels = append(labels, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
				}
			}
			if len(labels) == 1 {
				out[name+"{"+labels[0]+"}"] += v
			}
		}
	}
	return counters, gauges
}
