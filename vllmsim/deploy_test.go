package vllmsim

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/kvevents"
	"github.com/warmpath/warmpath/scoring/blockindex"
)

// These tests run the deployment shapes of issue 13 end to end: a
// simulated fleet publishing KV events exactly as the engine option under
// test does, and the gateway's side of the stream (real kvevents
// subscribers over real sockets, feeding a real blockindex).

// gatewaySide is the KV-event half of a gateway: one index, the
// subscribers that feed it, their metrics and their logs.
type gatewaySide struct {
	t    *testing.T
	ix   *blockindex.Index
	reg  *prometheus.Registry
	m    *kvevents.Metrics
	logs *logSink
	zctx *zmq.Context
}

func newGatewaySide(t *testing.T, f *Fleet, cfg blockindex.Config) *gatewaySide {
	t.Helper()
	ix, err := blockindex.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range f.Replicas() {
		if err := ix.SetReplicaModel(r.Info().Name, r.Info().Model); err != nil {
			t.Fatal(err)
		}
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-registered first: every Run started later has
	// returned before the context is terminated.
	t.Cleanup(func() { _ = zctx.Term() })
	reg := prometheus.NewRegistry()
	return &gatewaySide{t: t, ix: ix, reg: reg, m: kvevents.NewMetrics(reg), logs: &logSink{}, zctx: zctx}
}

// run starts fn until the returned stop is called or the test ends.
func (g *gatewaySide) run(name string, fn func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					g.t.Errorf("%s: Run returned %v; want context.Canceled", name, err)
				}
			case <-time.After(10 * time.Second):
				g.t.Errorf("%s: Run did not return after cancel", name)
			}
		})
	}
	g.t.Cleanup(stop)
	return stop
}

// subscribe follows one KV source (a replica's rank) in the per-replica
// topology.
func (g *gatewaySide) subscribe(replica string, src RankInfo, opts ...func(*kvevents.SubscriberConfig)) (stop func()) {
	g.t.Helper()
	cfg := kvevents.SubscriberConfig{
		Replica: replica, Endpoint: src.KVEndpoint, ReplayEndpoint: src.ReplayEndpoint,
		Handler: g.ix, Metrics: g.m, Logger: slog.New(g.logs), ReplayIdleTimeout: 5 * time.Second,
	}
	for _, o := range opts {
		o(&cfg)
	}
	s, err := kvevents.NewSubscriber(g.zctx, cfg)
	if err != nil {
		g.t.Fatal(err)
	}
	return g.run("subscriber "+replica+"/"+strconv.Itoa(src.Rank), s.Run)
}

// warmPrompts numbers warm's prompts across the package's tests, so that
// no two are alike, whichever gateway side or engine sends them.
var warmPrompts atomic.Int64

// warm sends small chats to base (with header, e.g. pinning a rank) until
// one of them is indexed for replica: a subscriber joins on its first live
// message, and the PUB drops messages until the SUB's connection is up.
// Each chat is new from its first token on, so only a subscriber running
// when it was sent can have indexed it: a resent prompt (or one sharing
// block 0 with an earlier one) is an engine cache hit that publishes
// nothing, and blocks an earlier subscriber left in the index prove
// nothing about the one just started.
func (g *gatewaySide) warm(replica, base string, header ...string) {
	g.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		msgs := prompt("warm"+strconv.FormatInt(warmPrompts.Add(1), 10)+"x", 150) // two 64-token blocks
		send(g.t, base, msgs, header...)
		for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
			if g.hit(replica, msgs).Blocks > 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("no KV events of %s reached the index", base)
		}
	}
}

// keys returns the index keys of a chat prompt.
func (g *gatewaySide) keys(msgs []Message) []uint64 {
	return g.ix.Keys(TokenizeChat(msgs, nil, true), blockindex.Root{Model: DefaultModel})
}

// hit returns what the index holds of a chat prompt on replica.
func (g *gatewaySide) hit(replica string, msgs []Message) blockindex.Hit {
	return g.ix.Match(g.keys(msgs), []string{replica}, nil)[0]
}

// waitDepth waits until replica holds want leading blocks of msgs on GPU.
func (g *gatewaySide) waitDepth(what, replica string, msgs []Message, want int) {
	g.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		h := g.hit(replica, msgs)
		if h.Blocks == want {
			return
		}
		if time.Now().After(deadline) {
			g.logs.mu.Lock()
			logs := strings.Join(g.logs.msgs, "; ")
			g.logs.mu.Unlock()
			g.t.Fatalf("timed out waiting for %s: depth %d, want %d; index %+v; logs: %s", what, h.Blocks, want, g.ix.Stats().Replicas, logs)
		}
		time.Sleep(time.Millisecond)
	}
}

func (g *gatewaySide) metric(name string, labels map[string]string) float64 {
	g.t.Helper()
	mfs, err := g.reg.Gather()
	if err != nil {
		g.t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				ok := false
				for _, lp := range m.GetLabel() {
					ok = ok || lp.GetName() == k && lp.GetValue() == v
				}
				if !ok {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// noReplayTrouble fails the test if a replay failed or came back
// incomplete, a batch was counted twice, or the replica was forgotten for
// a replay loss.
func (g *gatewaySide) noReplayTrouble() {
	g.t.Helper()
	for _, result := range []string{kvevents.ReplayIncomplete, kvevents.ReplayFailed} {
		if n := g.metric("warmpath_kvevents_replays_total", map[string]string{"result": result}); n != 0 {
			g.t.Errorf("replays_total{result=%s} = %v; want 0", result, n)
		}
	}
	if n := g.metric("warmpath_kvevents_duplicates_total", nil); n != 0 {
		g.t.Errorf("duplicates_total = %v; want 0", n)
	}
	if n := g.metric("warmpath_kvevents_clears_total", map[string]string{"reason": kvevents.ClearReplayLoss}); n != 0 {
		g.t.Errorf("clears_total{reason=replay_loss} = %v; want 0", n)
	}
	if n := g.logs.count("replay incomplete"); n != 0 {
		g.t.Errorf("%d \"replay incomplete\" log lines; want 0", n)
	}
}

// logSink is a slog.Handler that keeps every record's message.
type logSink struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logSink) Enabled(context.Context, slog.Level) bool { return true }

func (l *logSink) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.mu.Unlock()
	return nil
}

func (l *logSink) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logSink) WithGroup(string) slog.Handler      { return l }

func (l *logSink) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

// prompt returns a one-message chat of n words tagged by tag.
func prompt(tag string, n int) []Message {
	return []Message{{Role: "user", Content: longText(tag, n)}}
}

// send runs a chat on base (optionally pinned to a rank) and returns its
// usage and response.
func send(t *testing.T, base string, msgs []Message, header ...string) (usageResp, response) {
	t.Helper()
	return chat(t, base, map[string]any{"messages": msgs, "max_tokens": 4, "ignore_eos": true}, header...)
}

// fullBlocks is the number of full 16-token blocks of a chat prompt: what
// the engine stores once it computed it.
func fullBlocks(msgs []Message) int { return len(TokenizeChat(msgs, nil, true)) / 16 }

// TestDeployFirstSeqFromOne follows an engine that numbers its batches
// from 1 (llm-d-inference-sim) from its start and across a restart: no
// failed or incomplete replay, no duplicate, no "replay incomplete", and
// the index predicts the cached tokens the engine reports.
func TestDeployFirstSeqFromOne(t *testing.T) {
	f := startFleet(t, Config{FirstSeq: 1})
	rep := f.Replicas()[0]
	in := rep.Info()
	g := newGatewaySide(t, f, blockindex.Config{})
	g.subscribe(in.Name, in.Ranks[0])
	g.warm(in.Name, in.URL)

	a := prompt("first-a", 200)
	send(t, in.URL, a)
	g.waitDepth("prompt a indexed", in.Name, a, fullBlocks(a))
	u, _ := send(t, in.URL, a)
	limit := (u.Usage.PromptTokens - 1) / 16
	if got, want := *u.Usage.PromptTokensDetails.CachedTokens, min(g.hit(in.Name, a).Blocks, limit)*16; got != want {
		t.Errorf("engine cached %d tokens; the index predicts %d", got, want)
	}

	rep.Restart()
	b := prompt("first-b", 150)
	send(t, in.URL, b)
	g.waitDepth("prompt b indexed after the restart", in.Name, b, fullBlocks(b))
	if d := g.hit(in.Name, a).Blocks; d != 0 {
		t.Errorf("prompt a still indexed at depth %d after the engine restarted", d)
	}
	if n := g.metric("warmpath_kvevents_restarts_total", nil); n != 1 {
		t.Errorf("restarts_total = %v; want 1", n)
	}
	g.noReplayTrouble()
}

// deafRouter binds a replay ROUTER that never answers, closed when the
// test ends.
func (g *gatewaySide) deafRouter() string {
	g.t.Helper()
	sock, err := g.zctx.NewSocket(zmq.ROUTER)
	if err != nil {
		g.t.Fatal(err)
	}
	_ = sock.SetLinger(0)
	if err := sock.Bind("tcp://127.0.0.1:*"); err != nil {
		g.t.Fatal(err)
	}
	ep, err := sock.GetLastEndpoint()
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { _ = sock.Close() })
	return ep
}

// TestDeployDataParallel runs an engine with two data-parallel ranks,
// each followed by its own subscriber, as the gateway subscribes to rank r
// at the replica's ports + r: rank 1's subscriber joining, restarting, and
// failing a replay must leave rank 0's blocks in the index; lookups score
// both ranks' blocks for the replica; a batch lost on one rank is
// replayed from that rank.
func TestDeployDataParallel(t *testing.T) {
	f := startFleet(t, Config{DataParallelSize: 2})
	in := f.Replicas()[0].Info()
	if len(in.Ranks) != 2 || in.Ranks[1].KVEndpoint == in.Ranks[0].KVEndpoint {
		t.Fatalf("ranks %+v", in.Ranks)
	}
	g := newGatewaySide(t, f, blockindex.Config{})
	rank := func(r int) []string { return []string{"X-data-parallel-rank", strconv.Itoa(r)} }
	g.subscribe(in.Name, in.Ranks[0])
	g.warm(in.Name, in.URL, rank(0)...)
	p0 := prompt("dp-zero", 200)
	if _, r := send(t, in.URL, p0, rank(0)...); r.header.Get("X-Sim-DP-Rank") != "0" {
		t.Fatalf("pinned to rank 0, served by rank %q", r.header.Get("X-Sim-DP-Rank"))
	}
	n0 := fullBlocks(p0)
	g.waitDepth("rank 0's prompt", in.Name, p0, n0)

	// Rank 1's subscriber joins when rank 1 first publishes.
	stop1 := g.subscribe(in.Name, in.Ranks[1])
	g.warm(in.Name, in.URL, rank(1)...)
	p1 := prompt("dp-one", 150)
	send(t, in.URL, p1, rank(1)...)
	n1 := fullBlocks(p1)
	g.waitDepth("rank 1's prompt", in.Name, p1, n1)
	if d := g.hit(in.Name, p0).Blocks; d != n0 {
		t.Fatalf("rank 1's subscriber joining left rank 0's prompt at depth %d of %d", d, n0)
	}

	// Rank 1's subscriber restarts: it joins again and replays rank 1.
	stop1()
	stop1 = g.subscribe(in.Name, in.Ranks[1])
	p1b := prompt("dp-one-again", 120)
	send(t, in.URL, p1b, rank(1)...)
	g.warm(in.Name, in.URL, rank(1)...)
	g.waitDepth("rank 1's next prompt", in.Name, p1b, fullBlocks(p1b))
	g.waitDepth("rank 1's first prompt, replayed", in.Name, p1, n1)
	if d := g.hit(in.Name, p0).Blocks; d != n0 {
		t.Fatalf("rank 1's subscriber restarting left rank 0's prompt at depth %d of %d", d, n0)
	}

	// A batch lost on rank 0's live stream is replayed from rank 0.
	f.Replicas()[0].DropKVEvents(0, 1)
	p0b, p0c := prompt("dp-zero-lost", 100), prompt("dp-zero-after", 100)
	send(t, in.URL, p0b, rank(0)...)
	send(t, in.URL, p0c, rank(0)...)
	g.waitDepth("rank 0's batch after the lost one", in.Name, p0c, fullBlocks(p0c))
	g.waitDepth("rank 0's lost batch, replayed", in.Name, p0b, fullBlocks(p0b))
	g.noReplayTrouble()

	// Rank 1's subscriber comes back with a replay endpoint that never
	// answers: its join replay fails, rank 1 is forgotten, rank 0 is not.
	stop1()
	g.subscribe(in.Name, in.Ranks[1], func(c *kvevents.SubscriberConfig) {
		c.ReplayEndpoint, c.ReplayIdleTimeout = g.deafRouter(), 200*time.Millisecond
	})
	for i := 0; g.hit(in.Name, p1).Blocks != 0; i++ {
		// Until the new subscriber's join replay has failed.
		if i == 1000 {
			t.Fatal("rank 1 not forgotten after its failed replay")
		}
		send(t, in.URL, prompt("dp-one-unreplayed"+strconv.Itoa(i), 20), rank(1)...)
		time.Sleep(10 * time.Millisecond)
	}
	testrun.Eventually(t, 10*time.Second, func() bool {
		return g.metric("warmpath_kvevents_replays_total", map[string]string{"result": kvevents.ReplayFailed}) == 1
	}, "the failed replay")
	if d := g.hit(in.Name, p0).Blocks; d != n0 {
		t.Errorf("rank 1's failed replay left rank 0's prompt at depth %d of %d", d, n0)
	}
	p1d := prompt("dp-one-later", 100) // rank 1 is indexed again from its next batches
	send(t, in.URL, p1d, rank(1)...)
	g.waitDepth("rank 1's later prompt", in.Name, p1d, fullBlocks(p1d))

	st := g.ix.Stats().Replicas[in.Name]
	if st.Ranks != 2 {
		t.Errorf("index saw %d ranks; want 2", st.Ranks)
	}
	for _, rk := range []string{"0", "1"} {
		if n := g.metric("warmpath_kvevents_last_seq", map[string]string{"replica": in.Name, "dp_rank": rk}); n == 0 {
			t.Errorf("last_seq{dp_rank=%s} not set", rk)
		}
	}
}

// TestDeployDataParallelBalancer sends unpinned requests to a
// two-rank engine: vLLM's balancer spreads them, and an out-of-range rank
// is a 400.
func TestDeployDataParallelBalancer(t *testing.T) {
	f := startFleet(t, Config{DataParallelSize: 2, Speed: 1})
	in := f.Replicas()[0].Info()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			chat(t, in.URL, map[string]any{"messages": prompt("lb"+strconv.Itoa(i), 20), "max_tokens": 30, "ignore_eos": true})
		})
	}
	wg.Wait()
	if a, b := f.Replicas()[0].RankStats(0).Requests, f.Replicas()[0].RankStats(1).Requests; a == 0 || b == 0 {
		t.Errorf("4 concurrent requests went %d to rank 0, %d to rank 1; want both used", a, b)
	}
	if st := f.Replicas()[0].Stats(); st.Requests != 4 || st.KVBlocks != 2*DefaultProfile().KVBlocks {
		t.Errorf("replica stats %+v; want 4 requests over two ranks' blocks", st)
	}
	r := post(t, in.URL+"/v1/chat/completions", map[string]any{"messages": prompt("x", 3)}, "X-data-parallel-rank", "2")
	checkError(t, "rank 2 of 2", r, 400, "BadRequestError")
	m := get(t, in.URL+"/metrics")
	for _, want := range []string{`vllm:num_requests_running{engine="1",model_name="qwen3-32b"}`, `vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1"`} {
		if !strings.Contains(string(m.body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// predicted is what the index predicts an engine reports for a prompt:
// the cached tokens (GPU hit and CPU continuation, never the block holding
// the last prompt token) and, of those, the ones loaded from CPU.
func predicted(h blockindex.Hit, promptTokens, blockTokens int) (cached, cpu int) {
	limit := (promptTokens - 1) / blockTokens
	gpu := min(h.Blocks, limit)
	all := min(h.Blocks+h.CPU, limit)
	return all * blockTokens, (all - gpu) * blockTokens
}

// TestDeployCPUOffload runs engines with a CPU offload tier (vLLM's native
// offloading: every cached block is offloaded, CPU BlockStored without
// tokens), small enough on GPU that prompts are evicted there: the index's
// CPU tier predicts exactly what the engine loads back, a CPU hit is
// faster than a prefill and slower than a GPU hit, and with a store-only
// tier (LMCache: no removals) the index's LRU bound keeps it in step.
func TestDeployCPUOffload(t *testing.T) {
	for _, tt := range []struct {
		name      string
		cpuBlocks int
		storeOnly bool
	}{{"native offloading", 512, false}, {"store-only tier", 100, true}} {
		t.Run(tt.name, func(t *testing.T) {
			f := startFleet(t, Config{KVBlocks: 64, CPUBlocks: tt.cpuBlocks, CPUStoreOnly: tt.storeOnly})
			rep := f.Replicas()[0]
			in := rep.Info()
			g := newGatewaySide(t, f, blockindex.Config{})
			if err := g.ix.SetCPUCapacity(in.Name, tt.cpuBlocks); err != nil {
				t.Fatal(err)
			}
			g.subscribe(in.Name, in.Ranks[0])
			g.warm(in.Name, in.URL)

			a := prompt("cpua", 300)
			_, cold := send(t, in.URL, a)
			for i, tag := range []string{"cpub", "cpuc", "cpud"} {
				p := prompt(tag, 350+10*i)
				send(t, in.URL, p)
				g.waitDepth(tag+" indexed", in.Name, p, fullBlocks(p))
			}
			h := g.hit(in.Name, a)
			if h.Blocks >= fullBlocks(a) || h.CPU == 0 {
				t.Fatalf("prompt a: index %+v of %d blocks; want it evicted on GPU and held on CPU", h, fullBlocks(a))
			}
			u, warmCPU := send(t, in.URL, a)
			wantCached, wantCPU := predicted(h, u.Usage.PromptTokens, 16)
			gotCPU, _ := strconv.Atoi(warmCPU.header.Get("X-Sim-CPU-Cached-Tokens"))
			if got := *u.Usage.PromptTokensDetails.CachedTokens; got != wantCached || gotCPU != wantCPU {
				t.Errorf("engine cached %d tokens, %d from CPU; the index (%+v) predicts %d, %d", got, gotCPU, h, wantCached, wantCPU)
			}
			_, warmGPU := send(t, in.URL, a)
			tc, tcpu, tgpu := msHeader(t, cold, "X-Sim-TTFT-Ms"), msHeader(t, warmCPU, "X-Sim-TTFT-Ms"), msHeader(t, warmGPU, "X-Sim-TTFT-Ms")
			if !(tgpu < tcpu && tcpu < tc) {
				t.Errorf("simulated TTFT: GPU hit %.3f ms, CPU hit %.3f ms, cold %.3f ms; want GPU < CPU < cold", tgpu, tcpu, tc)
			}

			// More traffic through the tiers: predictions stay exact.
			for i := range 6 {
				p := prompt("cpumore"+strconv.Itoa(i%3), 250+40*(i%3))
				want := g.hit(in.Name, p)
				u, r := send(t, in.URL, p)
				wantCached, wantCPU := predicted(want, u.Usage.PromptTokens, 16)
				gotCPU, _ := strconv.Atoi(r.header.Get("X-Sim-CPU-Cached-Tokens"))
				if got := *u.Usage.PromptTokensDetails.CachedTokens; got != wantCached || gotCPU != wantCPU {
					t.Errorf("request %d: engine cached %d (%d from CPU); the index (%+v) predicts %d (%d)", i, got, gotCPU, want, wantCached, wantCPU)
				}
				g.waitDepth("request indexed", in.Name, p, fullBlocks(p))
			}
			st, est := g.ix.Stats(), rep.Stats()
			if st.Stored[blockindex.TierCPU] == 0 || est.CPUBlocksUsed == 0 {
				t.Errorf("index stored %d CPU blocks, engine holds %d", st.Stored[blockindex.TierCPU], est.CPUBlocksUsed)
			}
			if tt.storeOnly && (st.Removed[blockindex.TierCPU] != 0 || est.CPUEvictions == 0 || st.CPUEvictions == 0) {
				t.Errorf("store-only: index saw %d CPU removals and evicted %d; engine evicted %d", st.Removed[blockindex.TierCPU], st.CPUEvictions, est.CPUEvictions)
			}
			if int(st.Replicas[in.Name].CPUEntries) != est.CPUBlocksUsed {
				t.Errorf("index CPU tier holds %d keys; engine %d blocks", st.Replicas[in.Name].CPUEntries, est.CPUBlocksUsed)
			}
			g.noReplayTrouble()
		})
	}
}

// TestQuirkPromptBlocksOnly runs an engine that caches prompt blocks only
// (llm-d-inference-sim): no event carries a generated token, and a
// follow-up turn hits exactly the previous prompt's full blocks, as the
// index predicts.
func TestQuirkPromptBlocksOnly(t *testing.T) {
	f := startFleet(t, Config{PromptBlocksOnly: true})
	in := f.Replicas()[0].Info()
	g := newGatewaySide(t, f, blockindex.Config{})
	g.subscribe(in.Name, in.Ranks[0])
	g.warm(in.Name, in.URL)
	turn1 := []Message{{Role: "system", Content: longText("po-sys", 120)}, {Role: "user", Content: "go on"}}
	u, _ := chat(t, in.URL, map[string]any{"messages": turn1, "max_tokens": 60, "ignore_eos": true})
	g.waitDepth("turn 1's prompt", in.Name, turn1, fullBlocks(turn1))
	turn2 := append(turn1, Message{Role: "assistant", Content: u.Choices[0].Message.Content}, Message{Role: "user", Content: "and?"})
	want := g.hit(in.Name, turn2)
	if want.Blocks != fullBlocks(turn1) {
		t.Errorf("index holds %d blocks of turn 2; want turn 1's %d prompt blocks only", want.Blocks, fullBlocks(turn1))
	}
	u2, _ := send(t, in.URL, turn2)
	if got, pred := *u2.Usage.PromptTokensDetails.CachedTokens, min(want.Blocks, (u2.Usage.PromptTokens-1)/16)*16; got != pred {
		t.Errorf("turn 2: engine cached %d tokens; the index predicts %d", got, pred)
	}
	if st := f.Replicas()[0].Stats(); st.CachedTokens == 0 {
		t.Error("no cache hit at all")
	}
}

// TestQuirkNoTokenize: behind a proxy that does not expose /tokenize, both
// tokenizer endpoints are 404 while completions work.
func TestQuirkNoTokenize(t *testing.T) {
	f := startFleet(t, Config{NoTokenize: true})
	base := f.Replicas()[0].Info().URL
	for _, path := range []string{"/tokenize", "/detokenize"} {
		r := post(t, base+path, map[string]any{"prompt": "hello"})
		if r.status != 404 || string(r.body) != `{"detail":"Not Found"}` {
			t.Errorf("POST %s: %d %s; want 404", path, r.status, r.body)
		}
	}
	send(t, base, prompt("nt", 10))
}

// TestQuirkBlockSize64 runs an engine with 64-token blocks (llm-d's
// guides): its events and cache_config_info say so, and the index, in its
// own 16-token keys, holds 4 keys per engine block, so the engine's
// cached tokens are the index's prediction rounded down to 64.
func TestQuirkBlockSize64(t *testing.T) {
	f := startFleet(t, Config{BlockSize: 64})
	in := f.Replicas()[0].Info()
	if m := get(t, in.URL+"/metrics"); !strings.Contains(string(m.body), `block_size="64"`) {
		t.Error("cache_config_info does not report block_size 64")
	}
	g := newGatewaySide(t, f, blockindex.Config{})
	g.subscribe(in.Name, in.Ranks[0])
	g.warm(in.Name, in.URL)
	p := prompt("bs64", 300)
	send(t, in.URL, p)
	engineBlocks := len(TokenizeChat(p, nil, true)) / 64
	g.waitDepth("prompt indexed", in.Name, p, 4*engineBlocks)
	u, _ := send(t, in.URL, p)
	index := min(g.hit(in.Name, p).Blocks*16, u.Usage.PromptTokens-1)
	if got := *u.Usage.PromptTokensDetails.CachedTokens; got != index/64*64 || got%64 != 0 {
		t.Errorf("engine cached %d tokens; the index predicts %d (%d in 64-token blocks)", got, index, index/64*64)
	}
}

// central starts a Central feeding g's index and returns it.
func (g *gatewaySide) central(cfg kvevents.CentralConfig) *kvevents.Central {
	g.t.Helper()
	cfg.Handler, cfg.Metrics, cfg.Logger = g.ix, g.m, slog.New(g.logs)
	if cfg.ReplayIdleTimeout == 0 {
		cfg.ReplayIdleTimeout = 5 * time.Second
	}
	c, err := kvevents.NewCentral(g.zctx, cfg)
	if err != nil {
		g.t.Fatal(err)
	}
	g.run("central", c.Run)
	return c
}

// replayEndpoints returns a Central's ReplayEndpoint hook for f: rank 0's
// ROUTER of each replica (the Central offsets it by rank).
func replayEndpoints(f *Fleet) func(string) string {
	m := map[string]string{}
	for _, r := range f.Replicas() {
		m[r.Info().Name] = r.Info().ReplayEndpoint
	}
	return func(name string) string { return m[name] }
}

// knownNames is a Resolve hook that knows f's replicas by name.
func knownNames(f *Fleet) func(string) (string, bool) {
	m := map[string]bool{}
	for _, r := range f.Replicas() {
		m[r.Info().Name] = true
	}
	return func(name string) (string, bool) { return name, m[name] }
}

// onFreePorts calls try with base ports until it succeeds, failing the
// test after 50 tries.
func onFreePorts(t *testing.T, try func(base int) error) {
	t.Helper()
	var err error
	for i := range 50 {
		base := 20000 + (i*7919+int(time.Now().UnixNano()%997))%40000
		if err = try(base); err == nil {
			return
		}
	}
	t.Fatalf("no free ports: %v", err)
}

// TestDeployRelayTwoGateways runs three engines whose PUB sockets connect
// (the central topology) through one kv-relay to two gateways, each a
// connect-mode Central feeding its own index: both indexes end identical,
// and batches lost on one engine's live stream are replayed by both,
// straight from that engine. With data parallelism, each rank dials the
// relay's port + rank.
func TestDeployRelayTwoGateways(t *testing.T) {
	for _, dp := range []int{1, 2} {
		t.Run("dp"+strconv.Itoa(dp), func(t *testing.T) {
			var relay *kvevents.Relay
			var f *Fleet
			zctx, err := zmq.NewContext()
			if err != nil {
				t.Fatal(err)
			}
			onFreePorts(t, func(base int) (err error) {
				relay, err = kvevents.NewRelay(zctx, kvevents.RelayConfig{Bind: "tcp://127.0.0.1:" + strconv.Itoa(base),
					Ranks: dp, Publish: "tcp://127.0.0.1:*", Metrics: kvevents.NewRelayMetrics(nil)})
				if err != nil {
					return err
				}
				// Replay ports in a fixed layout: rank r at rank 0's + r.
				f, err = NewFleet(Config{Replicas: 3, DataParallelSize: dp, KVConnect: relay.Endpoints()[0],
					ReplayPort: base + 10, Speed: 1000})
				if err != nil {
					relay.Close()
				}
				return err
			})
			runFleet(t, f)
			ctx, cancel := context.WithCancel(context.Background())
			relayDone := make(chan error, 1)
			go func() { relayDone <- relay.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				<-relayDone
				_ = zctx.Term()
			})

			var gws []*gatewaySide
			for range 2 {
				g := newGatewaySide(t, f, blockindex.Config{})
				g.central(kvevents.CentralConfig{Connect: relay.PublishEndpoint(), Resolve: knownNames(f), ReplayEndpoint: replayEndpoints(f)})
				gws = append(gws, g)
			}
			pin := func(rank int) []string { return []string{"X-data-parallel-rank", strconv.Itoa(rank)} }
			var prompts [][]Message
			for _, rep := range f.Replicas() {
				in := rep.Info()
				for rank := range dp {
					for _, g := range gws {
						g.warm(in.Name, in.URL, pin(rank)...)
					}
				}
			}
			for round := range 3 {
				if round == 1 {
					f.Replicas()[1].DropKVEvents(dp-1, 1) // lost on the live stream, kept for replay; round 2 shows the gap
				}
				for i, rep := range f.Replicas() {
					in := rep.Info()
					for rank := range dp {
						p := prompt("relay"+strconv.Itoa(round)+"r"+strconv.Itoa(i)+"k"+strconv.Itoa(rank), 80+20*i)
						send(t, in.URL, p, pin(rank)...)
						prompts = append(prompts, p)
					}
				}
			}
			for _, g := range gws {
				for i, p := range prompts {
					g.waitDepth("prompt "+strconv.Itoa(i), f.Replicas()[i/dp%3].Info().Name, p, fullBlocks(p))
				}
			}
			names := make([]string, 0, 3)
			for _, rep := range f.Replicas() {
				names = append(names, rep.Info().Name)
			}
			for i, p := range prompts {
				h0, h1 := gws[0].ix.Match(gws[0].keys(p), names, nil), gws[1].ix.Match(gws[1].keys(p), names, nil)
				for j := range names {
					if h0[j] != h1[j] {
						t.Errorf("prompt %d on %s: gateway 0 holds %+v, gateway 1 %+v", i, names[j], h0[j], h1[j])
					}
				}
			}
			s0, s1 := gws[0].ix.Stats(), gws[1].ix.Stats()
			if s0.Keys != s1.Keys || s0.Entries != s1.Entries {
				t.Errorf("gateway 0 holds %d keys, %d entries; gateway 1 %d, %d", s0.Keys, s0.Entries, s1.Keys, s1.Entries)
			}
			for _, n := range names {
				if a, b := s0.Replicas[n], s1.Replicas[n]; a.Entries != b.Entries || a.EngineBlocks != b.EngineBlocks || a.Ranks != dp {
					t.Errorf("replica %s: gateway 0 %+v, gateway 1 %+v", n, a, b)
				}
			}
			for k, g := range gws {
				if n := g.metric("warmpath_kvevents_gaps_total", nil); n == 0 {
					t.Errorf("gateway %d saw no gap", k)
				}
				if n := g.metric("warmpath_kvevents_replays_total", map[string]string{"result": kvevents.ReplayOK}); n == 0 {
					t.Errorf("gateway %d replayed nothing", k)
				}
				g.noReplayTrouble()
			}
		})
	}
}

// runFleet runs f until the test ends.
func runFleet(t *testing.T, f *Fleet) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("fleet Run: %v", err)
		}
	})
}

// TestDeployUnknownTopic runs two engines publishing to one central whose
// fleet knows the first under another name (its kv_topic names the
// engine's host:port) and not the second: the first is indexed under the
// fleet's name, the second's batches are counted by topic and warned about
// once, and nothing is indexed under a replica that does not exist.
func TestDeployUnknownTopic(t *testing.T) {
	ix, err := blockindex.New(blockindex.Config{})
	if err != nil {
		t.Fatal(err)
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = zctx.Term() })
	reg := prometheus.NewRegistry()
	g := &gatewaySide{t: t, ix: ix, reg: reg, m: kvevents.NewMetrics(reg), logs: &logSink{}, zctx: zctx}
	var known string // the first engine's host:port, as its topic names it
	c := g.central(kvevents.CentralConfig{Bind: "tcp://127.0.0.1:*", Resolve: func(name string) (string, bool) {
		if name == known {
			return "engine-a", true
		}
		return "", false
	}})
	f := startFleet(t, Config{Replicas: 2, KVConnect: c.Endpoint()})
	a, b := f.Replicas()[0].Info(), f.Replicas()[1].Info()
	known = a.Name // set before either engine publishes: read by Run's goroutine afterwards
	if err := ix.SetReplicaModel("engine-a", a.Model); err != nil {
		t.Fatal(err)
	}
	g.warm("engine-a", a.URL)
	unknown := func() float64 {
		return g.metric("warmpath_kvevents_unknown_replica_batches_total", map[string]string{"topic": b.Topic})
	}
	for i := 0; unknown() < 3; i++ {
		if i == 1000 {
			t.Fatal("no batch of the unknown engine counted")
		}
		send(t, b.URL, prompt("unknown"+strconv.Itoa(i), 40))
	}
	st := ix.Stats()
	if _, ok := st.Replicas[b.Name]; ok {
		t.Errorf("index holds replica %s, which is not in the fleet: %+v", b.Name, st.Replicas)
	}
	if _, ok := st.Replicas[a.Name]; ok {
		t.Errorf("index holds the first engine under its topic name %s too", a.Name)
	}
	if n := g.logs.count("not in the fleet"); n != 1 {
		t.Errorf("%d warnings about the unknown engine; want 1", n)
	}
}
