package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/scoring"
)

func TestBlockLRU(t *testing.T) {
	l := newBlockLRU(8, 3)
	l.touch([]int32{0, 1})
	// Touched deepest first: 0, the shared beginning, is the most recent.
	if got, want := l.oldest(), []int32{1, 0}; !slices.Equal(got, want) {
		t.Fatalf("order = %v; want %v", got, want)
	}
	l.touch([]int32{2, 3}) // adds 3 then 2; 2 overflows and evicts 1
	if got, want := l.oldest(), []int32{0, 3, 2}; !slices.Equal(got, want) {
		t.Fatalf("order after eviction = %v; want %v", got, want)
	}
	if l.contains(1) {
		t.Error("evicted id 1 still cached")
	}
	l.touch([]int32{0}) // 0 becomes the most recent
	l.touch([]int32{4}) // evicts 3
	if got, want := l.oldest(), []int32{2, 0, 4}; !slices.Equal(got, want) {
		t.Fatalf("order = %v; want %v", got, want)
	}
	tests := []struct {
		ids  []int32
		want int
	}{
		{[]int32{2, 0, 4}, 3},
		{[]int32{0, 1, 4}, 1}, // stops at the first miss, though 4 is cached
		{[]int32{3, 0}, 0},
		{nil, 0},
	}
	for _, tt := range tests {
		if got := l.prefix(tt.ids); got != tt.want {
			t.Errorf("prefix(%v) = %d; want %d", tt.ids, got, tt.want)
		}
	}
	// A request longer than the cache keeps its beginning.
	l.touch([]int32{5, 6, 7, 1, 3})
	if got, want := l.oldest(), []int32{7, 6, 5}; !slices.Equal(got, want) {
		t.Errorf("order after a long request = %v; want %v", got, want)
	}
	l.reset(2)
	if l.n != 0 || len(l.oldest()) != 0 || l.contains(5) {
		t.Errorf("reset left %d entries", l.n)
	}
}

func TestSimReplicaDrains(t *testing.T) {
	rp := &simReplica{rate: 1000, cache: newBlockLRU(4, 10), refs: make([]int32, 4)}
	rp.reset(10)
	// 2,000 tokens at 1,000 tokens/s: starts at once, ends at 2s, then
	// decodes for 10s.
	if d := rp.admit(0, []int32{0, 1}, 2000, 2000, 1, 10); d != 0 {
		t.Errorf("first request waits %vs; want 0", d)
	}
	rp.advance(0)
	// The second queues behind it: starts at 2s, ends at 3s.
	if d := rp.admit(0.5, []int32{0, 2}, 1000, 500, 1, 0.5); d != 1.5 {
		t.Errorf("second request waits %vs; want 1.5", d)
	}
	rp.advance(0.5)
	type state struct {
		waiting, running int
		inflight, est    int64
		queued, kv       float64
	}
	steps := []struct {
		at   float64
		want state
	}{
		{0.5, state{1, 1, 2, 2500, 2500, 0.3}}, // blocks 0,1 + 1 output
		{1, state{1, 1, 2, 2500, 2000, 0.3}},   // drained 500 more tokens
		{2.5, state{0, 2, 2, 500, 500, 0.5}},   // 0,1,2 shared once + 2 outputs
		{3, state{0, 2, 2, 0, 0, 0.5}},         // second prefill done at 3s
		{3.5, state{0, 1, 1, 0, 0, 0.3}},       // second decode done at 3.5s
		{12, state{0, 0, 0, 0, 0, 0}},          // first decode done at 12s
	}
	for _, s := range steps {
		rp.advance(s.at)
		e := rp.endpoint("r", scoring.Saturation{}.WithDefaults(), s.at, 16)
		got := state{e.Waiting, e.Running, e.InflightRequests, e.InflightPrefillTokens, rp.queued(s.at), e.KVUsage}
		if math.Abs(got.kv-s.want.kv) < 1e-9 {
			got.kv = s.want.kv
		}
		if got != s.want {
			t.Errorf("at %vs: got %+v; want %+v", s.at, got, s.want)
		}
	}
	if rp.computed != 3000 {
		t.Errorf("computed %d prefill tokens; want 3000", rp.computed)
	}
}

func TestSimReplicaSaturation(t *testing.T) {
	tests := []struct {
		name string
		n    int   // requests admitted at once
		est  int   // gateway estimate each
		ids  int32 // distinct blocks each, of a 100-block cache
		want bool
	}{
		{"idle", 0, 0, 0, false},
		// One request runs; the rest wait.
		{"waiting below the threshold", scoring.DefaultMaxWaiting, 100, 0, false},
		{"waiting at the threshold", scoring.DefaultMaxWaiting + 1, 100, 0, true},
		{"prefill tokens", 2, scoring.DefaultMaxInflightPrefillTokens/2 + 1, 0, true},
		{"kv", 1, 100, int32(scoring.DefaultMaxKVUsage * 100), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rp := &simReplica{rate: 1000, cache: newBlockLRU(100, 100), refs: make([]int32, 100)}
			rp.reset(100)
			for range tt.n {
				ids := make([]int32, tt.ids)
				for i := range ids {
					ids[i] = int32(i)
				}
				rp.admit(0, ids, 100, tt.est, 0, 1)
			}
			rp.advance(0)
			if got := rp.endpoint("r", scoring.Saturation{}.WithDefaults(), 0, 16).Saturated; got != tt.want {
				t.Errorf("Saturated = %v; want %v (endpoint %+v)", got, tt.want, rp.endpoint("r", scoring.Saturation{}.WithDefaults(), 0, 16))
			}
		})
	}
}

func loadHead(t testing.TB) *Trace {
	t.Helper()
	tr, err := ReadTraceFile("testdata/mooncake_head400.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestAnalyzeHead(t *testing.T) {
	tr := loadHead(t)
	rep, err := Analyze(t.Context(), AnalyzeConfig{Trace: tr, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", table.String())

	pols, sizes := scoring.Policies(), DefaultCacheBlocks(MooncakeBlockTokens)
	if !slices.Equal(sizes, []int{150, 300, 600, 1200, 2400, 4800}) {
		t.Errorf("default cache sizes = %v; want 150…4800", sizes)
	}
	if len(rep.Results) != len(pols)*len(sizes) {
		t.Fatalf("got %d results; want %d", len(rep.Results), len(pols)*len(sizes))
	}
	if rep.Requests != 400 || rep.Window != DefaultAnalyzeWindow || rep.Replicas != 8 {
		t.Errorf("report header = %d requests, window %v, %d replicas", rep.Requests, rep.Window, rep.Replicas)
	}
	get := func(p string, cb int) AnalyzeResult {
		r, ok := rep.result(p, cb)
		if !ok {
			t.Fatalf("no result for %s at %d", p, cb)
		}
		return r
	}
	var rrSum, wpSum float64
	for _, cb := range sizes {
		for _, p := range pols {
			r := get(p, cb)
			if r.CachedFraction > rep.CeilingUnlimited.Fraction+1e-9 {
				t.Errorf("%s at %d: cached %.4f beats the unlimited ceiling %.4f", p, cb, r.CachedFraction, rep.CeilingUnlimited.Fraction)
			}
			if r.Imbalance < 1 || r.MeanQueueSeconds < 0 || r.MaxQueueSeconds < r.P99QueueSeconds {
				t.Errorf("%s at %d: implausible %+v", p, cb, r)
			}
		}
		rr, wp, pp := get(scoring.PolicyRoundRobin, cb), get(scoring.PolicyWarmpath, cb), get(scoring.PolicyPrecisePrefix, cb)
		rrSum += rr.CachedFraction
		wpSum += wp.CachedFraction
		// Round-robin spreads requests evenly; what is left is the spread
		// of prompt sizes over 400 requests.
		if rr.Imbalance > 1.35 {
			t.Errorf("round-robin imbalance at %d = %.2f; want ≈ 1", cb, rr.Imbalance)
		}
		// Every request shares block 0, but it is 512 tokens of ~14k: the
		// prefix score it earns is small beside the queue and KV scores,
		// so precise-prefix does not pile onto one replica on this trace
		// (see TestAnalyzeHotPrefix for a trace where it does).
		if pp.Imbalance > 2 {
			t.Errorf("precise-prefix imbalance at %d = %.2f; want no pile-up on this trace", cb, pp.Imbalance)
		}
		if cb >= 600 && wp.CachedFraction <= rr.CachedFraction {
			t.Errorf("warmpath cached %.4f ≤ round-robin's %.4f at %d blocks", wp.CachedFraction, rr.CachedFraction, cb)
		}
		if ap := get(scoring.PolicyApproxPrefix, cb); ap.PredictedTokens == 0 {
			t.Errorf("approx-prefix at %d predicted no hit: the approximate index matched nothing", cb)
		}
	}
	if wpSum < rrSum {
		t.Errorf("warmpath's cached fractions sum to %.4f < round-robin's %.4f", wpSum, rrSum)
	}

	again, err := Analyze(t.Context(), AnalyzeConfig{Trace: tr, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rep, again) {
		t.Error("Analyze is not deterministic for a fixed seed")
	}
}

// hotPrefixTrace returns n Mooncake requests, gap apart, each of shared
// blocks common to all followed by unique fresh ones.
func hotPrefixTrace(n int, gap time.Duration, shared, unique int) *Trace {
	t := &Trace{Format: FormatMooncake, BlockTokens: MooncakeBlockTokens}
	next := int64(shared)
	for i := range n {
		var ids []int64
		for b := range shared {
			ids = append(ids, int64(b))
		}
		for range unique {
			ids = append(ids, next)
			next++
		}
		t.Requests = append(t.Requests, TraceRequest{
			Arrival: time.Duration(i) * gap, InputTokens: MooncakeBlockTokens * len(ids), OutputTokens: 300,
			HashIDs: ids, Blocks: chainIDs(ids),
		})
	}
	return t
}

// TestAnalyzeHotPrefix checks that the simulator shows the hot-spotting of
// prefix-only routing: with 12k shared tokens in every 16k prompt, the
// replica holding the prefix outscores the rest whatever its queue.
func TestAnalyzeHotPrefix(t *testing.T) {
	rep, err := Analyze(t.Context(), AnalyzeConfig{
		Trace:       hotPrefixTrace(600, 200*time.Millisecond, 24, 8),
		CacheBlocks: []int{600},
		Policies:    []string{scoring.PolicyRoundRobin, scoring.PolicyPrecisePrefix, scoring.PolicyWarmpath},
		Seed:        1,
	})
	if err != nil {
		t.Fatal(err)
	}
	rr, pp, wp := rep.Results[0], rep.Results[1], rep.Results[2]
	t.Logf("imbalance / mean queue: round-robin %.2f / %.2fs, precise-prefix %.2f / %.2fs, warmpath %.2f / %.2fs",
		rr.Imbalance, rr.MeanQueueSeconds, pp.Imbalance, pp.MeanQueueSeconds, wp.Imbalance, wp.MeanQueueSeconds)
	if pp.Imbalance < 6 {
		t.Errorf("precise-prefix imbalance = %.2f; want a pile-up (near 8)", pp.Imbalance)
	}
	if rr.Imbalance > 1.1 {
		t.Errorf("round-robin imbalance = %.2f; want ≈ 1", rr.Imbalance)
	}
	if wp.MeanQueueSeconds > pp.MeanQueueSeconds/5 {
		t.Errorf("warmpath mean queue %.2fs; want far below precise-prefix's %.2fs", wp.MeanQueueSeconds, pp.MeanQueueSeconds)
	}
	// It spreads just enough: the queue stays short while most requests
	// still find the shared prefix.
	if wp.CachedFraction < (rr.CachedFraction+pp.CachedFraction)/2 {
		t.Errorf("warmpath cached %.3f; want nearer precise-prefix's %.3f than round-robin's %.3f", wp.CachedFraction, pp.CachedFraction, rr.CachedFraction)
	}
}

// TestAnalyzeOneReplicaIsTheCeiling checks the cache model against the
// ceiling: one replica with room for everything caches exactly what the
// unlimited ceiling counts, whatever the policy.
func TestAnalyzeOneReplicaIsTheCeiling(t *testing.T) {
	tr := loadHead(t)
	window := time.Duration(0)
	rep, err := Analyze(t.Context(), AnalyzeConfig{Trace: tr, Replicas: 1, CacheBlocks: []int{1 << 20}, Window: &window})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Window != 0 || rep.Ceiling != rep.CeilingUnlimited {
		t.Errorf("window 0 is not unlimited: %v, %+v vs %+v", rep.Window, rep.Ceiling, rep.CeilingUnlimited)
	}
	for _, r := range rep.Results {
		if r.CachedTokens != rep.Ceiling.CachedTokens {
			t.Errorf("%s: cached %d tokens; want the ceiling's %d", r.Policy, r.CachedTokens, rep.Ceiling.CachedTokens)
		}
		if r.Imbalance != 1 {
			t.Errorf("%s: imbalance %v on one replica; want 1", r.Policy, r.Imbalance)
		}
	}
	if got := rep.PooledLRU[0].CachedFraction; got != rep.Ceiling.Fraction {
		t.Errorf("pooled LRU %v; want the ceiling %v", got, rep.Ceiling.Fraction)
	}
}

func TestAnalyzeTimeScale(t *testing.T) {
	tr := loadHead(t)
	run := func(scale float64) AnalyzeResult {
		rep, err := Analyze(t.Context(), AnalyzeConfig{Trace: tr, TimeScale: scale, CacheBlocks: []int{600}, Policies: []string{scoring.PolicyRoundRobin}})
		if err != nil {
			t.Fatal(err)
		}
		return rep.Results[0]
	}
	sparse, dense := run(1), run(0.25)
	if dense.MeanQueueSeconds <= sparse.MeanQueueSeconds {
		t.Errorf("4× denser traffic queues %.3fs; want more than %.3fs", dense.MeanQueueSeconds, sparse.MeanQueueSeconds)
	}
	// Round-robin's cache hits do not depend on timing.
	if dense.CachedTokens != sparse.CachedTokens {
		t.Errorf("round-robin cached %d tokens at 4× density; want %d", dense.CachedTokens, sparse.CachedTokens)
	}
}

func TestAnalyzeChatLog(t *testing.T) {
	system := `{"role":"system","content":"` + strings.Repeat("You are a careful assistant. ", 20) + `"}`
	turn := func(ms int, user string, history ...string) string {
		msgs := append([]string{system}, history...)
		msgs = append(msgs, `{"role":"user","content":"`+user+`"}`)
		return `{"timestamp": ` + strconv.Itoa(ms) + `, "model":"m", "max_tokens": 20, "messages":[` + strings.Join(msgs, ",") + `]}`
	}
	long := strings.Repeat("tell me more about it ", 30)
	a1 := `{"role":"user","content":"first question"}`
	b1 := `{"role":"user","content":"another topic"}`
	answer := `{"role":"assistant","content":"` + long + `"}`
	lines := []string{
		turn(0, "first question"),
		turn(100, "another topic"),
		turn(1000, long, a1, answer),
		turn(1100, long, b1, answer),
		turn(2000, "and then?", a1, answer, `{"role":"user","content":"`+long+`"}`, answer),
	}
	tr, err := ReadTrace(strings.NewReader(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, len(tr.Requests))
	for i := range tr.Requests {
		keys[i] = sessionKey(tr.Format, &tr.Requests[i])
	}
	if keys[0] == "" || keys[0] != keys[2] || keys[0] != keys[4] || keys[1] != keys[3] || keys[0] == keys[1] {
		t.Errorf("session keys %q: want turns of a conversation to share a key and conversations to differ", keys)
	}
	rep, err := Analyze(t.Context(), AnalyzeConfig{Trace: tr, Replicas: 2, Policies: []string{scoring.PolicyWarmpath, scoring.PolicySessionHash}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.cacheSizes(), []int{4802, 9604, 19208, 38416, 76832, 153664}) {
		t.Errorf("chat-log cache sizes = %v; want the 16-token-block sizes", rep.cacheSizes())
	}
	for _, r := range rep.Results {
		if r.CachedFraction == 0 || r.CachedFraction > rep.CeilingUnlimited.Fraction+1e-9 {
			t.Errorf("%s: cached fraction %.3f; want in (0, %.3f]", r.Policy, r.CachedFraction, rep.CeilingUnlimited.Fraction)
		}
		if r.Policy == scoring.PolicyWarmpath && r.StickyShare == 0 {
			t.Errorf("warmpath never took the sticky path: %+v", r)
		}
	}
}

func TestAnalyzeConfigErrors(t *testing.T) {
	tr := loadHead(t)
	neg := -time.Second
	tests := []struct {
		name string
		cfg  AnalyzeConfig
	}{
		{"no trace", AnalyzeConfig{}},
		{"negative window", AnalyzeConfig{Trace: tr, Window: &neg}},
		{"negative replicas", AnalyzeConfig{Trace: tr, Replicas: -1}},
		{"zero cache", AnalyzeConfig{Trace: tr, CacheBlocks: []int{0, 10}}},
		{"empty sweep", AnalyzeConfig{Trace: tr, CacheBlocks: []int{}}},
		{"unknown policy", AnalyzeConfig{Trace: tr, Policies: []string{"fastest"}}},
		{"negative rate", AnalyzeConfig{Trace: tr, PrefillTokensPerSec: -1}},
		{"negative scale", AnalyzeConfig{Trace: tr, TimeScale: -2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Analyze(t.Context(), tt.cfg); err == nil {
				t.Error("Analyze succeeded; want an error")
			}
		})
	}
}

func TestAnalyzeCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := Analyze(ctx, AnalyzeConfig{Trace: loadHead(t)})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v; want context.Canceled", err)
	}
}

func TestAnalyzeReportJSON(t *testing.T) {
	rep, err := Analyze(t.Context(), AnalyzeConfig{Trace: loadHead(t), CacheBlocks: []int{300, 600}, Policies: []string{scoring.PolicyRoundRobin, scoring.PolicyWarmpath}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Ceiling      *float64 `json:"ceiling"`
		Requests     *int     `json:"requests"`
		PromptTokens *int64   `json:"prompt_tokens"`
		Results      []struct {
			Policy         *string  `json:"policy"`
			CacheBlocks    *int     `json:"cache_blocks"`
			CachedFraction *float64 `json:"cached_fraction"`
			Imbalance      *float64 `json:"imbalance"`
		} `json:"results"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.Ceiling == nil || *got.Ceiling != rep.Ceiling.Fraction || got.Requests == nil || *got.Requests != 400 ||
		got.PromptTokens == nil || *got.PromptTokens != rep.PromptTokens || len(got.Results) != 4 {
		t.Fatalf("JSON header wrong: %s", b)
	}
	for i, r := range got.Results {
		if r.Policy == nil || r.CacheBlocks == nil || r.CachedFraction == nil || r.Imbalance == nil {
			t.Fatalf("result %d lacks a required field: %s", i, b)
		}
		want := rep.Results[i]
		if *r.Policy != want.Policy || *r.CacheBlocks != want.CacheBlocks || *r.CachedFraction != want.CachedFraction || *r.Imbalance != want.Imbalance {
			t.Errorf("result %d = %s/%d/%v/%v; want %+v", i, *r.Policy, *r.CacheBlocks, *r.CachedFraction, *r.Imbalance, want)
		}
	}
	var generic map[string]any
	if err := json.Unmarshal(b, &generic); err != nil {
		t.Fatal(err)
	}
	if _, ok := generic["ceiling"].(float64); !ok {
		t.Errorf(`"ceiling" is %T; want a number`, generic["ceiling"])
	}
}

func TestAnalyzeReportOutputs(t *testing.T) {
	rep, err := Analyze(t.Context(), AnalyzeConfig{Trace: loadHead(t), CacheBlocks: []int{300, 600}, Policies: []string{scoring.PolicyRoundRobin, scoring.PolicyWarmpath}})
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ceiling (window 10m)", "round-robin", "warmpath", "pooled LRU", "\n           300", "\n           600"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	for _, c := range []Chart{rep.Plot(), rep.ImbalancePlot()} {
		counts := walkSVG(t, c.SVG())
		if counts["polyline"] < 2 {
			t.Errorf("chart %q draws %d lines; want one per policy at least", c.Title, counts["polyline"])
		}
	}
	if n := len(rep.Plot().Series); n != 2+2+1 {
		t.Errorf("cached-fraction chart has %d series; want 2 policies, 2 ceilings and the pooled LRU", n)
	}
}

func TestAnalyzeFailingWriter(t *testing.T) {
	rep := &AnalyzeReport{Results: []AnalyzeResult{{Policy: "p", CacheBlocks: 1}}}
	if err := rep.WriteTable(failWriter{}); err == nil {
		t.Error("WriteTable to a failing writer succeeded")
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// BenchmarkAnalyzeMooncake replays the shared Mooncake trace through every
// policy at the default cache sizes.
func BenchmarkAnalyzeMooncake(b *testing.B) {
	tr, err := ReadTraceFile(sharedTrace(b))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var rep *AnalyzeReport
	for b.Loop() {
		if rep, err = Analyze(b.Context(), AnalyzeConfig{Trace: tr, Seed: 1}); err != nil {
			b.Fatal(err)
		}
	}
	simulated := float64(len(tr.Requests) * len(rep.Results))
	b.ReportMetric(simulated*float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// TestAnalyzeCPUTier checks the CPU offload tier: behind a one-block GPU
// cache, a tier with room for everything caches exactly what the
// unlimited ceiling counts (almost all of it loaded from CPU); on 8
// replicas a tier raises every policy's cached fraction, precise policies
// see it (their predictions include CPU hits), and no tier leaves the
// results as they were.
func TestAnalyzeCPUTier(t *testing.T) {
	tr := loadHead(t)
	window := time.Duration(0)
	one, err := Analyze(t.Context(), AnalyzeConfig{Trace: tr, Replicas: 1, CacheBlocks: []int{1}, CPUBlocks: 1 << 20, Window: &window})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range one.Results {
		if r.CachedTokens != one.Ceiling.CachedTokens || r.CPUCachedTokens == 0 || r.CPUCachedTokens > r.CachedTokens {
			t.Errorf("%s: cached %d tokens, %d from CPU; want the ceiling's %d, nearly all from CPU", r.Policy, r.CachedTokens, r.CPUCachedTokens, one.Ceiling.CachedTokens)
		}
	}

	pols := []string{scoring.PolicyRoundRobin, scoring.PolicyPrecisePrefix, scoring.PolicyWarmpath}
	cfg := AnalyzeConfig{Trace: tr, CacheBlocks: []int{150}, Policies: pols, Seed: 1}
	without, err := Analyze(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.CPUBlocks = 1200
	with, err := Analyze(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := with.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "CPU offload tier: 1200 blocks") || !strings.Contains(table.String(), "cpu ") {
		t.Errorf("table does not show the CPU tier:\n%s", table.String())
	}
	for i, p := range pols {
		a, b := without.Results[i], with.Results[i]
		t.Logf("%s: cached %.1f%% without a CPU tier, %.1f%% with (%.1f%% from CPU)", p, 100*a.CachedFraction, 100*b.CachedFraction, 100*b.CPUFraction)
		if a.CPUCachedTokens != 0 || b.CachedFraction <= a.CachedFraction || b.CPUFraction == 0 {
			t.Errorf("%s: without a tier %+v; with one %+v", p, a, b)
		}
		if p != scoring.PolicyRoundRobin && b.PredictedTokens <= a.PredictedTokens {
			t.Errorf("%s: predicted %d tokens with a CPU tier, %d without; want CPU hits predicted", p, b.PredictedTokens, a.PredictedTokens)
		}
	}
	if _, err := Analyze(t.Context(), AnalyzeConfig{Trace: tr, CPUBlocks: -1}); err == nil {
		t.Error("a negative CPU tier was accepted")
	}
}
