package gateway

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/vllmsim"
)

func TestClaimDepths(t *testing.T) {
	for _, c := range []struct {
		n, from int
		want    []int
	}{
		{0, 0, nil},
		{1, 0, []int{1}},
		{5, 0, []int{1, 2, 3, 4, 5}},
		{8, 0, []int{1, 2, 3, 4, 6, 8}},
		{100, 10, []int{12, 16, 24, 32, 48, 64, 96, 100}},
		{100, 100, nil},
	} {
		if got := claimDepths(c.n, c.from); !slices.Equal(got, c.want) {
			t.Errorf("claimDepths(%d, %d) = %v; want %v", c.n, c.from, got, c.want)
		}
	}
}

// Two gateways share a fleet and a Redis; the second reads no KV events,
// so all it can know of the first one's prefills is their claims. Each
// long context sent through the first gateway is then sent, with another
// question, through the second: it goes to the replica the first chose,
// having adopted the claim. On an idle fleet the second gateway's load
// routing may pick the same replica anyway, so the check that fails
// without the claim is its predicted cached tokens (0 without). Prompts
// below routing.claim_min_tokens read no claims, and a gateway that sees
// no other writes none.
func TestPrefixClaimsAcrossGateways(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 4})
	cfgA := fleetConfig(sim)
	cfgA.Debug = true // X-Warmpath-Replica, X-Warmpath-Predicted-Cached
	cfgA.Queue.SyncInterval = 20 * time.Millisecond
	cfgA.Routing.SpeculativeTTL = time.Minute // outlive a loaded CI machine's pauses
	rdb := redisFor(t, &cfgA)
	cfgB := cfgA
	cfgB.Replicas = slices.Clone(cfgA.Replicas)
	for i := range cfgB.Replicas {
		cfgB.Replicas[i].KVEndpoint, cfgB.Replicas[i].ReplayEndpoint = "", ""
	}
	a := startGateway(t, cfgA, rdb)
	// A alone: its long prompt writes no claim.
	solo := chat(t, a.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 4,
		"messages": []msg{{"user", words("solo", 2000)}}}, nil)
	if solo.Status != 200 {
		t.Fatalf("solo: status %d: %s", solo.Status, solo.Body)
	}
	if n := counter(t, a.Registry(), "warmpath_prefix_claims_total", map[string]string{"result": "written"}); n != 0 {
		t.Fatalf("a gateway alone wrote %v claims", n)
	}
	b := startGateway(t, cfgB, rdb)
	testrun.Eventually(t, 10*time.Second, func() bool { return a.waiting.peers() > 0 && b.waiting.peers() > 0 }, "the gateways see each other")

	const contexts = 6
	for i := range contexts {
		ctxText := words(fmt.Sprintf("context %d", i), 2000)
		first := chat(t, a.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 4,
			"messages": []msg{{"user", ctxText + " first question"}}}, nil)
		if first.Status != 200 {
			t.Fatalf("context %d via a: status %d: %s", i, first.Status, first.Body)
		}
		testrun.Eventually(t, 10*time.Second, func() bool {
			return counter(t, a.Registry(), "warmpath_prefix_claims_total", map[string]string{"result": "written"}) >= float64(i+1)
		}, "a's claim written")
		second := chat(t, b.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 4,
			"messages": []msg{{"user", ctxText + " another question entirely"}}}, nil)
		if second.Status != 200 {
			t.Fatalf("context %d via b: status %d: %s", i, second.Status, second.Body)
		}
		if second.replica() != first.replica() {
			t.Errorf("context %d: b sent it to %s, a had sent it to %s", i, second.replica(), first.replica())
		}
		// Without the claim b predicts nothing cached; with it, at least
		// two thirds of the shared context (checkpoints are 1.5× apart).
		if got, _ := strconv.Atoi(second.Header.Get("X-Warmpath-Predicted-Cached")); got < 1300 {
			t.Errorf("context %d: b predicted %d tokens cached; want at least 1,300 (a's claim)", i, got)
		}
	}
	if n := counter(t, b.Registry(), "warmpath_prefix_claims_total", map[string]string{"result": "adopted"}); n != contexts {
		t.Errorf("b adopted %v claims; want %d", n, contexts)
	}
	reads := counter(t, b.Registry(), "warmpath_prefix_claims_total", map[string]string{"result": "read"})
	short := chat(t, b.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 4,
		"messages": []msg{{"user", words("short", 100)}}}, nil)
	if short.Status != 200 {
		t.Fatalf("short: status %d", short.Status)
	}
	if n := counter(t, b.Registry(), "warmpath_prefix_claims_total", map[string]string{"result": "read"}); n != reads {
		t.Errorf("a 100-token prompt read claims (%v reads, %v before)", n, reads)
	}
}
