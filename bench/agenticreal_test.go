package bench

import (
	"bytes"
	"slices"
	"testing"

	"github.com/warmpath/warmpath/scoring"
)

// harnessStats are the statistics the published Claude Code trace reports,
// measured on a generated log.
type harnessStats struct {
	requests           int
	medianInput        float64
	medianOutput       float64
	reuse90            float64 // share of turns reusing ≥ 90 % of their input
	pauseP50, pauseP99 float64 // seconds
	subShare           float64 // share of requests from sub-agents
}

// measureHarness measures recs. A turn's reuse is the longest run of its
// blocks, from block 0, that an earlier request sent (a partial last
// block gets a new id each turn, so it never counts), in tokens, over its
// input.
func measureHarness(recs []harnessRecord) harnessStats {
	seen := map[int64]bool{}
	var inputs, outputs, pauses []float64
	var reused, subs int
	for _, r := range recs {
		k := 0
		for k < len(r.ids) && seen[r.ids[k]] {
			k++
		}
		if float64(min(k*MooncakeBlockTokens, r.input)) >= 0.9*float64(r.input) {
			reused++
		}
		for _, id := range r.ids {
			seen[id] = true
		}
		inputs = append(inputs, float64(r.input))
		outputs = append(outputs, float64(r.output))
		if r.pause > 0 {
			pauses = append(pauses, r.pause)
		}
		if r.conv > 1<<32 {
			subs++
		}
	}
	slices.Sort(inputs)
	slices.Sort(outputs)
	slices.Sort(pauses)
	n := float64(len(recs))
	return harnessStats{
		requests:     len(recs),
		medianInput:  percentile(inputs, 50),
		medianOutput: percentile(outputs, 50),
		reuse90:      float64(reused) / n,
		pauseP50:     percentile(pauses, 50),
		pauseP99:     percentile(pauses, 99),
		subShare:     float64(subs) / n,
	}
}

// The real-size log reproduces the published Claude Code statistics
// (peers.md §8) within stated tolerances, on three seeds: median input
// 195k tokens ±10 %, median output 317 ±10 %, 96 % ±2 points of turns
// reusing ≥ 90 % of their input, pauses p50 2 s ±15 % and p99 11.4 min
// ±25 % (a 99th percentile of a few thousand draws); it has sub-agents,
// and every request opens with the shared harness.
func TestRealSizeHarnessStats(t *testing.T) {
	within := func(name string, got, want, tol float64) {
		t.Helper()
		if got < want*(1-tol) || got > want*(1+tol) {
			t.Errorf("%s = %.4g; want %.4g ±%.0f%%", name, got, want, 100*tol)
		}
	}
	for _, seed := range []int64{1, 2, 3} {
		recs := harnessRecords(RealSizeHarnessTrace(RealSizeRuns, RealSizeActive, seed))
		st := measureHarness(recs)
		t.Logf("seed %d: %+v", seed, st)
		within("median input", st.medianInput, 195000, 0.10)
		within("median output", st.medianOutput, 317, 0.10)
		if st.reuse90 < 0.94 || st.reuse90 > 0.98 {
			t.Errorf("share of turns reusing ≥ 90 %% = %.3f; want 0.96 ± 0.02", st.reuse90)
		}
		within("pause p50 (s)", st.pauseP50, 2, 0.15)
		within("pause p99 (s)", st.pauseP99, 684, 0.25)
		if st.subShare <= 0 {
			t.Error("no sub-agent requests")
		}
		for i, r := range recs {
			if len(r.ids) < 2 || r.ids[0] != 0 || r.ids[1] != 1 {
				t.Fatalf("request %d opens with %v; want the harness's blocks 0, 1, …", i, r.ids[:min(2, len(r.ids))])
			}
		}
	}
}

// The uniform draws stay the default: a log without Sizes is the
// agentic-harness log, whose replies stay in its range.
func TestHarnessTraceUniformDefault(t *testing.T) {
	a := AgenticHarness{}.withDefaults()
	for _, r := range harnessRecords(HarnessTraceConfig{Runs: 5}) {
		if r.output < a.ReplyMin || r.output > a.ReplyMax {
			t.Fatalf("output %d outside [%d, %d]", r.output, a.ReplyMin, a.ReplyMax)
		}
	}
}

func TestConversationBlocks(t *testing.T) {
	tr := &Trace{BlockTokens: 512, Requests: []TraceRequest{{InputTokens: 2000}, {InputTokens: 100}, {InputTokens: 1000}}}
	if got := MedianPrompt(tr); got != 1000 {
		t.Errorf("MedianPrompt = %d; want 1000", got)
	}
	got := ConversationBlocks(tr, []float64{0.1, 0.5, 2})
	if want := []int{1, 1, 4}; !slices.Equal(got, want) {
		t.Errorf("ConversationBlocks = %v; want %v", got, want)
	}
}

// Turns partitions the requests and their cached tokens; on one replica
// nothing moves, and round-robin over four moves most later turns.
func TestAnalyzeTurns(t *testing.T) {
	var b bytes.Buffer
	if err := WriteHarnessTrace(&b, HarnessTraceConfig{Runs: 6, Active: 3}); err != nil {
		t.Fatal(err)
	}
	tr, err := ReadTrace(&b)
	if err != nil {
		t.Fatal(err)
	}
	for _, replicas := range []int{1, 4} {
		rep, err := Analyze(t.Context(), AnalyzeConfig{Trace: tr, Replicas: replicas, CacheBlocks: []int{600},
			Policies: []string{scoring.PolicyRoundRobin}})
		if err != nil {
			t.Fatal(err)
		}
		res := rep.Results[0]
		var n, cached int64
		for _, ts := range res.Turns {
			n += ts.Requests
			cached += ts.CachedTokens
		}
		if n != int64(rep.Requests) || cached != res.CachedTokens {
			t.Errorf("%d replicas: turns add up to %d requests, %d cached; want %d, %d", replicas, n, cached, rep.Requests, res.CachedTokens)
		}
		moved, later := res.Turns["moved"].Requests, res.Turns["moved"].Requests+res.Turns["stayed"].Requests
		if replicas == 1 && moved != 0 || replicas == 4 && moved < later/2 {
			t.Errorf("%d replicas: %d of %d later turns moved", replicas, moved, later)
		}
		if res.Turns["first"].Requests == 0 {
			t.Errorf("%d replicas: no first turns", replicas)
		}
	}
}

// RebindCost accounts for every rebind, by reason, and a replica the
// session was moved off held no more than the request's prompt.
func TestAnalyzeRebindCost(t *testing.T) {
	var b bytes.Buffer
	if err := WriteHarnessTrace(&b, HarnessTraceConfig{Runs: 12, Active: 6}); err != nil {
		t.Fatal(err)
	}
	tr, err := ReadTrace(&b)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Analyze(t.Context(), AnalyzeConfig{Trace: tr, Replicas: 4, CacheBlocks: []int{40},
		Policies: []string{scoring.PolicyWarmpath}})
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Results[0]
	if len(res.Rebinds) == 0 {
		t.Fatal("no rebinds to account for")
	}
	for reason, n := range res.Rebinds {
		c := res.RebindCost[reason]
		if c.Rebinds != n || c.Moved > c.Rebinds || c.HeldTokens < 0 || c.HeldTokens > rep.PromptTokens {
			t.Errorf("%s: %+v for %d rebinds", reason, c, n)
		}
	}
	if len(res.RebindCost) != len(res.Rebinds) {
		t.Errorf("RebindCost has %d reasons, Rebinds %d", len(res.RebindCost), len(res.Rebinds))
	}
}
