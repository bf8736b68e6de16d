package vllmsim

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmpath/warmpath/kvevents"
)

// recordSink records published batches.
type recordSink struct {
	mu      sync.Mutex
	batches []kvevents.Batch
	resets  int
}

func (s *recordSink) Publish(b kvevents.Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches = append(s.batches, b)
	return nil
}

func (s *recordSink) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resets++
}

func (s *recordSink) events() []kvevents.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ev []kvevents.Event
	for _, b := range s.batches {
		ev = append(ev, b.Events...)
	}
	return ev
}

// instantClock advances only when slept on, so simulated timings are exact
// and the engine runs as fast as the CPU allows.
type instantClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *instantClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *instantClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	if d > 0 {
		c.now = c.now.Add(d)
	}
	c.mu.Unlock()
	return ctx.Err()
}

func testProfile() Profile {
	p := DefaultProfile()
	p.KVBlocks = 1000
	return p
}

func newTestEngine(p Profile, sink *recordSink, priority bool) *engine {
	root := uint64(0)
	return newEngine(engineConfig{
		profile: p, speed: 1, priority: priority, clock: &instantClock{now: time.Unix(1e9, 0)},
		sink: sink, newRoot: func() uint64 { root++; return root }, logger: discardLogger(),
	})
}

// runEngine runs e until the test ends.
func runEngine(t testing.TB, e *engine) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = e.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// words returns a prompt of n distinct-ish tokens tagged by seed.
func words(seed string, n int) []uint32 {
	ws := make([]string, n)
	for i := range ws {
		ws[i] = seed + strconv.Itoa(i)
	}
	return Tokenize(strings.Join(ws, " "))
}

func newTestSeq(prompt []uint32, out int, salt string) *seq {
	plan := planOutput(prompt, genSpec{maxTokens: out, ignoreEOS: true, eos: IMEndToken})
	return newSeq(prompt, plan, salt, "", 0)
}

// wait blocks until s is done.
func wait(t testing.TB, s *seq) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for !s.done.Load() {
		select {
		case <-s.notify:
		case <-deadline:
			t.Fatal("request did not finish")
		}
	}
}

func submitWait(t testing.TB, e *engine, s *seq) *seq {
	t.Helper()
	e.submit(s)
	wait(t, s)
	if s.err != nil {
		t.Fatalf("request failed: %v", s.err)
	}
	settle(t, e)
	return s
}

// settle waits until the engine is idle and has published the events of its
// last step: a request is reported done during a step, and that step's
// batch is published when the step ends.
func settle(t testing.TB, e *engine) {
	t.Helper()
	sink, _ := e.cfg.sink.(*recordSink)
	deadline := time.Now().Add(20 * time.Second)
	last, stable := -1, 0
	for stable < 4 {
		if time.Now().After(deadline) {
			t.Fatal("engine did not settle")
		}
		time.Sleep(2 * time.Millisecond)
		st, _ := e.snapshot()
		n := 0
		if sink != nil {
			n = len(sink.events())
		}
		if st.Running == 0 && st.Waiting == 0 && n == last {
			stable++
		} else {
			stable = 0
		}
		last = n
	}
}

func TestEnginePrefixHit(t *testing.T) {
	e := newTestEngine(testProfile(), &recordSink{}, false)
	runEngine(t, e)
	p := words("a", 100)
	if s := submitWait(t, e, newTestSeq(p, 5, "")); s.cachedTokens != 0 {
		t.Errorf("cold request cached %d tokens", s.cachedTokens)
	}
	if s := submitWait(t, e, newTestSeq(p, 5, "")); s.cachedTokens != 96 {
		t.Errorf("warm request cached %d tokens, want 96", s.cachedTokens)
	}
	// Never the last prompt token: a 96-token prompt hits 5 blocks, not 6.
	if s := submitWait(t, e, newTestSeq(p[:96], 5, "")); s.cachedTokens != 80 {
		t.Errorf("96-token prompt cached %d tokens, want 80", s.cachedTokens)
	}
	// The salt isolates.
	if s := submitWait(t, e, newTestSeq(p, 5, "tenant")); s.cachedTokens != 0 {
		t.Errorf("salted request cached %d tokens", s.cachedTokens)
	}
	if s := submitWait(t, e, newTestSeq(p, 5, "tenant")); s.cachedTokens != 96 {
		t.Errorf("salted warm request cached %d tokens", s.cachedTokens)
	}
	st, _ := e.snapshot()
	if st.Requests != 5 || st.Finished != 5 || st.CachedTokens != 96+80+96 || st.KVBlocksUsed != 0 {
		t.Errorf("stats %+v", st)
	}
}

func storedEvents(ev []kvevents.Event) []*kvevents.BlockStored {
	var out []*kvevents.BlockStored
	for _, e := range ev {
		if s, ok := e.(*kvevents.BlockStored); ok {
			out = append(out, s)
		}
	}
	return out
}

func TestEngineBlockStoredEvents(t *testing.T) {
	sink := &recordSink{}
	p := testProfile()
	p.MaxNumBatchedTokens = 20 // chunked prefill
	e := newTestEngine(p, sink, false)
	runEngine(t, e)
	prompt := words("b", 40)
	s := newTestSeq(prompt, 30, "salt")
	s.session = "sess-1"
	submitWait(t, e, s)

	stored := storedEvents(sink.events())
	if len(stored) < 2 {
		t.Fatalf("%d BlockStored events, want several (chunked prefill, decode)", len(stored))
	}
	all := append(slices.Clone(prompt), s.plan.tokens...)
	var toks []uint32
	var hashes []uint64
	for i, ev := range stored {
		if i == 0 {
			if ev.ParentBlockHash != nil || len(ev.ExtraKeys) == 0 || len(ev.ExtraKeys[0]) != 1 || ev.ExtraKeys[0][0].Value != "salt" {
				t.Errorf("first event: parent %v, extra keys %v", ev.ParentBlockHash, ev.ExtraKeys)
			}
		} else if ev.ParentBlockHash == nil || *ev.ParentBlockHash != hashes[len(hashes)-1] {
			t.Errorf("event %d: parent does not chain", i)
		}
		if len(ev.TokenIDs) != 16*len(ev.BlockHashes) || len(ev.ExtraKeys) != len(ev.BlockHashes) || ev.BlockSize != 16 ||
			ev.Medium != "GPU" || ev.GroupIdx == nil || *ev.GroupIdx != 0 || ev.KVCacheSpecKind != "full_attention" || ev.SessionID != "sess-1" {
			t.Errorf("event %d malformed: %+v", i, ev)
		}
		toks = append(toks, ev.TokenIDs...)
		hashes = append(hashes, ev.BlockHashes...)
	}
	// 40 prompt + 29 computed output tokens = 69 → 4 full blocks, the last
	// two holding generated tokens.
	if len(hashes) != 4 || !slices.Equal(toks, all[:64]) {
		t.Errorf("stored %d blocks; tokens match prompt+output: %v", len(hashes), slices.Equal(toks, all[:len(toks)]))
	}

	// A hit stores nothing for the cached blocks: the repeat's first event
	// continues the chain after block 1.
	n := len(sink.events())
	submitWait(t, e, newTestSeq(prompt, 30, "salt"))
	again := storedEvents(sink.events()[n:])
	if len(again) == 0 || again[0].ParentBlockHash == nil || *again[0].ParentBlockHash != hashes[1] {
		t.Errorf("repeat's first BlockStored should chain from block 1: %+v", again)
	}
}

func TestEngineTTFTColdVsWarm(t *testing.T) {
	p := testProfile()
	e := newTestEngine(p, &recordSink{}, false)
	runEngine(t, e)
	prompt := words("c", 2000)
	cold := submitWait(t, e, newTestSeq(prompt, 3, ""))
	warm := submitWait(t, e, newTestSeq(prompt, 3, ""))
	if want := p.stepTime(2000, 1, 0, 0); cold.ttft != want {
		t.Errorf("cold TTFT %v, want %v", cold.ttft, want)
	}
	if want := p.stepTime(2000-1984, 1, 0, 0); warm.ttft != want {
		t.Errorf("warm TTFT %v, want %v", warm.ttft, want)
	}
	if warm.ttft*3 > cold.ttft {
		t.Errorf("warm TTFT %v not well below cold %v", warm.ttft, cold.ttft)
	}
}

func TestEngineTTFTGrowsWithQueueDepth(t *testing.T) {
	p := testProfile()
	p.MaxNumSeqs = 2
	e := newTestEngine(p, &recordSink{}, false)
	var seqs []*seq
	for i := range 8 {
		s := newTestSeq(words("q"+strconv.Itoa(i), 200), 20, "")
		seqs = append(seqs, s)
		e.submit(s) // all queued before the engine starts
	}
	runEngine(t, e)
	for _, s := range seqs {
		wait(t, s)
	}
	for i := 2; i < len(seqs); i++ {
		if seqs[i].queueTime < seqs[i-1].queueTime || seqs[i].ttft < seqs[i-1].ttft {
			t.Errorf("request %d: queue %v ttft %v, before it %v / %v", i, seqs[i].queueTime, seqs[i].ttft, seqs[i-1].queueTime, seqs[i-1].ttft)
		}
	}
	if first, last := seqs[0], seqs[7]; last.ttft < 3*first.ttft || first.queueTime != 0 {
		t.Errorf("first TTFT %v (queue %v), last %v", first.ttft, first.queueTime, last.ttft)
	}
}

func TestEnginePriority(t *testing.T) {
	p := testProfile()
	p.MaxNumSeqs = 1
	e := newTestEngine(p, &recordSink{}, true)
	var seqs []*seq
	for _, prio := range []int{10, 0, 5} {
		s := newTestSeq(words("p"+strconv.Itoa(prio), 50), 5, "")
		s.priority = prio
		seqs = append(seqs, s)
		e.submit(s)
	}
	runEngine(t, e)
	for _, s := range seqs {
		wait(t, s)
	}
	low, high, mid := seqs[0], seqs[1], seqs[2]
	if !(high.queueTime < mid.queueTime && mid.queueTime < low.queueTime) {
		t.Errorf("queue times high %v mid %v low %v", high.queueTime, mid.queueTime, low.queueTime)
	}
}

func TestEngineEviction(t *testing.T) {
	sink := &recordSink{}
	p := testProfile()
	p.KVBlocks = 20
	e := newTestEngine(p, sink, false)
	runEngine(t, e)
	a := words("evicta", 160)
	submitWait(t, e, newTestSeq(a, 1, ""))
	storedA := map[uint64]bool{}
	for _, ev := range storedEvents(sink.events()) {
		for _, h := range ev.BlockHashes {
			storedA[h] = true
		}
	}
	submitWait(t, e, newTestSeq(words("evictb", 250), 1, ""))
	var removed []uint64
	for _, ev := range sink.events() {
		if r, ok := ev.(*kvevents.BlockRemoved); ok {
			if len(r.BlockHashes) != 1 || r.Medium != "GPU" {
				t.Errorf("BlockRemoved %+v: want one hash per event", r)
			}
			removed = append(removed, r.BlockHashes...)
		}
	}
	if len(removed) == 0 {
		t.Fatal("no BlockRemoved under capacity pressure")
	}
	for _, h := range removed {
		if !storedA[h] {
			t.Errorf("removed hash %x was never stored", h)
		}
		e.mu.Lock()
		_, still := e.cache.byHash[h]
		e.mu.Unlock()
		if still {
			t.Errorf("removed hash %x still cached", h)
		}
	}
	again := submitWait(t, e, newTestSeq(a, 1, ""))
	if again.cachedTokens >= 144 {
		t.Errorf("after eviction A still hits %d tokens", again.cachedTokens)
	}
	if st, _ := e.snapshot(); st.Evictions != uint64(len(removed)) && st.Evictions < uint64(len(removed)) {
		t.Errorf("stats evictions %d, removed events %d", st.Evictions, len(removed))
	}
}

func TestEnginePreemption(t *testing.T) {
	p := testProfile()
	p.KVBlocks = 12
	e := newTestEngine(p, &recordSink{}, false)
	a := newTestSeq(words("pa", 32), 100, "")
	b := newTestSeq(words("pb", 32), 100, "")
	e.submit(a)
	e.submit(b)
	runEngine(t, e)
	wait(t, a)
	wait(t, b)
	if a.err != nil || b.err != nil || a.generated.Load() != 100 || b.generated.Load() != 100 {
		t.Fatalf("a: %v %d, b: %v %d", a.err, a.generated.Load(), b.err, b.generated.Load())
	}
	if st, _ := e.snapshot(); st.Preemptions == 0 {
		t.Error("no preemption although both requests cannot fit")
	}
}

func TestEngineResetPrefixCacheAndRestart(t *testing.T) {
	sink := &recordSink{}
	e := newTestEngine(testProfile(), sink, false)
	runEngine(t, e)
	prompt := words("r", 64)
	submitWait(t, e, newTestSeq(prompt, 2, ""))
	e.resetPrefixCache()
	ev := sink.events()
	if _, ok := ev[len(ev)-1].(*kvevents.AllBlocksCleared); !ok {
		t.Errorf("last event %T, want AllBlocksCleared", ev[len(ev)-1])
	}
	if s := submitWait(t, e, newTestSeq(prompt, 2, "")); s.cachedTokens != 0 {
		t.Errorf("after reset cached %d", s.cachedTokens)
	}

	long := newTestSeq(words("long", 10), 100000, "")
	e.submit(long)
	for long.generated.Load() == 0 {
		<-long.notify
	}
	nev := len(sink.events())
	e.restart()
	wait(t, long)
	if long.err == nil {
		t.Error("in-flight request survived the restart")
	}
	if sink.resets != 1 {
		t.Errorf("publisher reset %d times", sink.resets)
	}
	for _, ev := range sink.events()[nev:] {
		if _, ok := ev.(*kvevents.AllBlocksCleared); ok {
			t.Error("restart emitted AllBlocksCleared")
		}
	}
	if s := submitWait(t, e, newTestSeq(prompt, 2, "")); s.cachedTokens != 0 {
		t.Errorf("after restart cached %d", s.cachedTokens)
	}
	if st, _ := e.snapshot(); st.Requests != 1 {
		t.Errorf("counters not reset by restart: %+v", st)
	}
}

type discardSink struct{}

func (discardSink) Publish(kvevents.Batch) error { return nil }
func (discardSink) Reset()                       {}

// BenchmarkEngineStep measures the engine's own CPU per step with 64
// decoding sequences (no sleeping).
func BenchmarkEngineStep(b *testing.B) {
	p := DefaultProfile()
	p.KVBlocks = 64 * (1000 + 20000) / 16 * 2
	e := newEngine(engineConfig{profile: p, speed: 1, clock: &instantClock{}, sink: discardSink{},
		newRoot: func() uint64 { return 1 }, logger: discardLogger()})
	newReq := func(i int) *seq { return newTestSeq(words("bench"+strconv.Itoa(i), 1000), 20000, "") }
	for i := range 64 {
		e.submit(newReq(i))
	}
	step := func() {
		e.mu.Lock()
		e.drainInbox()
		d, _ := e.schedule()
		e.vnow += d
		e.apply()
		e.publishLocked()
		e.mu.Unlock()
	}
	for range 16 { // prefill everything
		step()
	}
	if len(e.running) != 64 {
		b.Fatalf("%d running", len(e.running))
	}
	next := 64
	b.ReportAllocs()
	for b.Loop() {
		step()
		if len(e.running) < 64 {
			for range 64 - len(e.running) {
				e.submit(newReq(next))
				next++
			}
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "steps/s")
	b.ReportMetric(64*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestEngineRequestOutgrowsCache(t *testing.T) {
	p := testProfile()
	p.KVBlocks = 4
	e := newTestEngine(p, &recordSink{}, false)
	runEngine(t, e)
	s := newTestSeq(words("big", 10), 100, "")
	e.submit(s)
	wait(t, s)
	if s.err != errTooLarge {
		t.Errorf("err %v, want errTooLarge", s.err)
	}
	// The engine still serves requests that fit.
	submitWait(t, e, newTestSeq(words("small", 10), 5, ""))
}

// Under priority scheduling a running sequence that must preempt and is
// itself the lowest-priority one is preempted, and the step schedules no
// running sequence after it: vLLM's scheduler stops its running loop there
// ("if new_blocks is None: break") rather than go on with the rest.
func TestEnginePrioritySelfPreemptionEndsRunningLoop(t *testing.T) {
	p := testProfile()
	p.KVBlocks = 7 // room for three sequences of two blocks, plus one
	e := newTestEngine(p, &recordSink{}, true)
	a := newTestSeq(words("a", 16), 100, "")
	low := newTestSeq(words("l", 16), 100, "")
	low.priority = 5
	h := newTestSeq(words("h", 16), 100, "")
	step := func(check func()) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.drainInbox()
		e.schedule()
		if check != nil {
			check()
		}
		e.apply()
	}
	e.submit(a)
	e.submit(low)
	step(nil)
	e.submit(h) // admitted after low: running is [a, low, h]
	seen := false
	for range 100 {
		wasRunning := low.state == seqRunning
		step(func() {
			if !wasRunning || low.state != seqWaiting {
				return
			}
			seen = true
			for _, sc := range e.sched {
				if sc.s == h {
					t.Error("a running sequence after the self-preempted one was scheduled in the same step")
				}
			}
		})
		if seen {
			break
		}
	}
	if !seen {
		t.Fatal("the lowest-priority sequence never preempted itself; the scenario is broken")
	}
}
