package gateway

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/session"
	"github.com/warmpath/warmpath/tenancy/fairq"
	"github.com/warmpath/warmpath/vllmsim"
)

// Turns of one session stick to one replica; after the first, they are
// routed without tokenizing, and they hit the cache.
func TestSessionSticks(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 4})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)

	c := newConversation(words("sys", 800), "first question")
	var home string
	for i := range 6 {
		r := c.turn(t, gw.URL, fmt.Sprintf("question %d", i+2))
		if i == 0 {
			home = r.replica()
			if got := r.Header.Get("X-Warmpath-Reason"); got != scoring.ReasonScored {
				t.Errorf("turn 1 reason = %q; want %q", got, scoring.ReasonScored)
			}
			// A subscriber that joins after this turn's blocks were
			// speculated clears them (its events, or their replay, take
			// over): wait for it, or a loaded machine sees the session's
			// tip missing and rebinds turn 2.
			testrun.Eventually(t, 10*time.Second, func() bool { return gw.router.Index().Receiving(home) }, "KV events from the session's replica")
			continue
		}
		if r.replica() != home {
			t.Fatalf("turn %d went to %s; session is bound to %s (reason %q, rebind %q, attempts %s, scores %s)", i+1, r.replica(), home,
				r.Header.Get("X-Warmpath-Reason"), r.Header.Get("X-Warmpath-Rebind"), r.Header.Get("X-Warmpath-Attempts"), r.Header.Get("X-Warmpath-Scores"))
		}
		if got := r.Header.Get("X-Warmpath-Reason"); got != scoring.ReasonSticky {
			t.Errorf("turn %d reason = %q; want %q", i+1, got, scoring.ReasonSticky)
		}
		if r.Usage.CachedTokens < 800 {
			t.Errorf("turn %d cached %d of %d prompt tokens; want the conversation so far", i+1, r.Usage.CachedTokens, r.Usage.PromptTokens)
		}
		// Without tokenizing, the prediction still tracks the growing
		// conversation: the last turn's prompt and reply.
		predicted, _ := strconv.Atoi(r.Header.Get("X-Warmpath-Predicted-Cached"))
		if d := predicted - r.Usage.CachedTokens; d < -16 || d > 16 {
			t.Errorf("turn %d predicted %d cached tokens; the replica reported %d", i+1, predicted, r.Usage.CachedTokens)
		}
	}
	if got := counter(t, gw.obs.reg, "warmpath_tokenizer_avoided_total", nil); got != 5 {
		t.Errorf("tokenizer avoided %v times; want 5", got)
	}
	// The first turn was tokenized (routing.skip_unseen is off); no other.
	if got := counter(t, gw.obs.reg, "warmpath_tokenizer_calls_total", map[string]string{"result": "ok"}); got != 1 {
		t.Errorf("tokenizations = %v; want the first turn's", got)
	}
}

// With routing.skip_unseen, prompts whose opening no replica was sent skip
// the tokenizer on the request path; the tip workers tokenize them
// afterwards, so the replica
// each went to is known to hold its blocks before any KV event says so: a
// second conversation sharing the prompt follows it. The fleet here
// publishes no events, so every index entry is that speculation.
func TestUnseenPromptsTokenizedOffThePath(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 4})
	cfg := fleetConfig(sim)
	for i := range cfg.Replicas {
		cfg.Replicas[i].KVEndpoint, cfg.Replicas[i].ReplayEndpoint = "", ""
	}
	cfg.Debug = true
	cfg.Routing.SkipUnseen = true
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	shared := words("handbook", 400)
	first := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 2,
		"messages": []msg{{"system", shared}, {"user", "alice asks"}}}, nil)
	if got := counter(t, gw.obs.reg, "warmpath_tokenizer_unseen_total", nil); got != 1 {
		t.Fatalf("unseen prompts = %v; want 1", got)
	}
	testrun.Eventually(t, 5*time.Second, func() bool {
		return counter(t, gw.obs.reg, "warmpath_session_tips_total", map[string]string{"result": "filled"}) == 1
	}, "the first prompt tokenized off the request path")
	second := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 2,
		"messages": []msg{{"system", shared}, {"user", "bob asks something else"}}}, nil)
	if second.replica() != first.replica() {
		t.Errorf("the second conversation went to %s, the first to %s (scores %s)", second.replica(), first.replica(), second.Header.Get("X-Warmpath-Scores"))
	}
	if p := second.Header.Get("X-Warmpath-Predicted-Cached"); p == "" || p == "0" {
		t.Errorf("predicted cached = %q; want the shared system prompt's blocks", p)
	}
}

// A prefix shared across sessions goes to the replica that caches it, for
// the precise policies.
func TestSharedPrefixGoesWhereCached(t *testing.T) {
	for _, policy := range []string{scoring.PolicyPrecisePrefix, scoring.PolicyWarmpath} {
		t.Run(policy, func(t *testing.T) {
			sim := startSim(t, vllmsim.Config{Replicas: 4})
			cfg := fleetConfig(sim)
			cfg.Debug = true
			cfg.Routing.Policy = policy
			rdb := redisFor(t, &cfg)
			gw := startGateway(t, cfg, rdb)

			shared := words("manual", 1500)
			first := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 4,
				"messages": []msg{{"system", shared}, {"user", "alice asks"}}}, nil)
			home := first.replica()
			// Wait for the engine's BlockStored events to reach the index.
			testrun.Eventually(t, 5*time.Second, func() bool { return gw.router.Index().Receiving(home) }, "KV events")
			for i := range 5 {
				r := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 4,
					"messages": []msg{{"system", shared}, {"user", fmt.Sprintf("user %d asks something else", i)}}}, nil)
				if r.replica() != home {
					t.Fatalf("session %d went to %s; the shared prefix is cached on %s (scores %s)", i, r.replica(), home, r.Header.Get("X-Warmpath-Scores"))
				}
				if r.Usage.CachedTokens < 1400 {
					t.Errorf("session %d cached %d tokens; want the shared prefix", i, r.Usage.CachedTokens)
				}
			}
		})
	}
}

// A sticky replica that saturates (long engine queue) yields: the session
// is rebound to another replica, and the rebind is counted.
func TestSaturatedStickyReplicaYields(t *testing.T) {
	p := vllmsim.DefaultProfile()
	p.MaxNumSeqs = 1
	sim := startSim(t, vllmsim.Config{Replicas: 2, Profile: p, Speed: 5})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	cfg.Routing.MaxWaiting = 2
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)

	c := newConversation(words("sys", 300), "hello")
	home := c.turn(t, gw.URL, "next").replica()
	var rep *vllmsim.Replica
	for _, r := range sim.Replicas() {
		if r.Info().Name == home {
			rep = r
		}
	}
	// Fill the home replica's queue directly: one long generation runs and
	// the rest wait behind it (max_num_seqs 1).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 4 {
		go func() {
			body := fmt.Sprintf(`{"model":"qwen3-32b","max_tokens":4000,"ignore_eos":true,"messages":[{"role":"user","content":%q}]}`, words("load", 50))
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rep.Info().URL+"/v1/chat/completions", stringsReader(body))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	testrun.Eventually(t, 10*time.Second, func() bool {
		sat, _ := gw.fleet.Replica(home).Saturated(time.Now())
		return sat
	}, "home replica saturated")
	r := c.turn(t, gw.URL, "after saturation")
	if r.replica() == home {
		t.Fatalf("turn went to the saturated replica %s", home)
	}
	if got := r.Header.Get("X-Warmpath-Rebind"); got != scoring.RebindSaturated {
		t.Errorf("rebind reason = %q; want %q", got, scoring.RebindSaturated)
	}
	if got := counter(t, gw.obs.reg, "warmpath_session_rebinds_total", map[string]string{"reason": scoring.RebindSaturated}); got != 1 {
		t.Errorf("saturated rebinds = %v; want 1", got)
	}
	// The session now lives on the new replica.
	cancel()
	if again := c.turn(t, gw.URL, "and again"); again.replica() != r.replica() {
		t.Errorf("after rebinding, the session went to %s; want %s", again.replica(), r.replica())
	}
}

// A replica killed mid-run is routed around: no non-streaming request
// fails, and its sessions move.
func TestKilledReplicaRoutedAround(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 3})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)

	convs := make([]*conversation, 6)
	for i := range convs {
		convs[i] = newConversation(words(fmt.Sprintf("s%d", i), 200), "start")
		convs[i].turn(t, gw.URL, "next")
	}
	victim := sim.Replicas()[0]
	errs := make(chan error, 100)
	done := make(chan struct{})
	// The victim dies once the run is under way: when the first turn of
	// it has answered, the others are in flight or queued behind it.
	underway := make(chan struct{})
	var once sync.Once
	go func() {
		defer close(done)
		parallel(len(convs), func(i int) {
			for j := range 4 {
				r := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "messages": convs[i].messages, "max_tokens": 16}, nil)
				once.Do(func() { close(underway) })
				if r.Status != http.StatusOK {
					errs <- fmt.Errorf("session %d turn %d: status %d: %s", i, j, r.Status, r.Body)
				}
			}
		})
	}()
	<-underway
	if err := victim.SetDown(true); err != nil {
		t.Fatal(err)
	}
	<-done
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	testrun.Eventually(t, 5*time.Second, func() bool { return !gw.fleet.Replica(victim.Info().Name).State().Healthy }, "victim unhealthy")
	for i, c := range convs {
		if r := c.turn(t, gw.URL, "after"); r.replica() == victim.Info().Name {
			t.Errorf("session %d still routed to the dead replica", i)
		}
	}
}

// Two gateway processes sharing one Redis send one session's turns to the
// same replica, whichever gateway each turn reaches.
func TestTwoGatewaysShareSessions(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 4})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	rdb := redisFor(t, &cfg)
	a := startGateway(t, cfg, rdb)
	b := startGateway(t, cfg, rdb)

	for s := range 4 {
		c := newConversation(words(fmt.Sprintf("doc%d", s), 300), "hi")
		c.header = map[string]string{"X-Session-ID": fmt.Sprintf("shared-%d", s)}
		var home string
		for turn := range 6 {
			url := a.URL
			if turn%2 == 1 {
				url = b.URL
			}
			r := c.turn(t, url, "more")
			if turn == 0 {
				home = r.replica()
			} else if r.replica() != home {
				t.Fatalf("session %d turn %d via gateway %d went to %s; bound to %s (reason %q, rebind %q, attempts %s, scores %s)", s, turn, turn%2, r.replica(), home,
					r.Header.Get("X-Warmpath-Reason"), r.Header.Get("X-Warmpath-Rebind"), r.Header.Get("X-Warmpath-Attempts"), r.Header.Get("X-Warmpath-Scores"))
			}
		}
	}
}

// With the session tracking on, a gateway answers a sticky turn's lookup
// from memory, yet reads the binding again once another gateway changed
// it in Redis: the change's notice distrusts its copy.
func TestTrackingFollowsAnotherGatewaysRebind(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := fleetConfig(sim)
	rdb := redisFor(t, &cfg)
	prefix := cfg.Redis.KeyPrefix + "sess:"
	cmds := &sessionCmds{prefix: prefix, release: make(chan struct{})}
	close(cmds.release)
	rdb.AddHook(cmds)
	g := startGateway(t, cfg, rdb)
	testrun.Eventually(t, 5*time.Second, func() bool { return counter(t, g.obs.reg, "warmpath_session_tracking", nil) == 1 }, "session tracking on")
	c := newConversation(words("rebound", 100), "hi")
	c.header = map[string]string{"X-Session-ID": "rebound"}
	c.turn(t, g.URL, "more")
	var keys []string
	testrun.Eventually(t, 5*time.Second, func() bool {
		keys = rdb.Keys(t.Context(), prefix+"*/*").Val() // the conversation's, under the session id
		return len(keys) == 1
	}, "the conversation's binding in Redis")
	key := strings.TrimPrefix(keys[0], prefix)
	turn := func() int64 {
		cmds.gets.Store(0)
		c.turn(t, g.URL, "more")
		return cmds.gets.Load()
	}
	// Once its write has been answered, its own binding is read from memory.
	testrun.Eventually(t, 5*time.Second, func() bool { return turn() == 0 }, "a turn answered from memory")
	if n := turn(); n != 0 {
		t.Errorf("the turn after read %d session bindings from Redis; want none", n)
	}

	// Another gateway (a store of its own) changes the binding, once this
	// gateway's last write has landed (a later one would overwrite it).
	other := session.NewStore(rdb, session.Options{Prefix: cfg.Redis.KeyPrefix})
	var b session.Binding
	testrun.Eventually(t, 5*time.Second, func() bool {
		mine, _ := g.router.Sessions().Local(key)
		var ok bool
		b, ok, _ = other.Lookup(t.Context(), key)
		return ok && b.Updated.UnixMilli() == mine.Updated.UnixMilli()
	}, "this gateway's last write in Redis")
	b.Turns += 10
	if !g.router.Sessions().Trusted(key) {
		t.Fatal("the binding is not trusted before the change")
	}
	if _, err := other.Remember(t.Context(), key, b, false); err != nil {
		t.Fatal(err)
	}
	testrun.Eventually(t, 5*time.Second, func() bool { return !g.router.Sessions().Trusted(key) }, "the change's notice to distrust the binding")
	if n := turn(); n != 1 {
		t.Errorf("after another's change the turn read %d session bindings from Redis; want 1", n)
	}
	if n := turn(); n != 0 {
		t.Errorf("after reading it again the turn read %d; want none", n)
	}
}

// Concurrent first turns of one session on two gateways bind it once: the
// first turns are routed without waiting for Redis (each gateway keeps its
// binding in memory until its turn completes), the first write to land
// wins (SET NX GET, from a completed turn or a later lookup), the other
// gateway adopts it, and every later turn, through either gateway, goes to
// that one replica.
func TestTwoGatewaysRaceFirstTurn(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 4})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	rdb := redisFor(t, &cfg)
	gws := []*testGateway{startGateway(t, cfg, rdb), startGateway(t, cfg, rdb)}
	for s := range 8 {
		id := fmt.Sprintf("race-%d", s)
		send := func(gw *testGateway) chatResult {
			return chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 4,
				"messages": []msg{{"user", words("race", 100)}}}, map[string]string{"X-Session-ID": id})
		}
		parallel(4, func(i int) { send(gws[i%2]) })
		var bound string
		for turn := range 4 {
			r := send(gws[turn%2])
			if turn == 0 {
				bound = r.replica()
			} else if r.replica() != bound {
				t.Fatalf("session %d turn %d via gateway %d went to %s (%s/%s); the session's turn 1 went to %s", s, turn+1, turn%2, r.replica(),
					r.Header.Get("X-Warmpath-Reason"), r.Header.Get("X-Warmpath-Rebind"), bound)
			}
		}
	}
}

// A session key that spans unrelated conversations (here `user`, which
// names a person, not a chat) does not glue them together: each
// conversation under it gets a binding of its own (the key joins the
// conversation's opening), so neither rebinds the other's.
func TestConversationsSharingAKey(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 4})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)

	a := newConversation(words("contract", 600), "summarize")
	b := newConversation(words("recipe", 600), "translate")
	a.extra = map[string]any{"user": "alice"}
	b.extra = map[string]any{"user": "alice"}
	a.turn(t, gw.URL, "more")
	rb := b.turn(t, gw.URL, "more")
	if got := rb.Header.Get("X-Warmpath-Rebind"); got != "" {
		t.Errorf("b's first turn: rebind %q; want none (it is a conversation of its own)", got)
	}
	if got := rb.Header.Get("X-Warmpath-Reason"); got == scoring.ReasonSticky {
		t.Errorf("b's first turn went sticky on a's binding")
	}
	for name, c := range map[string]*conversation{"a": a, "b": b} {
		if r := c.turn(t, gw.URL, "again"); r.Header.Get("X-Warmpath-Reason") != scoring.ReasonSticky || r.Usage.CachedTokens < 600 {
			t.Errorf("%s's next turn: reason %q rebind %q, cached %d; want sticky and cached", name,
				r.Header.Get("X-Warmpath-Reason"), r.Header.Get("X-Warmpath-Rebind"), r.Usage.CachedTokens)
		}
	}
}

// warmpath shows each candidate's TTFT estimate, and checks the chosen
// one against the first byte: the error histogram gets one sample per
// answered request, by replica, and the calibration learns from it.
func TestEstimateHeadersAndError(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	c := newConversation(words("estimate", 400), "first")
	var last chatResult
	for i := range 3 {
		last = c.turn(t, gw.URL, fmt.Sprintf("next %d", i))
		est, err := strconv.ParseFloat(last.Header.Get("X-Warmpath-Estimate-TTFT"), 64)
		if err != nil || est <= 0 {
			t.Fatalf("turn %d: X-Warmpath-Estimate-TTFT %q", i, last.Header.Get("X-Warmpath-Estimate-TTFT"))
		}
		scores := last.Header.Get("X-Warmpath-Scores")
		if strings.Count(scores, "ttft:") != 2 || !strings.HasPrefix(scores, last.replica()+"=") {
			t.Errorf("turn %d: scores %q; want both candidates, the chosen first", i, scores)
		}
	}
	mfs, err := gw.obs.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != "warmpath_ttft_estimate_error_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			n += m.GetHistogram().GetSampleCount()
		}
	}
	if n != 3 {
		t.Errorf("estimate error histogram has %d samples; want 3", n)
	}
	if got := gw.router.Calibrator().Observations("qwen3-32b"); got < 2.9 {
		t.Errorf("calibration saw %.1f observations; want 3", got)
	}
}

// A first turn's tokenization starts before its session lookup and is
// the only one the turn makes; a turn of a session another gateway bound
// still goes sticky to that binding (its early tokenization only filled
// the cache), and this gateway's next turn asks neither the tokenizer nor
// Redis's copy again within the trust window.
func TestEarlyTokenizeOverlapsLookup(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 4})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	rdb := redisFor(t, &cfg)
	a := startGateway(t, cfg, rdb)
	b := startGateway(t, cfg, rdb)
	calls := func(g *testGateway) float64 {
		return counter(t, g.obs.reg, "warmpath_tokenizer_calls_total", map[string]string{"result": "ok"})
	}
	c := newConversation(words("early", 200), "first")
	first := c.turn(t, a.URL, "second")
	if got := first.Header.Get("X-Warmpath-Reason"); got != scoring.ReasonScored {
		t.Fatalf("first turn reason %q; want scored", got)
	}
	if n := calls(a); n != 1 {
		t.Errorf("first turn made %v tokenizer calls; want 1", n)
	}
	testrun.Eventually(t, 5*time.Second, func() bool { return len(rdb.Keys(t.Context(), cfg.Redis.KeyPrefix+"sess:*").Val()) == 1 }, "the first turn's binding in Redis")
	second := c.turn(t, b.URL, "third")
	if second.replica() != first.replica() || second.Header.Get("X-Warmpath-Reason") != scoring.ReasonSticky {
		t.Errorf("turn via the other gateway: %s (%s); want sticky to %s", second.replica(), second.Header.Get("X-Warmpath-Reason"), first.replica())
	}
	// The other gateway held no binding of the session, so it started
	// tokenizing before its lookup found one.
	before := calls(b)
	if before != 1 {
		t.Errorf("the other gateway made %v tokenizer calls; want 1 (started before the lookup)", before)
	}
	third := c.turn(t, b.URL, "fourth")
	if third.replica() != first.replica() || calls(b) != before {
		t.Errorf("next turn via the same gateway: %s after %v more tokenizer calls; want %s and none", third.replica(), calls(b)-before, first.replica())
	}
}

// A chat conversation's first turn asks Redis for no binding (none can be
// there but a retry's) and does not wait for its binding's write: here
// Redis holds every binding write until the response is in, and the turn
// is answered all the same, with no Redis error; the binding lands once
// released, with what the turn left cached. Its later turns read theirs,
// since another gateway may have changed it, unless the session tracking
// is on: then Redis would have said so, and they read nothing.
func TestFirstTurnAsksRedisNothing(t *testing.T) {
	for _, tracking := range []string{"off", "on"} {
		t.Run("tracking "+tracking, func(t *testing.T) { testFirstTurnAsksRedisNothing(t, tracking) })
	}
}

func testFirstTurnAsksRedisNothing(t *testing.T, tracking string) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := fleetConfig(sim)
	rdb := redisFor(t, &cfg)
	cfg.Redis.Tracking = tracking
	cmds := &sessionCmds{prefix: cfg.Redis.KeyPrefix + "sess:", release: make(chan struct{})}
	rdb.AddHook(cmds)
	g := startGateway(t, cfg, rdb)
	if tracking == "on" {
		testrun.Eventually(t, 5*time.Second, func() bool { return counter(t, g.obs.reg, "warmpath_session_tracking", nil) == 1 }, "session tracking on")
	}
	if r := chat(t, g.URL, chatBody("first turn", 0, 2), nil); r.Status != http.StatusOK {
		t.Fatalf("first turn: %d %s", r.Status, r.Body)
	}
	if n := cmds.gets.Load(); n != 0 {
		t.Errorf("the first turn read %d session bindings from Redis; want none", n)
	}
	testrun.Eventually(t, 5*time.Second, func() bool { return cmds.held.Load() > 0 }, "the binding's write")
	if n := counter(t, g.obs.reg, "warmpath_redis_errors_total", nil); n != 0 {
		t.Errorf("%v Redis errors: the turn waited for its binding's write", n)
	}
	close(cmds.release)
	testrun.Eventually(t, 5*time.Second, func() bool {
		keys := rdb.Keys(t.Context(), cmds.prefix+"*").Val()
		return len(keys) == 1 && strings.Contains(rdb.Get(t.Context(), keys[0]).Val(), `"ct":`)
	}, "the completed first turn's binding in Redis, with its cached tokens")
	cmds.gets.Store(0) // the test's own
	if r := chat(t, g.URL, chatBody("first turn", 40, 2), nil); r.Status != http.StatusOK {
		t.Fatalf("second turn: %d %s", r.Status, r.Body)
	}
	want := int64(1)
	if tracking == "on" {
		want = 0
	}
	if n := cmds.gets.Load(); n != want {
		t.Errorf("the second turn read %d session bindings from Redis; want %d", n, want)
	}
}

// sessionCmds is a go-redis hook counting GETs of session bindings and
// holding their writes (held counts them) until release is closed.
type sessionCmds struct {
	prefix     string
	gets, held atomic.Int64
	release    chan struct{}
}

func (h *sessionCmds) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *sessionCmds) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := h.see(ctx, cmd); err != nil {
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *sessionCmds) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if err := h.see(ctx, cmd); err != nil {
				return err
			}
		}
		return next(ctx, cmds)
	}
}

// see counts cmd and, when it writes a binding, holds it until release.
func (h *sessionCmds) see(ctx context.Context, cmd redis.Cmder) error {
	args := cmd.Args()
	if len(args) < 2 {
		return nil
	}
	if k, _ := args[1].(string); !strings.HasPrefix(k, h.prefix) {
		return nil
	}
	switch cmd.Name() {
	case "get":
		h.gets.Add(1)
	case "set":
		h.held.Add(1)
		select {
		case <-h.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// The gateway counts the demand for the longest prefix any replica holds
// of a scored prompt, under its block key, and hands it to the decision
// (Input.Sharers) for warmpath's replication term; baselines weigh no
// such term and count nothing.
func TestObserveDemand(t *testing.T) {
	for _, policy := range []string{scoring.PolicyWarmpath, scoring.PolicyPrecisePrefix} {
		t.Run(policy, func(t *testing.T) {
			sim := startSim(t, vllmsim.Config{Replicas: 2})
			cfg := fleetConfig(sim)
			cfg.Routing.Policy = policy
			gw := startGateway(t, cfg, redisFor(t, &cfg))
			const model = "qwen3-32b"
			// Conversations of two turns, 60 s apart: a lifetime of 30 s.
			for range 10 {
				gw.router.Calibrator().ObserveTurn(model, 1, 0)
				gw.router.Calibrator().ObserveTurn(model, 2, 60)
			}
			bs := gw.cfg.Routing.BlockSize
			keys := []uint64{101, 102, 103, 104}
			now := time.Unix(1_750_000_000, 0)
			var got []float64
			for k := range 3 {
				// Two requests share the three blocks replica 1 holds;
				// the third's deepest held prefix is another one.
				matched := []int{bs, 3 * bs}
				if k == 2 {
					matched = []int{2 * bs, bs}
				}
				in := &scoring.Input{Now: now, Matched: matched, BlockSize: bs}
				gw.router.ObserveDemand(testTurn(t, model, fairq.Interactive), in, keys)
				got = append(got, in.Sharers)
			}
			want := []float64{0, 1, 0}
			if policy != scoring.PolicyWarmpath {
				want = []float64{0, 0, 0}
			}
			if !slices.Equal(got, want) {
				t.Errorf("sharers %v; want %v", got, want)
			}
		})
	}
}

// Every routed request is timed in each of the gateway's phases before it
// forwards (warmpath_gateway_phase_seconds), and a rejected one only in
// those it reached.
func TestGatewayPhases(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := fleetConfig(sim)
	gw := startGateway(t, cfg, redisFor(t, &cfg))
	for i := range 3 {
		r := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 4,
			"messages": []msg{{"user", words(fmt.Sprintf("phase %d", i), 40)}}}, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, r.Status, r.Body)
		}
	}
	r := chat(t, gw.URL, map[string]any{"model": "no-such-model", "messages": []msg{{"user", "hi"}}}, nil)
	if r.Status != http.StatusNotFound {
		t.Fatalf("unknown model: status %d; want 404", r.Status)
	}
	for _, ph := range PhaseNames() {
		if n := histSamples(t, gw.obs.reg, "warmpath_gateway_phase_seconds", map[string]string{"phase": ph}); n != 3 {
			t.Errorf("phase %s: %d samples; want 3", ph, n)
		}
	}
}
