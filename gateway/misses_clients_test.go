package gateway

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/misses"
	"github.com/warmpath/warmpath/vllmsim"
)

// breakerTurns is how many turns each client of clients/breakers.mjs runs.
const breakerTurns = 5

// breakerWant is what the gateway should diagnose of one client of
// clients/breakers.mjs: how many of its turns break, the part and change
// of every break, the message index (-1: any), and the largest byte
// offset inside the part.
type breakerWant struct {
	client    string
	breaks    int
	part      string
	change    string
	index     int
	maxOffset int
}

// The openai npm client as three clients that break their own prefix and
// one that does not (clients/breakers.mjs), each as its own tenant on a
// one-replica fleet (so no routing choice can cost a hit): each bad
// client's every later turn is reported with the right part, change and
// offset, and its misses go to client_prefix_break, none to a cause
// routing or capacity would own; the good client reports no break and no
// client_prefix_break token.
func TestBreakingClientsDiagnosed(t *testing.T) {
	node, dir := nodeClients(t)
	sim := startSim(t, vllmsim.Config{Replicas: 1})
	cfg := tenantConfig(sim)
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	wants := []breakerWant{
		// "Current time: 2026-12-06T21:52:10.123Z. ": the seconds and
		// milliseconds change, 28 to 37 bytes in.
		{client: "timestamp", breaks: breakerTurns - 1, part: "system", change: "edited", index: 0, maxOffset: 40},
		{client: "shuffle", breaks: breakerTurns - 1, part: "tools", change: "tools_reordered", index: -1, maxOffset: 1 << 20},
		// The first answer (message 2) is rewritten from the third turn:
		// the break is at its start, then at its revision number, 36
		// bytes in.
		{client: "rewrite", breaks: breakerTurns - 2, part: "message", change: "rewritten", index: 2, maxOffset: 40},
		{client: "good"},
	}
	for _, w := range wants {
		key := newTenant(t, gw.URL, w.client, "")
		runBreaker(t, node, dir, gw.URL, key, w.client)
		checkBreaker(t, gw, w)
	}
}

// runBreaker runs one client of clients/breakers.mjs against the gateway.
func runBreaker(t *testing.T, node, dir, url, key, client string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "breakers.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "OPENAI_BASE_URL="+url+"/v1", "OPENAI_API_KEY="+key,
		"WARMPATH_MODEL="+vllmsim.DefaultModel, "WARMPATH_CLIENT="+client, fmt.Sprintf("WARMPATH_TURNS=%d", breakerTurns))
	out, err := cmd.CombinedOutput()
	t.Logf("breakers.mjs %s:\n%s", client, out)
	if err != nil {
		t.Fatalf("breakers.mjs %s: %v", client, err)
	}
}

// checkBreaker checks what the gateway diagnosed of one client.
func checkBreaker(t *testing.T, gw *testGateway, w breakerWant) {
	t.Helper()
	causes := uncachedBy(t, gw, w.client)
	if causes[misses.CauseNew] == 0 {
		t.Errorf("%s: no new tokens: its turns were not attributed (%v)", w.client, causes)
	}
	var pb PrefixBreaks
	if code := admin(t, gw.URL, "GET", "/admin/tenants/"+w.client+"/prefix-breaks", "", &pb); code != http.StatusOK {
		t.Fatalf("prefix-breaks of %s: %d", w.client, code)
	}
	if pb.Turns != breakerTurns-1 {
		t.Errorf("%s: %d turns compared; want %d (every turn found its previous one)", w.client, pb.Turns, breakerTurns-1)
	}
	for _, c := range []misses.Cause{misses.CauseEvicted, misses.CauseRoutedAway, misses.CauseStaleIndex, misses.CauseColdReplica} {
		if causes[c] != 0 {
			t.Errorf("%s: %v %s tokens; want 0 (one replica, nothing evicted)", w.client, causes[c], c)
		}
	}
	if w.part == "" {
		if len(pb.Examples) != 0 || causes[misses.CauseClientBreak] != 0 {
			t.Errorf("%s: %d breaks, %v client_prefix_break tokens; want none", w.client, len(pb.Examples), causes[misses.CauseClientBreak])
		}
		return
	}
	if causes[misses.CauseClientBreak] == 0 {
		t.Errorf("%s: no client_prefix_break tokens", w.client)
	}
	if len(pb.Examples) != w.breaks {
		t.Fatalf("%s: %d breaks; want %d: %+v", w.client, len(pb.Examples), w.breaks, pb.Examples)
	}
	for _, e := range pb.Examples {
		if e.Part != w.part || e.Change != w.change || (w.index >= 0 && e.Index != w.index) || e.Offset > w.maxOffset || e.Excerpt != "" {
			t.Errorf("%s: break %+v; want part %s, change %s, index %d, offset ≤ %d, no excerpt", w.client, e, w.part, w.change, w.index, w.maxOffset)
		}
	}
	if len(pb.Hints) == 0 || pb.Hints[0].Part != w.part || pb.Hints[0].Share < 0.99 {
		t.Errorf("%s: hints %+v; want the %s on every turn first", w.client, pb.Hints, w.part)
	}
	t.Logf("%s: %s; causes %v", w.client, pb.Hints[0].Text, causes)
}

// TestReplicaRestartIsColdReplica: a session's replica restarts between
// two of its turns; the next turn's misses go to cold_replica, none to
// the client.
func TestReplicaRestartIsColdReplica(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1})
	gw := startGateway(t, fleetConfig(sim), nil)
	c := newConversation(words("restarting", 300), words("hello", 30))
	for turn := range 2 {
		c.turn(t, gw.URL, words(fmt.Sprint("next", turn), 10))
	}
	// The restart is told by the engine's counters going back: wait for
	// a scrape that saw them count the turns.
	testrun.Eventually(t, 10*time.Second, func() bool {
		return gw.fleet.Snapshot().Replicas[0].State().PrefixQueries > 0
	}, "a scrape after the turns")
	before := uncachedBy(t, gw, "")
	sim.Replicas()[0].Restart()
	testrun.Eventually(t, 10*time.Second, func() bool {
		return gw.fleet.Snapshot().Replicas[0].State().Restarts >= 1
	}, "the restart seen on the replica's metrics")
	r := c.turn(t, gw.URL, "after the restart")
	miss := float64(r.Usage.PromptTokens - r.Usage.CachedTokens)
	after := uncachedBy(t, gw, "")
	if got := sum(after) - sum(before); got != miss {
		t.Errorf("the turn after the restart: causes sum to %v; want prompt − cached = %v (usage %+v), %v → %v", got, miss, r.Usage, before, after)
	}
	cold := after[misses.CauseColdReplica] - before[misses.CauseColdReplica]
	if broke := after[misses.CauseClientBreak] - before[misses.CauseClientBreak]; cold < 300 || broke != 0 {
		t.Errorf("after the restart: %v cold_replica, %v client_prefix_break tokens of %v uncached; want the previous prompt (≥ 300) cold, none broken (%v → %v)",
			cold, broke, miss, before, after)
	}
}

// TestSmallCacheIsEvicted: a replica whose cache is too small for the
// traffic drops a session's prefix between two of its turns; the next
// turn's misses go to evicted, none to the client or to routing.
func TestSmallCacheIsEvicted(t *testing.T) {
	// 300 blocks of 16 tokens: the conversation fits, a flood evicts it.
	sim := startSim(t, vllmsim.Config{Replicas: 1, KVBlocks: 300})
	cfg := fleetConfig(sim)
	cfg.Routing.SpeculativeTTL = -1 // judge the index by events alone
	gw := startGateway(t, cfg, nil)
	system := words("handbook", 2000)
	c := newConversation(system, words("myquestion", 100))
	for turn := range 2 {
		c.turn(t, gw.URL, words(fmt.Sprint("next", turn), 10))
	}
	rep := sim.Replicas()[0]
	for i := range 6 {
		body := fmt.Sprintf(`{"model":"qwen3-32b","max_tokens":1,"messages":[{"role":"user","content":%q}]}`, words(fmt.Sprintf("flood%d", i), 1500))
		resp, err := http.Post(rep.Info().URL+"/v1/chat/completions", "application/json", stringsReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	name := rep.Info().Name
	testrun.Eventually(t, 5*time.Second, func() bool {
		keys := gw.router.Index().Keys(vllmsim.TokenizeChat([]vllmsim.Message{{Role: "system", Content: system}}, nil, false), "qwen3-32b", "")
		return gw.router.Index().MatchTokens(keys, []string{name}, 1<<20, nil)[0] < 16*10
	}, "the eviction's BlockRemoved events to reach the index")
	before := uncachedBy(t, gw, "")
	r := c.turn(t, gw.URL, "after the flood")
	miss := float64(r.Usage.PromptTokens - r.Usage.CachedTokens)
	after := uncachedBy(t, gw, "")
	if got := sum(after) - sum(before); got != miss {
		t.Errorf("the turn after the flood: causes sum to %v; want prompt − cached = %v (%v → %v)", got, miss, before, after)
	}
	delta := func(c misses.Cause) float64 { return after[c] - before[c] }
	if delta(misses.CauseEvicted) < 1500 || delta(misses.CauseClientBreak) != 0 || delta(misses.CauseRoutedAway) != 0 || delta(misses.CauseStaleIndex) != 0 {
		t.Errorf("after the flood: %v → %v of %v uncached tokens; want most of the previous prompt evicted, nothing broken, routed away or stale", before, after, miss)
	}
	t.Logf("after the flood: %v uncached tokens, %v evicted", miss, delta(misses.CauseEvicted))
}
