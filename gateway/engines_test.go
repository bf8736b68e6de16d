package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/kvevents"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/scoring/blockindex"
	"github.com/warmpath/warmpath/vllmsim"
)

// These tests run the deployment shapes of issue 13 through the gateway:
// simulated engines with the quirk under test, the gateway's own KV-event
// subscribers and index, and routing decisions read from debug headers.

// startSimPorts starts a simulated fleet on fixed ports (data-parallel
// ranks and central topologies need port + rank layouts, which ephemeral
// ports do not give), trying base ports until one range is free.
func startSimPorts(t *testing.T, cfg vllmsim.Config) *vllmsim.Fleet {
	t.Helper()
	if cfg.Speed == 0 {
		cfg.Speed = 50
	}
	var err error
	for i := range 50 {
		base := 20000 + (i*7919+int(time.Now().UnixNano()%997))%40000
		c := cfg
		c.KVPort = base
		if c.KVConnect != "" {
			c.KVPort, c.ReplayPort = 0, base
		}
		var f *vllmsim.Fleet
		if f, err = vllmsim.NewFleet(c); err == nil {
			testrun.Start(t, "vllmsim", f.Run)
			return f
		}
	}
	t.Fatalf("vllmsim: no free ports: %v", err)
	return nil
}

// freeTCPPort returns a loopback port nothing listens on right now.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// specOf is the replica spec of a simulated replica, as an operator would
// write it.
func specOf(r *vllmsim.Replica) fleet.ReplicaSpec {
	in := r.Info()
	return fleet.ReplicaSpec{Name: in.Name, URL: in.URL, Model: in.Model, KVEndpoint: in.KVEndpoint, ReplayEndpoint: in.ReplayEndpoint}
}

// engineConfig is a gateway configuration over specs with fast health
// checks and debug headers, routing by policy. It tokenizes unseen
// prompts: these tests cache prompts on engines directly (and through
// other gateways), which no gateway's record of what it sent knows.
func engineConfig(policy string, specs ...fleet.ReplicaSpec) Config {
	c := fleetConfig(&vllmsim.Fleet{})
	c.Replicas = specs
	c.Routing.Policy = policy
	c.Debug = true
	c.Server.PreStop = time.Millisecond // nothing to drain for at the end of a test
	return c
}

// userPrompt is a one-message chat of n words, one simulator token each.
func userPrompt(tag string, n int) []msg { return []msg{{"user", words(tag, n)}} }

// simTokens tokenizes a chat as the simulator's engines do.
func simTokens(msgs []msg) []uint32 {
	vm := make([]vllmsim.Message, len(msgs))
	for i, m := range msgs {
		vm[i] = vllmsim.Message{Role: m.Role, Content: m.Content}
	}
	return vllmsim.TokenizeChat(vm, nil, true)
}

// indexHit is what the gateway's index holds of msgs for replica.
func (g *testGateway) indexHit(replica string, msgs []msg) blockindex.Hit {
	keys := g.router.Index().Keys(simTokens(msgs), "qwen3-32b", "")
	return g.router.Index().Blocks().Match(keys, []string{replica}, nil)[0]
}

// indexDepth is how many leading blocks of msgs the gateway's index holds
// for replica.
func (g *testGateway) indexDepth(replica string, msgs []msg) int {
	return g.indexHit(replica, msgs).Blocks
}

// waitIndexed waits until the gateway's index holds all of msgs' full
// blocks for replica, as KV events told it: entries the gateway added
// when it routed msgs are only speculative, and a subscriber joining
// clears them.
func (g *testGateway) waitIndexed(t *testing.T, replica string, msgs []msg) {
	t.Helper()
	want := len(simTokens(msgs)) / g.cfg.Routing.BlockSize
	testrun.Eventually(t, 10*time.Second, func() bool {
		h := g.indexHit(replica, msgs)
		return h.Blocks == want && h.Speculative == 0
	}, fmt.Sprintf("%d blocks indexed for %s", want, replica))
}

// direct sends a chat straight to an engine (bypassing the gateway), with
// optional header pairs.
func direct(t *testing.T, base string, msgs []msg, header ...string) chatResult {
	t.Helper()
	h := map[string]string{}
	for i := 0; i+1 < len(header); i += 2 {
		h[header[i]] = header[i+1]
	}
	r := chat(t, base, map[string]any{"model": "qwen3-32b", "messages": msgs, "max_tokens": 4, "ignore_eos": true}, h)
	if r.Status != 200 {
		t.Fatalf("direct chat to %s: %d %s", base, r.Status, r.Body)
	}
	return r
}

// warmEngine sends new prompts straight to an engine until the gateway's
// index holds one: the gateway's SUB sockets connect asynchronously, and a
// PUB drops what it publishes before they are up.
func (g *testGateway) warmEngine(t *testing.T, replica, base string, header ...string) {
	t.Helper()
	for i := 0; ; i++ {
		p := userPrompt(fmt.Sprintf("warm%s%dx", strings.NewReplacer(".", "", ":", "").Replace(replica)+strings.Join(header, ""), i), 40)
		direct(t, base, p, header...)
		for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
			if g.indexDepth(replica, p) > 0 {
				return
			}
		}
		if i == 200 {
			t.Fatalf("no KV events of %s reached the gateway's index", replica)
		}
	}
}

// routed sends a chat through the gateway with no session (so routing
// reads the index, not a binding) and returns it.
func routed(t *testing.T, url string, msgs []msg) chatResult {
	t.Helper()
	r := chat(t, url, map[string]any{"model": "qwen3-32b", "messages": msgs, "max_tokens": 4}, nil)
	if r.Status != 200 {
		t.Fatalf("chat through the gateway: %d %s", r.Status, r.Body)
	}
	return r
}

func predictedCached(t *testing.T, r chatResult) int {
	t.Helper()
	n, err := strconv.Atoi(r.Header.Get("X-Warmpath-Predicted-Cached"))
	if err != nil {
		t.Fatalf("X-Warmpath-Predicted-Cached: %v", err)
	}
	return n
}

// TestDataParallelEngineBehindGateway runs an engine with two
// data-parallel ranks (data_parallel_size: 2) beside a one-rank engine:
// the gateway follows both ranks, rank 1 joining and restarting leaves
// rank 0's blocks indexed, and prompts cached on either rank route to the
// engine with their cached tokens predicted, as one target.
func TestDataParallelEngineBehindGateway(t *testing.T) {
	dp := startSimPorts(t, vllmsim.Config{DataParallelSize: 2})
	single := startSim(t, vllmsim.Config{})
	spec := specOf(dp.Replicas()[0])
	spec.DataParallelSize = 2
	g := startGateway(t, engineConfig(scoring.PolicyPrecisePrefix, spec, specOf(single.Replicas()[0])), nil)
	name, url := spec.Name, spec.URL
	rank := func(r int) []string { return []string{"X-data-parallel-rank", strconv.Itoa(r)} }

	g.warmEngine(t, name, url, rank(0)...)
	p0 := userPrompt("dpzero", 300)
	direct(t, url, p0, rank(0)...)
	g.waitIndexed(t, name, p0)
	n0 := g.indexDepth(name, p0)

	// Rank 1's first batches make its subscriber join (and clear rank 1).
	g.warmEngine(t, name, url, rank(1)...)
	p1 := userPrompt("dpone", 250)
	direct(t, url, p1, rank(1)...)
	g.waitIndexed(t, name, p1)
	if d := g.indexDepth(name, p0); d != n0 {
		t.Fatalf("rank 1 joining left rank 0's prompt at depth %d of %d", d, n0)
	}

	// Rank 1 restarts: its stream starts again from 0, and its subscriber
	// drops rank 1's blocks only.
	dp.Replicas()[0].RestartRank(1)
	p1b := userPrompt("dponeagain", 200)
	testrun.Eventually(t, 10*time.Second, func() bool {
		direct(t, url, p1b, rank(1)...)
		return g.indexDepth(name, p1) == 0 && g.indexDepth(name, p1b) > 0
	}, "rank 1's restart seen")
	g.waitIndexed(t, name, p1b)
	if d := g.indexDepth(name, p0); d != n0 {
		t.Fatalf("rank 1 restarting left rank 0's prompt at depth %d of %d", d, n0)
	}
	if n := counter(t, g.obs.reg, "warmpath_kvevents_restarts_total", map[string]string{"replica": name}); n != 1 {
		t.Errorf("restarts_total{replica=%s} = %v; want 1", name, n)
	}

	// Both ranks' prefixes attract their continuations to the engine.
	for _, p := range [][]msg{p0, p1b} {
		next := append(append([]msg{}, p...), msg{"user", "and then?"})
		r := routed(t, g.URL, next)
		if r.replica() != name || predictedCached(t, r) < len(simTokens(p))/16*16-16 {
			t.Errorf("continuation of a %d-token prompt: routed to %s predicting %s cached; want %s and about %d",
				len(simTokens(p)), r.replica(), r.Header.Get("X-Warmpath-Predicted-Cached"), name, len(simTokens(p)))
		}
	}
}

// startRelay runs an in-process kv-relay bound on free ports for ranks
// data-parallel ranks, and returns it.
func startRelay(t *testing.T, ranks int) *kvevents.Relay {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	var relay *kvevents.Relay
	for i := range 50 {
		base := 20000 + (i*7919+int(time.Now().UnixNano()%997))%40000
		relay, err = kvevents.NewRelay(zctx, kvevents.RelayConfig{Bind: "tcp://127.0.0.1:" + strconv.Itoa(base), Ranks: ranks,
			Publish: "tcp://127.0.0.1:*", Metrics: kvevents.NewRelayMetrics(nil)})
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("kv-relay: %v", err)
	}
	stop := testrun.Start(t, "kv-relay", relay.Run)
	t.Cleanup(func() { stop(); _ = zctx.Term() }) // runs before testrun's own cleanup
	return relay
}

// TestTwoGatewaysOneRelay runs three engines whose KV-event PUB sockets
// connect (llm-d-inference-sim's way) to one kv-relay, and two gateways
// sharing Redis whose central subscribers connect to the relay: both
// gateways index every engine's blocks identically and route the same
// prompts to the same engines with the same predictions.
func TestTwoGatewaysOneRelay(t *testing.T) {
	relay := startRelay(t, 1)
	f := startSimPorts(t, vllmsim.Config{Replicas: 3, KVConnect: relay.Endpoints()[0]})
	var specs []fleet.ReplicaSpec
	for _, r := range f.Replicas() {
		s := specOf(r)
		s.KVEndpoint = "" // the engine connects; the gateway has nothing to dial
		specs = append(specs, s)
	}
	cfg := engineConfig(scoring.PolicyPrecisePrefix, specs...)
	cfg.KVEvents = KVEventsConfig{Topology: TopologyCentral, Connect: relay.PublishEndpoint()}
	rdb := redisFor(t, &cfg)
	gws := []*testGateway{startGateway(t, cfg, rdb), startGateway(t, cfg, rdb)}
	for _, r := range f.Replicas() {
		for _, g := range gws {
			g.warmEngine(t, r.Info().Name, r.Info().URL)
		}
	}

	var prompts [][]msg
	var homes []string
	for i, r := range f.Replicas() {
		for k := range 2 {
			p := userPrompt(fmt.Sprintf("relay%dk%d", i, k), 150+50*k)
			direct(t, r.Info().URL, p)
			prompts, homes = append(prompts, p), append(homes, r.Info().Name)
		}
	}
	for _, g := range gws {
		for i, p := range prompts {
			g.waitIndexed(t, homes[i], p)
		}
	}
	s0, s1 := gws[0].router.Index().Blocks().Stats(), gws[1].router.Index().Blocks().Stats()
	for _, s := range specs {
		if a, b := s0.Replicas[s.Name], s1.Replicas[s.Name]; a.Entries == 0 || a.Entries != b.Entries || a.EngineBlocks != b.EngineBlocks {
			t.Errorf("replica %s: gateway 0 indexes %+v, gateway 1 %+v", s.Name, a, b)
		}
	}
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	for i, p := range prompts {
		next := append(append([]msg{}, p...), msg{"user", "go on"})
		tokens := simTokens(next)
		var predicted [2][]int
		for k, g := range gws {
			predicted[k] = g.router.Index().MatchTokens(g.router.Index().Keys(tokens, "qwen3-32b", ""), names, len(tokens), make([]int, len(names)))
		}
		if fmt.Sprint(predicted[0]) != fmt.Sprint(predicted[1]) {
			t.Errorf("prompt %d: gateway 0 predicts %v cached tokens on %v, gateway 1 %v", i, predicted[0], names, predicted[1])
		}
		// Each routes the continuation to the prompt's engine, whichever
		// goes first (the first one's request caches more of it).
		for _, k := range []int{i % 2, 1 - i%2} {
			if r := routed(t, gws[k].URL, next); r.replica() != homes[i] || predictedCached(t, r) == 0 {
				t.Errorf("prompt %d through gateway %d went to %s predicting %s cached; its prefix is on %s",
					i, k, r.replica(), r.Header.Get("X-Warmpath-Predicted-Cached"), homes[i])
			}
		}
	}
	for k, g := range gws {
		if n := counter(t, g.obs.reg, "warmpath_kvevents_unknown_replica_batches_total", nil); n != 0 {
			t.Errorf("gateway %d dropped %v batches of unknown replicas", k, n)
		}
	}
}

// logCapture is a slog.Handler that keeps warnings' messages and
// attributes.
type logCapture struct {
	mu    sync.Mutex
	lines []string
}

func (l *logCapture) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *logCapture) Handle(_ context.Context, r slog.Record) error {
	s := r.Message
	r.Attrs(func(a slog.Attr) bool { s += " " + a.String(); return true })
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
	return nil
}
func (l *logCapture) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCapture) WithGroup(string) slog.Handler      { return l }

func (l *logCapture) matching(sub string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			out = append(out, s)
		}
	}
	return out
}

// TestKVTopicNamesTheEngine runs the central topology with two engines
// that name themselves by IP address in their topics: the fleet knows the
// first by a DNS name (URL localhost, name engine-a) and matches it
// through kv_topic; the second is not in the fleet, and its batches are
// counted by topic and warned about once, with a hint.
func TestKVTopicNamesTheEngine(t *testing.T) {
	port := freeTCPPort(t)
	f := startSimPorts(t, vllmsim.Config{Replicas: 2, KVConnect: "tcp://127.0.0.1:" + strconv.Itoa(port)})
	a, b := f.Replicas()[0].Info(), f.Replicas()[1].Info()
	_, httpPort, _ := net.SplitHostPort(a.Name)
	spec := fleet.ReplicaSpec{Name: "engine-a", URL: "http://localhost:" + httpPort, Model: a.Model, ReplayEndpoint: a.ReplayEndpoint, KVTopic: a.Topic}
	cfg := engineConfig(scoring.PolicyPrecisePrefix, spec)
	cfg.KVEvents = KVEventsConfig{Topology: TopologyCentral, Bind: "tcp://127.0.0.1:" + strconv.Itoa(port)}
	g, logs := startLoggedGateway(t, cfg) // engine-a is the fleet

	g.warmEngine(t, "engine-a", a.URL)
	p := userPrompt("topic", 200)
	direct(t, a.URL, p)
	g.waitIndexed(t, "engine-a", p)
	if st := g.router.Index().Blocks().Stats(); len(st.Replicas) != 1 {
		t.Errorf("index holds replicas %v; want engine-a only", st.Replicas)
	}
	if r := routed(t, g.URL, append(append([]msg{}, p...), msg{"user", "more"})); predictedCached(t, r) == 0 {
		t.Error("the engine named through kv_topic attracts no prefix hit")
	}

	unknown := func() float64 {
		return counter(t, g.obs.reg, "warmpath_kvevents_unknown_replica_batches_total", map[string]string{"topic": b.Topic})
	}
	for i := 0; unknown() < 3; i++ {
		if i == 1000 {
			t.Fatal("no batch of the engine outside the fleet was counted")
		}
		direct(t, b.URL, userPrompt("stray"+strconv.Itoa(i), 40))
	}
	warned := logs.matching("not in the fleet")
	if len(warned) != 1 || !strings.Contains(warned[0], "kv_topic") {
		t.Errorf("warnings about the unknown engine: %q; want one with a kv_topic hint", warned)
	}
	if _, ok := g.router.Index().Blocks().Stats().Replicas[b.Name]; ok {
		t.Errorf("the index holds %s, which is not in the fleet", b.Name)
	}
}

// TestEngineNumberingFromOne follows an engine that numbers its KV-event
// batches from 1 (llm-d-inference-sim) through a start and a restart: no
// replay counts as failed or incomplete and no batch as a duplicate.
func TestEngineNumberingFromOne(t *testing.T) {
	f := startSim(t, vllmsim.Config{FirstSeq: 1})
	spec := specOf(f.Replicas()[0])
	g := startGateway(t, engineConfig(scoring.PolicyPrecisePrefix, spec), nil)
	g.warmEngine(t, spec.Name, spec.URL)
	p := userPrompt("fromone", 200)
	direct(t, spec.URL, p)
	g.waitIndexed(t, spec.Name, p)
	f.Replicas()[0].Restart()
	q := userPrompt("fromoneagain", 150)
	testrun.Eventually(t, 10*time.Second, func() bool {
		direct(t, spec.URL, q)
		return g.indexDepth(spec.Name, p) == 0 && g.indexDepth(spec.Name, q) > 0
	}, "the restart seen")
	for _, res := range []string{kvevents.ReplayFailed, kvevents.ReplayIncomplete} {
		if n := counter(t, g.obs.reg, "warmpath_kvevents_replays_total", map[string]string{"result": res}); n != 0 {
			t.Errorf("replays_total{result=%s} = %v; want 0", res, n)
		}
	}
	if n := counter(t, g.obs.reg, "warmpath_kvevents_duplicates_total", nil); n != 0 {
		t.Errorf("duplicates_total = %v; want 0", n)
	}
}

// TestEnginesWithoutTokenize runs engines behind proxies that hide
// /tokenize (404): each is asked once and then backed off (no /tokenize
// storm), the backoff is logged once per replica and shown in /metrics,
// and the prompt-length estimate learns the bytes-per-token ratio from
// usage, converging to within 5% of the engines' count. With a tokenizer
// service (routing.tokenize_url), it is asked instead, and routing gets
// its prefix information back.
func TestEnginesWithoutTokenize(t *testing.T) {
	f := startSim(t, vllmsim.Config{Replicas: 2, NoTokenize: true})
	var specs []fleet.ReplicaSpec
	var proxies []*tokenizeProxy
	for _, r := range f.Replicas() {
		p := newTokenizeProxy(t, r.Info().URL)
		s := specOf(r)
		s.Name, s.URL = r.Info().Name, p.URL // named as its topic names it
		specs, proxies = append(specs, s), append(proxies, p)
	}
	g, logs := startLoggedGateway(t, engineConfig(scoring.PolicyPrecisePrefix, specs...))

	var first, last float64 // relative error of the estimate
	for i := range 40 {
		r := routed(t, g.URL, userPrompt(fmt.Sprintf("est%02dw", i), 180+i%5*10))
		est, _ := strconv.Atoi(r.Header.Get("X-Warmpath-Prompt-Tokens"))
		e := float64(est-r.Usage.PromptTokens) / float64(r.Usage.PromptTokens)
		if i == 0 {
			first = e
		}
		last = e
	}
	var asked int64
	for _, p := range proxies {
		asked += p.tokenize.Load()
	}
	if asked > int64(len(proxies)) {
		t.Errorf("%d /tokenize calls for 40 requests to %d engines without one; want one each", asked, len(proxies))
	}
	for _, s := range specs {
		if v := counter(t, g.obs.reg, "warmpath_tokenizer_backoff", map[string]string{"replica": s.Name}); v != 1 {
			t.Errorf("warmpath_tokenizer_backoff{replica=%s} = %v; want 1", s.Name, v)
		}
	}
	if n := len(logs.matching("tokenizer: no usable /tokenize; not asking")); n != len(specs) {
		t.Errorf("%d backoff warnings; want one per replica", n)
	}
	if n := len(logs.matching("tokenize failed")); n > 1 {
		t.Errorf("%d \"tokenize failed\" warnings; want at most the one before the backoff", n)
	}
	t.Logf("prompt-length estimate: %+.1f%% off at first, %+.1f%% after 40 answers", 100*first, 100*last)
	if first < 0.3 || last > 0.05 || last < -0.05 {
		t.Errorf("estimate off by %+.1f%% at first, %+.1f%% after 40 answers; want the fixed ÷4 off by 30%% or more, then within 5%%", 100*first, 100*last)
	}

	// A tokenizer service: an engine that is not a routing target.
	svc := newTokenizeProxy(t, startSim(t, vllmsim.Config{}).Replicas()[0].Info().URL)
	cfg := engineConfig(scoring.PolicyPrecisePrefix, specs...)
	cfg.Routing.TokenizeURL = svc.URL
	g2 := startGateway(t, cfg, nil)
	for i, s := range specs {
		g2.warmEngine(t, s.Name, f.Replicas()[i].Info().URL)
	}
	p := userPrompt("viaservice", 200)
	home := routed(t, g2.URL, p).replica()
	g2.waitIndexed(t, home, p)
	before := proxies[0].tokenize.Load() + proxies[1].tokenize.Load()
	r := routed(t, g2.URL, append(append([]msg{}, p...), msg{"user", "next"}))
	if r.replica() != home || predictedCached(t, r) == 0 {
		t.Errorf("continuation went to %s predicting %s cached; want %s with a prefix hit", r.replica(), r.Header.Get("X-Warmpath-Predicted-Cached"), home)
	}
	if n := svc.tokenize.Load(); n < 2 {
		t.Errorf("the tokenizer service was asked %d times; want every prompt", n)
	}
	if n := proxies[0].tokenize.Load() + proxies[1].tokenize.Load() - before; n != 0 {
		t.Errorf("replicas asked %d more times with the service answering", n)
	}
}

// TestPredictionsRespectTheEngine runs multi-turn conversations through
// the warmpath policy (sticky turns predict their cached tokens without
// tokenizing) against engines that differ from vLLM's defaults: 64-token
// blocks (llm-d's guides) and prompt blocks only (llm-d-inference-sim),
// and a default engine. No turn is routed on a hit the engine does not
// have, and on the default engine the output the events showed cached is
// predicted.
func TestPredictionsRespectTheEngine(t *testing.T) {
	for _, tt := range []struct {
		name      string
		blockSize int
		prompts   bool // prompt blocks only
	}{
		{"block size 64", 64, false},
		{"prompt blocks only", 16, true},
		{"vllm defaults", 16, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := startSim(t, vllmsim.Config{Replicas: 2, BlockSize: tt.blockSize, PromptBlocksOnly: tt.prompts})
			var specs []fleet.ReplicaSpec
			for _, r := range f.Replicas() {
				specs = append(specs, specOf(r))
			}
			cfg := engineConfig(scoring.PolicyWarmpath, specs...)
			g := startGateway(t, cfg, redisFor(t, &cfg))
			testrun.Eventually(t, 10*time.Second, func() bool {
				for _, r := range g.fleet.Snapshot().Replicas {
					if r.State().BlockSize != tt.blockSize {
						return false
					}
				}
				return true
			}, "the engines' block size scraped")
			var sticky, predicted, cached int
			for c := range 4 {
				conv := []msg{{"system", words(fmt.Sprintf("sys%d", c), 90)}, {"user", words(fmt.Sprintf("ask%d", c), 30+c)}}
				for turn := range 5 {
					r := chat(t, g.URL, map[string]any{"model": "qwen3-32b", "messages": conv, "max_tokens": 60, "ignore_eos": true}, nil)
					if r.Status != 200 {
						t.Fatalf("conversation %d turn %d: %d %s", c, turn, r.Status, r.Body)
					}
					if r.Header.Get("X-Warmpath-Reason") == scoring.ReasonSticky {
						sticky++
						predicted += predictedCached(t, r)
						cached += r.Usage.CachedTokens
					}
					conv = append(conv, msg{"assistant", r.Content}, msg{"user", words(fmt.Sprintf("more%d%d", c, turn), 7+turn)})
				}
			}
			if n := counter(t, g.obs.reg, "warmpath_mispredicted_hits_total", nil); n != 0 {
				t.Errorf("warmpath_mispredicted_hits_total = %v; want 0", n)
			}
			if sticky < 12 || predicted == 0 {
				t.Fatalf("%d sticky turns predicting %d tokens; the test needs sticky predictions", sticky, predicted)
			}
			t.Logf("%d sticky turns: predicted %d cached tokens, the engines reported %d", sticky, predicted, cached)
			if tt.blockSize == 16 && !tt.prompts && float64(predicted) < 0.95*float64(cached) {
				t.Errorf("default engine: predicted %d of %d cached tokens; want the cached output predicted too", predicted, cached)
			}
		})
	}
}

// A warmpath sticky turn whose replica moved the conversation's tip from
// GPU to its CPU tier is scored with its prefix known rather than priced
// as a GPU hit: it stays (loading costs less than computing anywhere
// else), and predicts what the engine reports, loads included.
func TestCPUTierStickyTurnScored(t *testing.T) {
	f := startSim(t, vllmsim.Config{Replicas: 2, KVBlocks: 64, CPUBlocks: 400})
	var specs []fleet.ReplicaSpec
	for _, r := range f.Replicas() {
		specs = append(specs, specOf(r))
	}
	g := startGateway(t, engineConfig(scoring.PolicyWarmpath, specs...), nil)
	urls := map[string]string{}
	for _, s := range specs {
		urls[s.Name] = s.URL
		testrun.Eventually(t, 10*time.Second, func() bool { return g.fleet.Replica(s.Name).State().NumCPUBlocks == 400 }, "num_cpu_blocks scraped")
		g.warmEngine(t, s.Name, s.URL)
	}
	c := newConversation(words("cpusys", 300), "first question")
	first := c.turn(t, g.URL, "second question")
	home := first.replica()
	g.waitIndexed(t, home, c.messages[:2])
	r := c.turn(t, g.URL, "third question")
	if r.replica() != home || r.Header.Get("X-Warmpath-Reason") != scoring.ReasonSticky {
		t.Fatalf("turn 2 on %s (%s); want sticky on %s", r.replica(), r.Header.Get("X-Warmpath-Reason"), home)
	}
	g.waitIndexed(t, home, c.messages[:4])
	for i := range 3 { // push the conversation out of the 64-block GPU cache
		p := userPrompt(fmt.Sprintf("cpusticky%d", i), 350+10*i)
		direct(t, urls[home], p)
		g.waitIndexed(t, home, p)
	}
	if h := g.indexHit(home, c.messages[:4]); h.CPU == 0 || h.Blocks*16 >= len(simTokens(c.messages[:4]))-16 {
		t.Fatalf("conversation: index %+v; want it evicted on GPU and held on CPU", h)
	}
	r = c.turn(t, g.URL, "fourth question")
	if r.replica() != home || r.Header.Get("X-Warmpath-Reason") != scoring.ReasonScored || r.Header.Get("X-Warmpath-Rebind") != "" {
		t.Fatalf("turn 3 on %s (reason %q, rebind %q, scores %s); want scored on %s, not rebound", r.replica(),
			r.Header.Get("X-Warmpath-Reason"), r.Header.Get("X-Warmpath-Rebind"), r.Header.Get("X-Warmpath-Scores"), home)
	}
	if got, want := r.Usage.CachedTokens, predictedCached(t, r); got != want || got == 0 {
		t.Errorf("engine reported %d cached tokens (GPU and CPU); the gateway predicted %d", got, want)
	}
}

// TestCPUTierRouting runs engines with a small GPU cache and a CPU offload
// tier that reports no removals (LMCache): a prompt evicted on GPU but
// held on CPU still draws its continuation, predicted as the engine
// reports it (GPU and CPU hits together); the index's CPU tier is sized
// from cache_config_info's num_cpu_blocks, so it forgets what the engine
// evicted without telling; and /metrics shows the tiers.
func TestCPUTierRouting(t *testing.T) {
	const cpuBlocks = 100
	f := startSim(t, vllmsim.Config{Replicas: 2, KVBlocks: 64, CPUBlocks: cpuBlocks, CPUStoreOnly: true})
	var specs []fleet.ReplicaSpec
	for _, r := range f.Replicas() {
		specs = append(specs, specOf(r))
	}
	g := startGateway(t, engineConfig(scoring.PolicyPrecisePrefix, specs...), nil)
	home, homeURL := specs[0].Name, specs[0].URL
	testrun.Eventually(t, 10*time.Second, func() bool { return g.fleet.Replica(home).State().NumCPUBlocks == cpuBlocks }, "num_cpu_blocks scraped")
	g.warmEngine(t, home, homeURL)

	a := userPrompt("cpua", 300)
	direct(t, homeURL, a)
	g.waitIndexed(t, home, a)
	for i := range 3 { // push a out of the 64-block GPU cache
		p := userPrompt(fmt.Sprintf("cpupush%d", i), 350+10*i)
		direct(t, homeURL, p)
		g.waitIndexed(t, home, p)
	}
	keys := g.router.Index().Keys(simTokens(a), "qwen3-32b", "")
	if h := g.router.Index().Blocks().Match(keys, []string{home}, nil)[0]; h.CPU == 0 || h.Blocks*16 >= len(simTokens(a))-16 {
		t.Fatalf("prompt a: index %+v; want it evicted on GPU and held on CPU", h)
	}
	next := append(append([]msg{}, a...), msg{"user", "continue"})
	r := routed(t, g.URL, next)
	if r.replica() != home {
		t.Fatalf("continuation of a CPU-held prompt went to %s; want %s", r.replica(), home)
	}
	if got, want := r.Usage.CachedTokens, predictedCached(t, r); got != want || got == 0 {
		t.Errorf("engine reported %d cached tokens (GPU and CPU); the gateway predicted %d", got, want)
	}

	for i := range 8 { // more than the CPU tier holds: the engine evicts silently
		direct(t, homeURL, userPrompt(fmt.Sprintf("cpumore%d", i), 300))
	}
	testrun.Eventually(t, 10*time.Second, func() bool {
		return g.router.Index().Blocks().Stats().Replicas[home].CPUEntries == int64(f.Replicas()[0].Stats().CPUBlocksUsed)
	}, "the index's CPU tier bounded as the engine's")
	if n := counter(t, g.obs.reg, "warmpath_index_stored_blocks_total", map[string]string{"tier": "CPU"}); n == 0 {
		t.Error("warmpath_index_stored_blocks_total{tier=CPU} = 0")
	}
	if n := counter(t, g.obs.reg, "warmpath_index_cpu_entries", map[string]string{"replica": home}); n == 0 {
		t.Error("warmpath_index_cpu_entries = 0")
	}
	if n := counter(t, g.obs.reg, "warmpath_index_cpu_evictions_total", nil); n == 0 {
		t.Error("warmpath_index_cpu_evictions_total = 0 with a store-only tier past its size")
	}
	if n := counter(t, g.obs.reg, "warmpath_mispredicted_hits_total", nil); n != 0 {
		t.Errorf("warmpath_mispredicted_hits_total = %v; want 0", n)
	}
}
