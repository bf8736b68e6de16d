package fairq

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/redistest"
)

// sharedQueues returns n queues of capacity one each, sharing counters
// through tp under one key prefix (or not sharing, with share false).
func sharedQueues(t *testing.T, tp *redistest.Topology, n int, share bool) []*Queue {
	t.Helper()
	var rdb redis.UniversalClient
	prefix := "unshared:"
	if share {
		c, p := tp.Client(t)
		rdb, prefix = c, p
	}
	qs := make([]*Queue, n)
	for i := range qs {
		qs[i], _ = newTestQueue(t, Config{KeyPrefix: prefix}, newCap(1), rdb)
	}
	return qs
}

// fleetShares runs the queues in lockstep at capacity one each: every
// round each queue finishes its running request and dispatches the next,
// every syncEvery rounds the queues sync; each queue's tickets are resubmitted as
// they are dispatched, so the backlog holds. It returns dispatches per
// tenant over all queues.
func fleetShares(t *testing.T, qs []*Queue, perQueue [][]Ticket, rounds, syncEvery int) map[string]float64 {
	t.Helper()
	ss := make([]*stepper, len(qs))
	for i, q := range qs {
		ss[i] = newStepper(t, grantNow(t, q, Ticket{Tenant: "warmup", Model: "m"}))
		for range 20 {
			for _, tk := range perQueue[i] {
				ss[i].add(enqueue(t, q, tk))
			}
		}
	}
	got := map[string]float64{}
	for r := range rounds {
		for i, q := range qs {
			tk := ss[i].step(0)
			got[tk.Tenant]++
			ss[i].add(enqueue(t, q, tk))
		}
		for _, q := range qs {
			if q.rdb == nil || r%syncEvery != 0 {
				continue
			}
			if err := q.sync(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
	}
	for k := range got {
		got[k] /= float64(rounds * len(qs))
	}
	t.Logf("fleet shares over %d rounds, syncing every %d: %v", rounds, syncEvery, got)
	return got
}

func TestSharesAcrossTwoGateways(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		a := Ticket{Tenant: "a", Weight: 1, Model: "m", Cost: 100}
		b := Ticket{Tenant: "b", Weight: 3, Model: "m", Cost: 100}
		within := func(t *testing.T, got map[string]float64, tenant string, want float64) {
			t.Helper()
			if math.Abs(got[tenant]-want) > 0.1*want {
				t.Errorf("%s's fleet share = %.3f (%v); want %.2f ± 10%%", tenant, got[tenant], got, want)
			}
		}
		t.Run("both tenants on both gateways", func(t *testing.T) {
			got := fleetShares(t, sharedQueues(t, tp, 2, true), [][]Ticket{{a, b}, {a, b}}, 500, 1)
			within(t, got, "a", 0.25)
			within(t, got, "b", 0.75)
		})
		// a sends only through gateway 1; b through both. The fair fleet-wide
		// split is 25/75, which needs gateway 1 to serve a and b equally: only
		// shared counters can know that b is served on gateway 2 as well.
		t.Run("uneven spread needs shared counters", func(t *testing.T) {
			for _, every := range []int{1, 10, 50} {
				got := fleetShares(t, sharedQueues(t, tp, 2, true), [][]Ticket{{a, b}, {b}}, 1000, every)
				within(t, got, "a", 0.25)
				within(t, got, "b", 0.75)
			}
		})
		t.Run("control: local counters only", func(t *testing.T) {
			got := fleetShares(t, sharedQueues(t, tp, 2, false), [][]Ticket{{a, b}, {b}}, 1000, 1)
			if got["a"] > 0.15 {
				t.Errorf("without sharing a got %.3f; want about 0.125 (gateway 1's local 25%% of half the fleet)", got["a"])
			}
		})
	})
}

// A lift made by two gateways is applied once: it is a max, not an
// increment.
func TestSharedLiftIsIdempotent(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		qs := sharedQueues(t, tp, 2, true)
		for _, q := range qs {
			m := q.modelFor("m")
			m.mu.Lock()
			c := m.counterFor("x", true)
			c.lift(1000)
			c.charge(10)
			m.mu.Unlock()
		}
		for _, q := range qs {
			if err := q.sync(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		if err := qs[0].sync(t.Context()); err != nil {
			t.Fatal(err)
		}
		for i, q := range qs {
			m := q.modelFor("m")
			m.mu.Lock()
			v := m.counters["x"].value()
			m.mu.Unlock()
			if v != 1020 {
				t.Errorf("gateway %d sees %v; want 1020 (one lift to 1000, two charges of 10)", i, v)
			}
		}
		v, err := qs[0].rdb.HGet(t.Context(), qs[0].modelFor("m").key, fieldPrefix+"x").Float64()
		if err != nil || v != 1020 {
			t.Errorf("Redis holds %v, %v; want 1020", v, err)
		}
		if ttl := qs[0].rdb.PTTL(t.Context(), qs[0].modelFor("m").key).Val(); ttl <= 0 {
			t.Errorf("counter hash TTL %v; want the KeyTTL", ttl)
		}
	})
}

// countingHook counts the commands a client sends, and the script calls
// among them.
type countingHook struct{ n, scripts atomic.Int64 }

func (h *countingHook) count(cmd redis.Cmder) {
	h.n.Add(1)
	if n := cmd.Name(); n == "evalsha" || n == "eval" {
		h.scripts.Add(1)
	}
}

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}
func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.count(c)
		}
		return next(ctx, cmds)
	}
}

// Admission never touches Redis; only the sync does.
func TestAdmitNeverTouchesRedis(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		rdb, prefix := tp.Client(t)
		hook := &countingHook{}
		rdb.AddHook(hook)
		c := newCap(1)
		q, _ := newTestQueue(t, Config{KeyPrefix: prefix}, c, rdb)
		for range 1000 {
			g, err := q.Admit(t.Context(), Ticket{Tenant: "a", Model: "m", Cost: 10})
			if err != nil {
				t.Fatal(err)
			}
			g.Charge(5)
			g.Done()
		}
		g := grantNow(t, q, Ticket{Tenant: "a", Model: "m"})
		it := enqueue(t, q, Ticket{Tenant: "b", Model: "m"})
		g.Done()
		it.grant.Done()
		if n := hook.n.Load(); n != 0 {
			t.Fatalf("admission sent %d Redis commands; want 0", n)
		}
		if err := q.sync(t.Context()); err != nil {
			t.Fatal(err)
		}
		// A call by SHA that finds no script cached is repeated with the text.
		n1 := hook.scripts.Load()
		if n1 != 1 && n1 != 2 {
			t.Errorf("the first sync made %d script calls; want 1, or 2 on a server without the script", n1)
		}
		if err := q.sync(t.Context()); err != nil {
			t.Fatal(err)
		}
		if n := hook.scripts.Load() - n1; n != 1 {
			t.Errorf("the second sync made %d script calls; want 1", n)
		}
	})
}

// With Redis gone the queue keeps deciding on local counters, logs once,
// and re-seeds a restarted (empty) server with its values.
func TestRedisDownAndBack(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	var logs bytes.Buffer
	c := newCap(1)
	q, err := New(Config{}, c, rdb, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	key := q.modelFor("m").key
	value := func(tenant string) float64 {
		m := q.modelFor("m")
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.counters[tenant].value()
	}
	grantNow(t, q, Ticket{Tenant: "a", Model: "m", Cost: 300}).Done()
	if err := q.sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	grantNow(t, q, Ticket{Tenant: "a", Model: "m", Cost: 200}).Done()
	for range 3 {
		if err := q.sync(t.Context()); err == nil {
			t.Fatal("sync succeeded with Redis down")
		}
	}
	if v := value("a"); v != 500 {
		t.Errorf("local counter %v while Redis is down; want 500", v)
	}
	if n := strings.Count(logs.String(), "redis unavailable"); n != 1 {
		t.Errorf("logged the outage %d times; want once:\n%s", n, logs.String())
	}
	srv.Restart(t)
	if err := q.sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := q.sync(t.Context()); err != nil { // the re-seed goes out on the next exchange
		t.Fatal(err)
	}
	got, err := rdb.HGet(t.Context(), key, fieldPrefix+"a").Float64()
	if err != nil || got != 500 || value("a") != 500 {
		t.Errorf("after recovery Redis holds %v (%v), local %v; want 500", got, err, value("a"))
	}
	if !strings.Contains(logs.String(), "redis recovered") {
		t.Errorf("recovery not logged:\n%s", logs.String())
	}
}

// One exchange carries the counters of models whose hashes sit in
// different Cluster slots (on different masters): each script call names
// one key, the pipeline is split by node, and a node without the script
// cached gets it by text.
func TestSyncModelsAcrossSlots(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		qs := sharedQueues(t, tp, 2, true)
		if tp.Kind != redistest.Single { // private to this test binary: no other user's scripts to drop
			if err := qs[0].rdb.ScriptFlush(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		models := []string{"m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7"}
		slots := map[int]bool{}
		for i, name := range models {
			m := qs[0].modelFor(name)
			slots[redistest.Slot(m.key)] = true
			m.mu.Lock()
			m.counterFor("x", true).charge(float64(10 * (i + 1)))
			m.mu.Unlock()
			o := qs[1].modelFor(name) // the other gateway knows the tenant, not yet the charge
			o.mu.Lock()
			o.counterFor("x", true)
			o.mu.Unlock()
		}
		if len(slots) < 2 {
			t.Fatalf("the models' hashes share one slot; the test needs several")
		}
		for _, q := range qs {
			if err := q.sync(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		for i, name := range models {
			v, err := qs[0].rdb.HGet(t.Context(), qs[0].modelFor(name).key, fieldPrefix+"x").Float64()
			o := qs[1].modelFor(name)
			o.mu.Lock()
			seen := o.counters["x"].value()
			o.mu.Unlock()
			if want := float64(10 * (i + 1)); err != nil || v != want || seen != want {
				t.Errorf("%s: Redis holds %v (%v), the other gateway %v; want %v", name, v, err, seen, want)
			}
		}
	})
}
