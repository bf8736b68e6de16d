package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/vllmsim"
)

// A prefix the replica evicted (BlockRemoved) stops attracting traffic: the
// index no longer predicts a hit there, and a sticky session on it is
// rebound as evicted.
func TestEvictedPrefixStopsAttracting(t *testing.T) {
	// 300 blocks of 16 tokens per replica: a 2,000-token prefix fits, a
	// flood of other prompts evicts it.
	sim := startSim(t, vllmsim.Config{Replicas: 2, KVBlocks: 300})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	cfg.Routing.SpeculativeTTL = -1 // judge the index by events alone
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)

	shared := words("handbook", 2000)
	// The first user message is long and the session's own, so the
	// binding's tip block is not part of the shared prefix that probes
	// store again.
	c := newConversation(shared, words("myquestion", 100))
	c.header = map[string]string{"X-Session-ID": "evict"}
	first := c.turn(t, gw.URL, "follow-up")
	home := first.replica()
	c.turn(t, gw.URL, "second")
	var rep *vllmsim.Replica
	for _, r := range sim.Replicas() {
		if r.Info().Name == home {
			rep = r
		}
	}
	probe := func(user string) chatResult {
		return chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 2,
			"messages": []msg{{"system", shared}, {"user", user}}}, nil)
	}
	testrun.Eventually(t, 5*time.Second, func() bool {
		return strings.HasPrefix(probe("warm probe").replica(), home)
	}, "the shared prefix to attract a new session")
	if r := probe("another probe"); r.Header.Get("X-Warmpath-Predicted-Cached") == "0" {
		t.Fatalf("no hit predicted on %s before eviction", home)
	}

	// Evict it: send other long prompts straight to the replica.
	evictionsBefore := rep.Stats().Evictions
	for i := range 6 {
		body := fmt.Sprintf(`{"model":"qwen3-32b","max_tokens":1,"messages":[{"role":"user","content":%q}]}`, words(fmt.Sprintf("flood%d", i), 1500))
		resp, err := http.Post(rep.Info().URL+"/v1/chat/completions", "application/json", stringsReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if rep.Stats().Evictions == evictionsBefore {
		t.Fatal("the flood evicted nothing; raise it")
	}
	testrun.Eventually(t, 5*time.Second, func() bool {
		keys := gw.router.Index().Keys(vllmsim.TokenizeChat([]vllmsim.Message{{Role: "system", Content: shared}}, nil, false), "qwen3-32b", "")
		return gw.router.Index().MatchTokens(keys, []string{home}, 1<<20, nil)[0] < 16*10
	}, "BlockRemoved events to reach the index")

	r := probe("after eviction")
	if got := r.Header.Get("X-Warmpath-Predicted-Cached"); got != "0" && r.replica() == home {
		t.Errorf("after eviction, %s still predicted %s cached tokens", home, got)
	}
	// The sticky session notices too.
	after := c.turn(t, gw.URL, "more")
	if got := after.Header.Get("X-Warmpath-Rebind"); got != scoring.RebindEvicted {
		t.Errorf("sticky session rebind = %q; want %q (reason %s)", got, scoring.RebindEvicted, after.Header.Get("X-Warmpath-Reason"))
	}
	if got := counter(t, gw.obs.reg, "warmpath_session_rebinds_total", map[string]string{"reason": scoring.RebindEvicted}); got < 1 {
		t.Errorf("evicted rebinds = %v; want ≥ 1", got)
	}
}

// The same multi-turn workload under round-robin and warmpath, each on a
// fresh fleet: warmpath's fleet-wide cached-prefix fraction is far above
// round-robin's.
func TestCachedFractionRoundRobinVsWarmpath(t *testing.T) {
	run := func(policy string) float64 {
		sim := startSim(t, vllmsim.Config{Replicas: 8})
		cfg := fleetConfig(sim)
		cfg.Routing.Policy = policy
		rdb := redisFor(t, &cfg)
		gw := startGateway(t, cfg, rdb)
		// Seven sessions on eight replicas, their turns interleaved in a
		// fixed order: round-robin then sends each session's next turn to
		// another replica, as it does under real traffic. (Eight sessions
		// in lockstep on eight replicas would make round-robin sticky by
		// accident.)
		convs := make([]*conversation, 7)
		for i := range convs {
			convs[i] = newConversation(words(fmt.Sprintf("agent%d", i), 1200), "task")
		}
		for turn := range 12 {
			for _, c := range convs {
				c.turn(t, gw.URL, fmt.Sprintf("tool result %d %s", turn, words("out", 40)))
			}
		}
		cached := counter(t, gw.obs.reg, "warmpath_cached_tokens_total", map[string]string{"policy": policy})
		prompt := counter(t, gw.obs.reg, "warmpath_prompt_tokens_total", map[string]string{"policy": policy})
		if prompt == 0 {
			t.Fatalf("%s: no prompt tokens accounted", policy)
		}
		return cached / prompt
	}
	rr := run(scoring.PolicyRoundRobin)
	wp := run(scoring.PolicyWarmpath)
	t.Logf("fleet cached-prefix fraction: round-robin %.3f, warmpath %.3f (%.1f×)", rr, wp, wp/rr)
	// 12 turns: the first of each session is cold, so the ceiling is about
	// 11/12 of the prompt tokens; round-robin over 8 replicas finds an older
	// copy of the conversation only where an earlier turn landed — in this
	// interleaving, from the ninth turn of a session on.
	if wp < 0.8 {
		t.Errorf("warmpath cached fraction %.3f; want ≥ 0.8", wp)
	}
	if wp < 2*rr {
		t.Errorf("warmpath %.3f is not far above round-robin %.3f", wp, rr)
	}
}
