package gateway

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/misses"
	"github.com/warmpath/warmpath/record"
	"github.com/warmpath/warmpath/tenancy"
	"github.com/warmpath/warmpath/vllmsim"
)

// uncachedBy reads warmpath_uncached_tokens_total for a tenant label
// (every tenant: ""), by cause, once every request answered so far is
// attributed (missTracker.flush).
func uncachedBy(t *testing.T, g *testGateway, tenant string) [misses.NumCauses]float64 {
	t.Helper()
	flushMisses(t, g)
	var out [misses.NumCauses]float64
	for c := range misses.NumCauses {
		labels := map[string]string{"cause": misses.Cause(c).String()}
		if tenant != "" {
			labels["tenant"] = tenant
		}
		out[c] = counter(t, g.obs.reg, "warmpath_uncached_tokens_total", labels)
	}
	return out
}

// flushMisses waits until the miss attribution has done every request
// answered so far: it runs off the response path.
func flushMisses(t *testing.T, g *testGateway) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := g.miss.flush(ctx); err != nil {
		t.Fatalf("miss attribution not flushed: %v", err)
	}
}

func sum(v [misses.NumCauses]float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s
}

// missConv is one tenant's conversation of a multi-turn run.
type missConv struct {
	tenant string
	c      *conversation
	system string
	// stamp puts the turn's time at the start of the system prompt, as a
	// careless client does.
	stamp bool
}

// TestUncachedTokensAttributed runs a well-behaved and a timestamping
// tenant's conversations through two replicas: for every request the
// causes of warmpath_uncached_tokens_total add up to prompt − cached;
// only the timestamping tenant's go to client_prefix_break; the usage API
// totals agree; and the prefix-break diagnostics name the system prompt
// (with excerpts for the tenant that opted in).
func TestUncachedTokensAttributed(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := tenantConfig(sim)
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	convs := []*missConv{
		{tenant: "good", system: words("rules", 200)},
		{tenant: "stamp", system: words("policy", 200), stamp: true},
	}
	for _, mc := range convs {
		fields := ""
		if mc.stamp {
			fields = `,"break_excerpts":true`
		}
		mc.c = newConversation(mc.system, words("ask"+mc.tenant, 30))
		mc.c.header = bearer(newTenant(t, gw.URL, mc.tenant, fields))
	}
	var want [2]int // prompt − cached, per tenant
	for turn := range 5 {
		for i, mc := range convs {
			if mc.stamp {
				mc.c.messages[0].Content = fmt.Sprintf("Current time: 2026-12-06T21:%02d:%02dZ. ", turn, 7*turn) + mc.system
			}
			before := uncachedBy(t, gw, mc.tenant)
			r := mc.c.turn(t, gw.URL, words(fmt.Sprint("more", turn), 20))
			miss := r.Usage.PromptTokens - r.Usage.CachedTokens
			want[i] += miss
			after := uncachedBy(t, gw, mc.tenant)
			if got := sum(after) - sum(before); got != float64(miss) {
				t.Errorf("%s turn %d: causes sum to %v; want prompt − cached = %d (%v → %v)", mc.tenant, turn, got, miss, before, after)
			}
			broke := after[misses.CauseClientBreak] - before[misses.CauseClientBreak]
			if mc.stamp && turn > 0 && broke == 0 {
				t.Errorf("%s turn %d: no client_prefix_break tokens; want some (%v → %v)", mc.tenant, turn, before, after)
			}
			if !mc.stamp && broke != 0 {
				t.Errorf("%s turn %d: %v client_prefix_break tokens; want 0", mc.tenant, turn, broke)
			}
		}
	}
	for i, mc := range convs {
		checkUsageUncached(t, gw, mc.tenant, want[i], mc.stamp)
		checkPrefixBreaks(t, gw, mc.tenant, mc.stamp)
	}
}

// checkUsageUncached checks the usage API's uncached tokens by cause for
// tenant: they sum to want (prompt − cached), with client breaks only
// when broke.
func checkUsageUncached(t *testing.T, gw *testGateway, tenant string, want int, broke bool) {
	t.Helper()
	var rep struct {
		Total tenancy.Counts `json:"total"`
	}
	testrun.Eventually(t, 5*time.Second, func() bool {
		if code := admin(t, gw.URL, "GET", "/admin/tenants/"+tenant+"/usage", "", &rep); code != http.StatusOK {
			t.Fatalf("usage of %s: %d", tenant, code)
		}
		u := rep.Total.Uncached
		return u.New+u.ClientBreak+u.Evicted+u.RoutedAway+u.StaleIndex+u.ColdReplica == int64(want)
	}, fmt.Sprintf("%s's usage: uncached tokens by cause summing to %d", tenant, want))
	if got := rep.Total.PromptTokens - rep.Total.CachedTokens; got != int64(want) {
		t.Errorf("%s's usage: prompt − cached = %d; want %d", tenant, got, want)
	}
	if (rep.Total.Uncached.ClientBreak > 0) != broke {
		t.Errorf("%s's usage: client_prefix_break = %d; want some: %v", tenant, rep.Total.Uncached.ClientBreak, broke)
	}
}

// checkPrefixBreaks checks the admin API's diagnostics of tenant.
func checkPrefixBreaks(t *testing.T, gw *testGateway, tenant string, broke bool) {
	t.Helper()
	var pb PrefixBreaks
	if code := admin(t, gw.URL, "GET", "/admin/tenants/"+tenant+"/prefix-breaks", "", &pb); code != http.StatusOK {
		t.Fatalf("prefix-breaks of %s: %d", tenant, code)
	}
	if pb.Turns != 4 {
		t.Errorf("%s: %d turns compared; want 4", tenant, pb.Turns)
	}
	if !broke {
		if len(pb.Examples) != 0 || len(pb.Hints) != 0 {
			t.Errorf("%s: %d examples, hints %+v; want none", tenant, len(pb.Examples), pb.Hints)
		}
		return
	}
	if len(pb.Examples) != 4 || len(pb.Hints) == 0 {
		t.Fatalf("%s: %d examples, %d hints; want 4 and some", tenant, len(pb.Examples), len(pb.Hints))
	}
	e := pb.Examples[0]
	// "Current time: 2026-12-06T21:0" is 29 bytes: the minute's second
	// digit differs, within the 16-byte granule of the locator.
	if e.Part != "system" || e.Change != "edited" || e.Offset > 29 || e.Token > 8 || e.Excerpt == "" {
		t.Errorf("%s: newest break %+v; want the system prompt edited at its start, with an excerpt", tenant, e)
	}
	if h := pb.Hints[0]; h.Part != "system" || h.Share < 0.99 {
		t.Errorf("%s: first hint %+v; want the system prompt on every turn", tenant, h)
	}
}

// TestRecordWritesAnsweredRequests: with record.dir set, each answered
// request is one line with the usage its replica reported, the replica
// that answered, its block keys, and its tenant and session hashed.
func TestRecordWritesAnsweredRequests(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	cfg.Routing.Tokenizer = TokenizerSimulator
	cfg.Record.Dir = t.TempDir()
	gw := startGateway(t, cfg, nil)
	c := newConversation(words("recorded", 120), words("hello", 20))
	var got []chatResult
	for turn := range 3 {
		got = append(got, c.turn(t, gw.URL, words(fmt.Sprint("next", turn), 10)))
	}
	testrun.Eventually(t, 5*time.Second, func() bool { return gw.obs.rec.Written() == 3 }, "three entries written")
	var entries []record.Entry
	if err := record.ReadDir(cfg.Record.Dir, func(e record.Entry) error { entries = append(entries, e); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(entries) != 3 {
		t.Fatalf("%d entries read back; want 3", len(entries))
	}
	for i, e := range entries {
		r := got[i]
		if e.PromptTokens != r.Usage.PromptTokens || e.CachedTokens != r.Usage.CachedTokens || e.OutputTokens != r.Usage.CompletionTokens || e.Replica != r.replica() {
			t.Errorf("entry %d = %+v; want the usage %+v from %s", i, e, r.Usage, r.replica())
		}
		if len(e.Session) != 16 || e.BlockTokens != gw.cfg.Routing.BlockSize {
			t.Errorf("entry %d: session %q, block tokens %d; want a 16-digit hash and %d", i, e.Session, e.BlockTokens, gw.cfg.Routing.BlockSize)
		}
	}
	// The later turns are sticky (routed without tokenizing): the
	// in-process tokenizer gives them their block keys all the same.
	for i, e := range entries {
		if n := len(e.Blocks); n != e.PromptTokens/gw.cfg.Routing.BlockSize && n != e.PromptTokens/gw.cfg.Routing.BlockSize+1 {
			t.Errorf("entry %d: %d block keys for %d prompt tokens", i, n, e.PromptTokens)
		}
	}
}

// TestMissAttributionDropsWhenBehind: with the worker missQueue jobs or
// missQueueBytes behind, a turn is not queued but dropped and counted,
// and the bytes it would have held are given back.
func TestMissAttributionDropsWhenBehind(t *testing.T) {
	reg := prometheus.NewRegistry()
	tr := newMissTracker(16, reg, testLogger(t), nil, nil)
	dropped := func() float64 {
		return counter(t, reg, "warmpath_miss_attribution_dropped_total", map[string]string{"reason": "queue_full"})
	}
	for range missQueue { // no worker runs: the queue fills
		tr.queue(t.Context(), &missJob{done: make(chan struct{})})
	}
	tr.queue(t.Context(), &missJob{bytes: 100})
	if got, q := dropped(), tr.queued.Load(); got != 1 || q != 0 {
		t.Errorf("a turn past a full queue: %v dropped, %d bytes queued; want 1 and 0", got, q)
	}
	for range missQueue {
		<-tr.jobs
	}
	tr.queue(t.Context(), &missJob{bytes: missQueueBytes + 1})
	if got, n, q := dropped(), len(tr.jobs), tr.queued.Load(); got != 2 || n != 0 || q != 0 {
		t.Errorf("a turn past the byte bound: %v dropped, %d jobs and %d bytes queued; want 2, 0 and 0", got, n, q)
	}
	tr.queue(t.Context(), &missJob{bytes: missQueueBytes})
	if got, n, q := dropped(), len(tr.jobs), tr.queued.Load(); got != 2 || n != 1 || q != missQueueBytes {
		t.Errorf("a turn within the bounds: %v dropped, %d jobs and %d bytes queued; want 2, 1 and %d", got, n, q, missQueueBytes)
	}
}

// TestMissAttributionDrainsOnShutdown: when Run's context ends it still
// works through the queue, within its grace: past it, what is queued is
// dropped and counted, flush markers are answered, and Run returns.
func TestMissAttributionDrainsOnShutdown(t *testing.T) {
	for _, tc := range []struct {
		name        string
		grace       time.Duration
		wantDropped float64
	}{
		{"within grace", missFinish, 0},
		{"grace passed", -time.Nanosecond, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			tr := newMissTracker(16, reg, testLogger(t), nil, nil)
			tr.grace = tc.grace
			marks := []chan struct{}{make(chan struct{}), make(chan struct{})}
			tr.queue(t.Context(), &missJob{done: marks[0]})
			if tc.wantDropped > 0 { // turns the worker would attribute (they name no replica: past grace, it must not)
				tr.queue(t.Context(), &missJob{bytes: 5})
				tr.queue(t.Context(), &missJob{bytes: 7})
			}
			tr.queue(t.Context(), &missJob{done: marks[1]})
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			if err := tr.Run(ctx); err != nil {
				t.Fatalf("Run: %v", err)
			}
			for i, m := range marks {
				select {
				case <-m:
				default:
					t.Errorf("flush marker %d not answered at shutdown", i)
				}
			}
			got := counter(t, reg, "warmpath_miss_attribution_dropped_total", map[string]string{"reason": "shutdown"})
			if got != tc.wantDropped || len(tr.jobs) != 0 || tr.queued.Load() != 0 {
				t.Errorf("after Run: %v dropped at shutdown, %d jobs and %d bytes queued; want %v, 0 and 0", got, len(tr.jobs), tr.queued.Load(), tc.wantDropped)
			}
		})
	}
}
