package bench

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/vllmsim"
)

// A log of epoch milliseconds (and its second half, starting half an hour
// in) counts time from its first request, in bench and analyze alike.
func TestTraceEpochTimestamps(t *testing.T) {
	raw, err := os.ReadFile("testdata/mooncake_head400.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	tr0, _ := ReadTrace(bytes.NewReader(raw))
	var shifted bytes.Buffer
	for i, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		at := tr0.Requests[i].Arrival.Milliseconds() // the head's lines are in arrival order
		shifted.WriteString(strings.Replace(line, fmt.Sprintf(`"timestamp": %d`, at), fmt.Sprintf(`"timestamp": %d`, 1_750_000_000_000+at+1800_000), 1))
		shifted.WriteByte('\n')
	}
	if bytes.Equal(shifted.Bytes(), raw) || !bytes.Contains(shifted.Bytes(), []byte("1750001800000")) {
		t.Fatal("the test did not shift the timestamps")
	}
	tr, err := ReadTrace(bytes.NewReader(shifted.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	for i := range tr.Requests {
		if tr.Requests[i].Arrival != tr0.Requests[i].Arrival {
			t.Fatalf("request %d arrives at %v; want %v", i, tr.Requests[i].Arrival, tr0.Requests[i].Arrival)
		}
	}
	path := filepath.Join(t.TempDir(), "epoch.jsonl")
	if err := os.WriteFile(path, shifted.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := (&Replay{}).Plan(Env{Seed: 1, Scale: 0.1, Replicas: 8, TracePath: path, TimeScale: 1, Duration: 30 * time.Second})
	if err != nil || len(p.Sessions) == 0 {
		t.Fatalf("an epoch-ms trace planned %v sessions (%v)", p, err)
	}
	a, err := Analyze(t.Context(), AnalyzeConfig{Trace: tr, CacheBlocks: []int{600}, Policies: []string{scoring.PolicyWarmpath}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Analyze(t.Context(), AnalyzeConfig{Trace: tr0, CacheBlocks: []int{600}, Policies: []string{scoring.PolicyWarmpath}})
	if a.Results[0].CachedTokens != b.Results[0].CachedTokens || a.Results[0].TTFTP90Seconds != b.Results[0].TTFTP90Seconds {
		t.Errorf("analyze differs on the shifted trace: %+v vs %+v", a.Results[0], b.Results[0])
	}
}

// harnessTrace writes and reads a small synthetic coding-agent log.
func harnessTrace(t *testing.T, runs, active int) *Trace {
	t.Helper()
	var b bytes.Buffer
	if err := WriteHarnessTrace(&b, HarnessTraceConfig{Runs: runs, Active: active, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	tr, err := ReadTrace(&b)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// Behind a shared multi-block harness every conversation's opening
// reaches the first block where it parts from the others: each has a
// session of its own, sub-agents included, and the turns of one share it.
func TestOpeningsPartConversations(t *testing.T) {
	tr := harnessTrace(t, 30, 15)
	harness := AgenticHarness{}.withDefaults().HarnessTokens / MooncakeBlockTokens // 23 whole blocks
	byKey := map[string][]int{}
	for i := range tr.Requests {
		r := &tr.Requests[i]
		if r.Opening <= harness {
			t.Fatalf("request %d: opening %d blocks inside the %d-block harness", i, r.Opening, harness)
		}
		byKey[sessionKey(tr.Format, r)] = append(byKey[sessionKey(tr.Format, r)], i)
	}
	// One session per conversation: the log's conversations are its runs
	// and their sub-agents, told apart by their first own block's id (the
	// one the harness ends in, always full).
	convs := map[int64]bool{}
	for _, r := range tr.Requests {
		convs[r.HashIDs[harness]] = true
	}
	if len(byKey) != len(convs) {
		t.Errorf("%d sessions for %d conversations", len(byKey), len(convs))
	}
	for key, reqs := range byKey {
		first := tr.Requests[reqs[0]].HashIDs[harness]
		for _, i := range reqs {
			if tr.Requests[i].HashIDs[harness] != first {
				t.Fatalf("session %s spans two conversations", key)
			}
		}
	}
	// Mooncake's own trace parts after its one-block system prompt.
	head, _ := ReadTraceFile("testdata/mooncake_head400.jsonl")
	two := 0
	for _, r := range head.Requests {
		if r.Opening == 2 {
			two++
		}
	}
	if two < len(head.Requests)*9/10 {
		t.Errorf("%d of %d Mooncake openings end at block 1", two, len(head.Requests))
	}
	// The replay sends the harness as the system message and the first
	// block of its own as the first user message.
	msgs := mooncakeMessages(tr.Requests[0].HashIDs, tr.Requests[0].InputTokens, tr.Requests[0].Opening, 0.1)
	if len(msgs) < 2 || msgs[0].Role != "system" || tokens(msgs[0].Content) != (tr.Requests[0].Opening-1)*mooncakeBlock(0.1) {
		t.Errorf("replayed messages %d, system %d tokens", len(msgs), tokens(msgs[0].Content))
	}
}

// On the shared-harness shape warmpath caches as much as precise-prefix
// (the report: 67.9 % against 90.5 % before sessions were keyed
// per conversation), and its sticky turns find their prefix; with the
// replication term it copies the harness rather than crowd every
// conversation onto its first holder, and its p90 TTFT is session-hash's.
func TestAnalyzeSharedHarness(t *testing.T) {
	tr := harnessTrace(t, 40, 20)
	rep, err := Analyze(t.Context(), AnalyzeConfig{Trace: tr, CacheBlocks: []int{150, 600},
		Policies: []string{scoring.PolicySessionHash, scoring.PolicyPrecisePrefix, scoring.PolicyWarmpath}, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, cb := range []int{150, 600} {
		sh, _ := rep.result(scoring.PolicySessionHash, cb)
		pp, _ := rep.result(scoring.PolicyPrecisePrefix, cb)
		wp, _ := rep.result(scoring.PolicyWarmpath, cb)
		t.Logf("%d blocks: session-hash %.3f p90 %.3f s, precise-prefix %.3f p90 %.3f s ×%.2f, warmpath %.3f p90 %.3f s ×%.2f (sticky %.2f)", cb,
			sh.CachedFraction, sh.TTFTP90Seconds, pp.CachedFraction, pp.TTFTP90Seconds, pp.Imbalance, wp.CachedFraction, wp.TTFTP90Seconds, wp.Imbalance, wp.StickyShare)
		if wp.CachedFraction < pp.CachedFraction-0.02 {
			t.Errorf("%d blocks: warmpath cached %.3f; want at least precise-prefix's %.3f − 2 points", cb, wp.CachedFraction, pp.CachedFraction)
		}
		if wp.TTFTP90Seconds > 1.05*sh.TTFTP90Seconds || wp.Imbalance >= pp.Imbalance {
			t.Errorf("%d blocks: warmpath p90 %.3f s ×%.2f; want at most 1.05 × session-hash's %.3f s, spread more than precise-prefix's ×%.2f",
				cb, wp.TTFTP90Seconds, wp.Imbalance, sh.TTFTP90Seconds, pp.Imbalance)
		}
		if wp.StickyShare < 0.3 {
			t.Errorf("%d blocks: sticky share %.2f; conversations should stick", cb, wp.StickyShare)
		}
		// A sticky turn predicts its hit from the binding, which holds what
		// the replica cached of the previous turn, refreshed or not: the
		// estimates are exact on this simulator, and the calibration has
		// no misprediction to absorb (with a refresh turn's binding left
		// a turn behind they were 1.2–2.4 % off at the median, 6–8 % at p90).
		if wp.EstimateErrorP50 > 0.005 || wp.EstimateErrorP90 > 0.02 {
			t.Errorf("%d blocks: estimate error p50 %.2f %%, p90 %.2f %%; want under 0.5 %% and 2 %%", cb, 100*wp.EstimateErrorP50, 100*wp.EstimateErrorP90)
		}
		if wp.Estimated == 0 || wp.TTFTP90Seconds < wp.TTFTP50Seconds || len(wp.Predictions) == 0 {
			t.Errorf("%d blocks: estimates %d, TTFT p50 %v p90 %v, %d predictions", cb, wp.Estimated, wp.TTFTP50Seconds, wp.TTFTP90Seconds, len(wp.Predictions))
		}
	}
}

// ClaudePause follows its knots: median 2 s, 90th percentile 24 s, 99th
// about 11 minutes.
func TestClaudePause(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	ds := make([]float64, 200000)
	for i := range ds {
		ds[i] = ClaudePause(rng).Seconds()
	}
	slices.Sort(ds)
	for _, q := range []struct{ p, want float64 }{{0.5, 2}, {0.9, 24}, {0.99, 684}} {
		got := ds[int(q.p*float64(len(ds)))]
		if math.Abs(math.Log(got/q.want)) > 0.1 {
			t.Errorf("p%.0f = %.1f s; want %.0f s", 100*q.p, got, q.want)
		}
	}
	if ds[0] < 0.5 || ds[len(ds)-1] > 1800 {
		t.Errorf("range [%v, %v]; want within [0.5, 1800] s", ds[0], ds[len(ds)-1])
	}
	var sum float64
	for _, d := range ds {
		sum += d
	}
	if m := sum / float64(len(ds)); math.Abs(m/meanClaudePause()-1) > 0.05 {
		t.Errorf("mean %.1f s; meanClaudePause says %.1f s", m, meanClaudePause())
	}
}

// The agentic-harness plan: every run shares one harness, names its
// session as Claude Code does, and fans out sub-agents that name
// themselves, share the harness and get briefs of their own.
func TestAgenticHarnessShape(t *testing.T) {
	p, err := (&AgenticHarness{}).Plan(Env{Seed: 4, Scale: 0.1, Replicas: 8, KVTokens: 30733})
	if err != nil || len(p.Sessions) < 20 {
		t.Fatalf("plan: %d sessions, %v", len(p.Sessions), err)
	}
	var system string
	var tools []vllmsim.Tool
	spawned := 0
	for i, s := range p.Sessions[:20] {
		if got := s.Header.Get("X-Claude-Code-Session-Id"); got != "run-"+strconv.Itoa(i) {
			t.Fatalf("session %d header %q", i, got)
		}
		var prev *Outcome
		for turn := 0; ; turn++ {
			tn, ok := s.Script.Next(prev)
			if !ok {
				break
			}
			if turn == 0 {
				if system == "" {
					system, tools = tn.Messages[0].Content, tn.Tools
				} else if tn.Messages[0].Content != system || len(tn.Tools) != len(tools) {
					t.Fatalf("session %d opens with another harness", i)
				}
			}
			for _, sub := range tn.Spawn {
				spawned++
				st, _ := sub.Next(nil)
				if st.Header.Get("X-Claude-Code-Agent-Id") == "" || st.Messages[0].Content != system || st.Messages[1].Content == tn.Messages[1].Content {
					t.Fatalf("sub-agent of session %d: headers %v, same harness %v", i, st.Header, st.Messages[0].Content == system)
				}
			}
			prev = &Outcome{Reply: "ok then", OutputTokens: 2}
		}
	}
	if spawned == 0 {
		t.Error("no run fanned out a sub-agent")
	}
	if tokens(system) < 400 {
		t.Errorf("harness system prompt of %d tokens", tokens(system))
	}
}

// The driver plays a turn's spawned scripts concurrently, with the
// session's headers, and resumes the session when they have ended.
func TestDriverSpawn(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	inflight, peak := 0, 0
	overlap := make(chan struct{}) // closed once two requests are in flight together
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who := r.Header.Get("X-Who")
		mu.Lock()
		first := !slices.Contains(seen, r.Header.Get("X-Run")+"/"+who)
		seen = append(seen, r.Header.Get("X-Run")+"/"+who)
		inflight++
		peak = max(peak, inflight)
		if inflight >= 2 {
			once.Do(func() { close(overlap) })
		}
		mu.Unlock()
		if first && strings.HasPrefix(who, "s") {
			// A sub-agent's first turn waits until another one is in flight
			// beside it (played one by one, they never are: the wait runs
			// out and the peak stays 1).
			select {
			case <-overlap:
			case <-time.After(5 * time.Second):
			}
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}`+"\n\n")
		fmt.Fprint(w, `data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}`+"\n\ndata: [DONE]\n\n")
		mu.Lock()
		inflight--
		mu.Unlock()
	}))
	defer srv.Close()
	turn := func(who string) Turn {
		return Turn{Messages: []vllmsim.Message{{Role: "user", Content: "x"}}, MaxTokens: 1, Header: http.Header{"X-Who": {who}}}
	}
	subs := []Script{&fixedTurns{turns: []Turn{turn("s1"), turn("s1")}}, &fixedTurns{turns: []Turn{turn("s2")}}, &fixedTurns{turns: []Turn{turn("s3")}}}
	first := turn("main")
	first.Spawn = subs
	main := &fixedTurns{turns: []Turn{first, turn("main-after")}}
	d := newDriver([]string{srv.URL}, "m", "", 1, time.Minute)
	samples, err := d.run(t.Context(), []Session{{Header: http.Header{"X-Run": {"r1"}}, Script: main}})
	if err != nil || len(samples) != 6 {
		t.Fatalf("%d samples, %v", len(samples), err)
	}
	for _, s := range samples {
		if !s.ok() {
			t.Fatalf("sample failed: %s", s.err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if seen[0] != "r1/main" || seen[len(seen)-1] != "r1/main-after" || peak < 2 {
		t.Errorf("requests %v, peak concurrency %d; want main first, the sub-agents concurrently, then main", seen, peak)
	}
}

// fixedTurns plays a list of turns.
type fixedTurns struct {
	turns []Turn
	next  int
}

func (f *fixedTurns) Next(*Outcome) (Turn, bool) {
	if f.next >= len(f.turns) {
		return Turn{}, false
	}
	f.next++
	return f.turns[f.next-1], true
}

// The cost model's prior is the simulator's default profile.
func TestCostPriorIsTheProfile(t *testing.T) {
	p := vllmsim.DefaultProfile()
	c := scoring.DefaultCost()
	if !near(c.PrefillPerToken, p.PrefillPerToken.Seconds()) || !near(c.StepBase, p.StepBase.Seconds()) ||
		!near(c.DecodePerSeq, p.DecodePerSeq.Seconds()) || !near(c.DecodePerContextToken, p.DecodePerContextToken.Seconds()) ||
		c.StepTokens != p.MaxNumBatchedTokens {
		t.Errorf("prior %+v differs from profile %+v", c, p)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-4*max(math.Abs(a), math.Abs(b)) }
