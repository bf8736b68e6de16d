package bench

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/scoring/blockindex"
	"github.com/warmpath/warmpath/vllmsim"
)

// ceilingBlockTokens is the block size of the ceiling computed from the
// prompts sent: the engines' and the gateway's index's 16 tokens.
const ceilingBlockTokens = 16

// Report is the outcome of a benchmark: one Result per policy, in the order
// run. Its JSON form is
//
//	{"workload": s, "config": [...], "params": [...], "results": [{"policy": s,
//	 "requests": n, "errors": n, "ttft_p50_ms": f, "ttft_p90_ms": f,
//	 "ttft_p99_ms": f, "output_tokens_per_s": f, "cached_fraction": f,
//	 "ceiling": f, "imbalance": f, …}]}
type Report struct {
	// Workload is the workload's name.
	Workload string `json:"workload"`
	// Config describes the run (fleet, scale, speed, seed) and Params the
	// workload, for display.
	Config []Param `json:"config"`
	Params []Param `json:"params"`
	// Started is when the run began; Wall is its wall-clock duration.
	Started time.Time     `json:"started"`
	Wall    time.Duration `json:"wall_ns"`
	// Results holds one entry per policy.
	Results []Result `json:"results"`
	// Mixed, for mixed-tenants, replaces the table and the JSON with its
	// own (see MixedReport); Results then holds one entry per part.
	Mixed *MixedReport `json:"-"`
}

// Result is one policy's figures. Times are simulated milliseconds
// (wall-clock × speed); rates are per simulated second. Latency and
// throughput cover the measured requests (warm-up excluded); the cached
// fraction and the ceiling cover every successful request.
type Result struct {
	// Policy is the routing policy, or "target".
	Policy string `json:"policy"`
	// Requests counts measured requests sent; Errors those that failed;
	// Warmup the warm-up requests sent besides.
	Requests int `json:"requests"`
	Errors   int `json:"errors"`
	Warmup   int `json:"warmup_requests"`
	// FirstError is the first failure's message, "" when none.
	FirstError string `json:"first_error,omitempty"`
	// ErrorKinds counts the failures by kind (failureKind): the status, or
	// what broke the request.
	ErrorKinds map[string]int `json:"error_kinds,omitempty"`
	// TTFT is time to the first content-bearing chunk of the stream, as
	// the client saw it (gateway included).
	TTFTP50Ms  float64 `json:"ttft_p50_ms"`
	TTFTP90Ms  float64 `json:"ttft_p90_ms"`
	TTFTP99Ms  float64 `json:"ttft_p99_ms"`
	TTFTMeanMs float64 `json:"ttft_mean_ms"`
	// EstimateErrorP50 and EstimateErrorP90 are the median and 90th
	// percentile of |estimated − measured| ÷ measured TTFT over the
	// measured requests the gateway estimated (Estimated of them): its
	// X-Warmpath-Estimate-TTFT against the client's TTFT; 0 without.
	EstimateErrorP50 float64 `json:"estimate_error_p50"`
	EstimateErrorP90 float64 `json:"estimate_error_p90"`
	Estimated        int     `json:"estimated"`
	// EngineEstimateErrorP50 and EngineEstimateErrorP90 are the same
	// against the engine's own TTFT (X-Sim-TTFT-Ms): the model's error
	// without the gateway's and the host's delays.
	EngineEstimateErrorP50 float64 `json:"engine_estimate_error_p50"`
	EngineEstimateErrorP90 float64 `json:"engine_estimate_error_p90"`
	// EngineTTFT is the replicas' own X-Sim-TTFT-Ms (from when the engine
	// saw the request, on its simulated clock): TTFT without the gateway
	// and the host's scheduling delays.
	EngineTTFTP50Ms float64 `json:"engine_ttft_p50_ms"`
	EngineTTFTP90Ms float64 `json:"engine_ttft_p90_ms"`
	// E2E is the whole request, send to last byte.
	// Outside breaks TTFT down into the engine's, the gateway's phases
	// and the rest (see Outside); nil without the gateway's timing.
	Outside  *Outside `json:"outside,omitempty"`
	E2EP50Ms float64  `json:"e2e_p50_ms"`
	E2EP90Ms float64  `json:"e2e_p90_ms"`
	// OutputTokensPerS and RequestsPerS are output tokens and completed
	// requests divided by the makespan (first measured send to last
	// measured completion, MakespanS seconds). Output tokens are counted
	// full-size: the tokens generated ÷ Scale, so that runs at any scale
	// compare with each other and with full-size fleets.
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	RequestsPerS     float64 `json:"requests_per_s"`
	MakespanS        float64 `json:"makespan_s"`
	// CachedFraction is Σ cached_tokens ÷ Σ prompt_tokens over the
	// responses; Ceiling is the workload's own ceiling (an unlimited
	// cache shared by the fleet, Ceiling over the prompts sent, in 16-token
	// blocks); OfCeiling is their ratio.
	CachedFraction float64 `json:"cached_fraction"`
	Ceiling        float64 `json:"ceiling"`
	OfCeiling      float64 `json:"of_ceiling"`
	// LRUCeiling is a finite-capacity yardstick: the cached fraction of
	// one ideal LRU cache as large as the whole fleet's KV cache, fed the
	// same prompts in the same order (prompt blocks only; 0 when the
	// fleet's capacity is unknown). No router can pool the replicas'
	// caches, so cached fractions above it are rare.
	LRUCeiling   float64 `json:"lru_ceiling,omitempty"`
	PromptTokens int64   `json:"prompt_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	// Imbalance is max ÷ mean of the prefill tokens computed per replica
	// (PrefillTokens); ImbalanceSource says whence: "engine" (the
	// simulator's counters), "responses" (prompt − cached tokens of the
	// responses, by the replica the gateway named) or "" (unknown).
	Imbalance       float64   `json:"imbalance"`
	ImbalanceSource string    `json:"imbalance_source"`
	PrefillTokens   []float64 `json:"prefill_tokens_per_replica"`
	// Preemptions and Evictions sum the simulated engines' counters.
	Preemptions int64 `json:"preemptions"`
	Evictions   int64 `json:"evictions"`
	// Mispredicted, TokenizerAvoided and TokenizerCalls are the gateway's
	// warmpath_mispredicted_hits_total, warmpath_tokenizer_avoided_total
	// and warmpath_tokenizer_calls_total{result="ok"}.
	Mispredicted     float64 `json:"mispredicted_hits"`
	TokenizerAvoided float64 `json:"tokenizer_avoided"`
	TokenizerCalls   float64 `json:"tokenizer_calls"`
	// Reasons counts routing reasons from the gateway's debug headers
	// (sticky, scored, …).
	Reasons map[string]int `json:"reasons,omitempty"`
	// Gateway holds every warmpath_* counter and gauge of the gateway's
	// registry at the end of the run; with several gateways, counters are
	// summed and gauges averaged over them.
	Gateway map[string]float64 `json:"gateway,omitempty"`
	// GatewayDecisions counts each gateway's routing decisions, when
	// several shared the run.
	GatewayDecisions []float64 `json:"gateway_decisions,omitempty"`
	// Load samples the simulated engines once a simulated second (empty
	// for external fleets).
	Load []LoadSample `json:"load,omitempty"`
	// Classes breaks TTFT down by session class when the workload has
	// more than one.
	Classes []ClassResult `json:"classes,omitempty"`
	// TTFTP90Ratio is round-robin's p90 TTFT ÷ this one's, and
	// ThroughputRatio this output rate ÷ round-robin's; 0 without a
	// round-robin result.
	TTFTP90Ratio    float64 `json:"ttft_p90_vs_round_robin"`
	ThroughputRatio float64 `json:"throughput_vs_round_robin"`

	samples []sample
	// loadNames are the replicas' names (as the gateway names them) in
	// Load's order.
	loadNames []string
	ttfts     []float64 // measured TTFTs, seconds
	t0        time.Time // when the driver started, wall-clock
	speed     float64
	// redisKeys is how many keys the run left on Config.RedisAddr (deleted
	// after it); 0 with the in-process Redis.
	redisKeys int
}

// LoadSample is the simulated engines' state at one instant: T simulated
// seconds from the start of the run, and per replica the engine's waiting
// queue, running batch and KV-cache use (0..1).
type LoadSample struct {
	T       float64   `json:"t"`
	Waiting []int     `json:"waiting"`
	Running []int     `json:"running"`
	KVUsage []float64 `json:"kv_usage"`
}

// setLoad converts the sampler's wall-clock points to the run's simulated
// time axis.
func (r *Result) setLoad(points []loadPoint) {
	for _, p := range points {
		if p.at.Before(r.t0) {
			continue
		}
		r.Load = append(r.Load, LoadSample{T: p.at.Sub(r.t0).Seconds() * r.speed, Waiting: p.waiting, Running: p.running, KVUsage: p.kv})
	}
}

// ClassResult is one session class's latency: its completed measured
// requests and their TTFT percentiles in simulated milliseconds.
type ClassResult struct {
	// Class is Session.Class ("" for the default class).
	Class     string  `json:"class"`
	Requests  int     `json:"requests"`
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP90Ms float64 `json:"ttft_p90_ms"`
	TTFTP99Ms float64 `json:"ttft_p99_ms"`
}

// percentile returns the p-th percentile (0..100) of sorted values by
// linear interpolation between closest ranks (NumPy's default); NaN for no
// values.
func percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	if n == 1 {
		return sorted[0]
	}
	r := p / 100 * float64(n-1)
	lo := int(math.Floor(r))
	if lo >= n-1 {
		return sorted[n-1]
	}
	if lo < 0 {
		return sorted[0]
	}
	f := r - float64(lo)
	return sorted[lo] + f*(sorted[lo+1]-sorted[lo])
}

// finiteOr0 maps NaN and infinities to 0, for JSON.
func finiteOr0(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// summarize computes a policy's figures from its samples.
func summarize(policy string, samples []sample, scale float64) *Result {
	slices.SortFunc(samples, func(a, b sample) int { return cmp.Compare(a.start, b.start) })
	r := &Result{Policy: policy, samples: samples, Reasons: map[string]int{}}
	var ttft, eng, e2e, errs, engErrs []float64
	var first, last time.Duration = -1, 0
	completed := 0
	byClass := map[string][]float64{}
	for i := range samples {
		s := &samples[i]
		if s.ok() {
			r.PromptTokens += int64(s.promptTokens)
			r.CachedTokens += int64(s.cachedTokens)
		}
		if s.reason != "" {
			r.Reasons[s.reason]++
		}
		if s.warmup {
			r.Warmup++
			continue
		}
		r.Requests++
		if !s.ok() {
			r.Errors++
			if r.FirstError == "" {
				r.FirstError = s.err
			}
			if r.ErrorKinds == nil {
				r.ErrorKinds = map[string]int{}
			}
			r.ErrorKinds[failureKind(s.err)]++
			continue
		}
		completed++
		r.OutputTokens += int64(s.outputTokens)
		ttft = append(ttft, msOf(s.ttft))
		byClass[s.class] = append(byClass[s.class], msOf(s.ttft))
		if s.engineTTFT >= 0 {
			eng = append(eng, msOf(s.engineTTFT))
		}
		e2e = append(e2e, msOf(s.e2e))
		if s.estimate >= 0 && s.ttft > 0 {
			errs = append(errs, math.Abs(float64(s.estimate-s.ttft))/float64(s.ttft))
		}
		if s.estimate >= 0 && s.engineTTFT > 0 {
			engErrs = append(engErrs, math.Abs(float64(s.estimate-s.engineTTFT))/float64(s.engineTTFT))
		}
		if first < 0 || s.start < first {
			first = s.start
		}
		last = max(last, s.end)
	}
	for _, v := range [][]float64{ttft, eng, e2e, errs, engErrs} {
		slices.Sort(v)
	}
	r.Estimated = len(errs)
	r.EstimateErrorP50, r.EstimateErrorP90 = finiteOr0(percentile(errs, 50)), finiteOr0(percentile(errs, 90))
	r.EngineEstimateErrorP50, r.EngineEstimateErrorP90 = finiteOr0(percentile(engErrs, 50)), finiteOr0(percentile(engErrs, 90))
	r.TTFTP50Ms, r.TTFTP90Ms, r.TTFTP99Ms = finiteOr0(percentile(ttft, 50)), finiteOr0(percentile(ttft, 90)), finiteOr0(percentile(ttft, 99))
	r.EngineTTFTP50Ms, r.EngineTTFTP90Ms = finiteOr0(percentile(eng, 50)), finiteOr0(percentile(eng, 90))
	r.E2EP50Ms, r.E2EP90Ms = finiteOr0(percentile(e2e, 50)), finiteOr0(percentile(e2e, 90))
	r.Outside = outsideOf(samples, r.TTFTP90Ms)
	if len(ttft) > 0 {
		var sum float64
		for _, v := range ttft {
			sum += v
		}
		r.TTFTMeanMs = sum / float64(len(ttft))
	}
	r.ttfts = make([]float64, len(ttft))
	for i, v := range ttft {
		r.ttfts[i] = v / 1000
	}
	if first >= 0 && last > first {
		span := (last - first).Seconds()
		r.MakespanS = span
		r.OutputTokensPerS = float64(r.OutputTokens) / scale / span
		r.RequestsPerS = float64(completed) / span
	}
	if r.PromptTokens > 0 {
		r.CachedFraction = float64(r.CachedTokens) / float64(r.PromptTokens)
	}
	if len(byClass) > 1 {
		for _, c := range slices.Sorted(mapKeys(byClass)) {
			v := byClass[c]
			slices.Sort(v)
			r.Classes = append(r.Classes, ClassResult{Class: c, Requests: len(v),
				TTFTP50Ms: finiteOr0(percentile(v, 50)), TTFTP90Ms: finiteOr0(percentile(v, 90)), TTFTP99Ms: finiteOr0(percentile(v, 99))})
		}
	}
	return r
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// setPrefill records per-replica prefill tokens and their imbalance.
func (r *Result) setPrefill(prefill []float64, source string) {
	r.PrefillTokens, r.ImbalanceSource = prefill, source
	var sum, hi float64
	for _, v := range prefill {
		sum += v
		hi = max(hi, v)
	}
	if len(prefill) > 0 && sum > 0 {
		r.Imbalance = hi / (sum / float64(len(prefill)))
	}
}

// setPrefillFromSamples estimates per-replica prefill from the responses:
// prompt − cached tokens, by the replica the gateway (or simulator) named.
// names lists the replicas expected (URLs or host:port names); replicas
// seen in responses but not listed are added.
func (r *Result) setPrefillFromSamples(names []string) {
	by := map[string]float64{}
	for _, n := range names {
		by[strings.TrimPrefix(strings.TrimPrefix(strings.TrimRight(n, "/"), "http://"), "https://")] = 0
	}
	seen := false
	for i := range r.samples {
		s := &r.samples[i]
		if s.ok() && s.replica != "" {
			by[s.replica] += float64(s.promptTokens - s.cachedTokens)
			seen = true
		}
	}
	if !seen {
		return
	}
	var prefill []float64
	for _, k := range slices.Sorted(mapKeys(by)) {
		prefill = append(prefill, by[k])
	}
	r.setPrefill(prefill, "responses")
}

// promptMemo caches the ceiling's view of prompts (token count and block
// keys) across the policies of one run, by prompt key.
type promptMemo struct {
	m map[string]promptBlocks
}

type promptBlocks struct {
	tokens int
	blocks []uint64
}

func newPromptMemo() *promptMemo { return &promptMemo{m: map[string]promptBlocks{}} }

// blocks returns the prompt of s as the ceiling sees it.
func (pm *promptMemo) blocks(s *sample) promptBlocks {
	key := s.promptKey
	if key == "" {
		n := 0
		for _, m := range s.messages {
			n += len(m.Content)
		}
		key = fmt.Sprintf("s%d/t%d/%d", s.session, s.turn, n)
	}
	if pb, ok := pm.m[key]; ok {
		return pb
	}
	toks := vllmsim.TokenizeChat(s.messages, s.tools, true)
	pb := promptBlocks{tokens: len(toks), blocks: blockindex.Hasher{BlockSize: ceilingBlockTokens}.AppendKeys(nil, toks, blockindex.Root{})}
	pm.m[key] = pb
	return pb
}

// finishCeiling computes the ceilings over the successful requests, in the
// order they were sent, and drops the prompts. fleetBlocks is the fleet's
// KV capacity in 16-token blocks, 0 when unknown.
func (r *Result) finishCeiling(pm *promptMemo, fleetBlocks int) {
	reqs := make([]TraceRequest, 0, len(r.samples))
	for i := range r.samples {
		s := &r.samples[i]
		if !s.ok() {
			continue
		}
		pb := pm.blocks(s)
		reqs = append(reqs, TraceRequest{Arrival: s.start, InputTokens: pb.tokens, OutputTokens: s.outputTokens, Blocks: pb.blocks})
	}
	r.Ceiling = Ceiling(reqs, ceilingBlockTokens, 0).Fraction
	if fleetBlocks > 0 {
		r.LRUCeiling = fleetLRUCeiling(reqs, fleetBlocks)
	}
	if r.Ceiling > 0 {
		r.OfCeiling = r.CachedFraction / r.Ceiling
	}
	for i := range r.samples {
		r.samples[i].messages, r.samples[i].tools = nil, nil
	}
}

// fleetLRUCeiling returns the cached fraction of one LRU cache of capacity
// blocks (16 tokens each) fed reqs in order: a request hits the leading run
// of its blocks found in the cache (in whole blocks, as the engines count),
// then its blocks are touched last block first, so that prefixes outlive
// suffixes as in vLLM's free queue, and the least recently used are
// evicted.
func fleetLRUCeiling(reqs []TraceRequest, capacity int) float64 {
	type node struct {
		key        uint64
		prev, next *node
	}
	var head node // sentinel: head.next is the most recent
	head.prev, head.next = &head, &head
	nodes := make(map[uint64]*node, capacity)
	unlink := func(n *node) { n.prev.next, n.next.prev = n.next, n.prev }
	front := func(n *node) { n.prev, n.next = &head, head.next; head.next.prev = n; head.next = n }
	var hit, total int64
	for i := range reqs {
		r := &reqs[i]
		k := 0
		for _, key := range r.Blocks {
			if _, ok := nodes[key]; !ok {
				break
			}
			k++
		}
		hit += int64(min(k*ceilingBlockTokens, max(0, r.InputTokens-1)))
		total += int64(r.InputTokens)
		for j := len(r.Blocks) - 1; j >= 0; j-- {
			key := r.Blocks[j]
			n, ok := nodes[key]
			if ok {
				unlink(n)
			} else {
				n = &node{key: key}
				nodes[key] = n
			}
			front(n)
		}
		for len(nodes) > capacity {
			old := head.prev
			unlink(old)
			delete(nodes, old.key)
		}
	}
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}

// compare fills the ratios against round-robin.
func (rep *Report) compare() {
	i := slices.IndexFunc(rep.Results, func(r Result) bool { return r.Policy == scoring.PolicyRoundRobin })
	if i < 0 {
		return
	}
	base := rep.Results[i]
	for j := range rep.Results {
		r := &rep.Results[j]
		if r.TTFTP90Ms > 0 {
			r.TTFTP90Ratio = base.TTFTP90Ms / r.TTFTP90Ms
		}
		if base.OutputTokensPerS > 0 {
			r.ThroughputRatio = r.OutputTokensPerS / base.OutputTokensPerS
		}
	}
}

// reportConfig describes the run for reports.
func reportConfig(cfg Config, p vllmsim.Profile, external bool) []Param {
	ps := []Param{{"workload", cfg.Workload}, {"policies", strings.Join(cfg.Policies, ", ")}}
	switch {
	case cfg.Target != "":
		ps = append(ps, Param{"endpoint", cfg.Target})
	case len(cfg.Fleet) > 0:
		ps = append(ps, Param{"fleet", strings.Join(cfg.Fleet, ", ")})
	}
	if !external {
		ps = append(ps,
			Param{"fleet", fmt.Sprintf("%d simulated replicas, %d KV blocks × %d tokens each%s", cfg.Replicas, p.KVBlocks, p.BlockSize, cpuParam(cfg))},
			Param{"profile", fmt.Sprintf("%s: step %v + %v/prefill token + %v/seq + %v/context token; %d batched tokens, %d seqs",
				p.Name, p.StepBase, p.PrefillPerToken, p.DecodePerSeq, p.DecodePerContextToken, p.MaxNumBatchedTokens, p.MaxNumSeqs)})
	}
	if cfg.Target == "" {
		ps = append(ps, Param{"gateways", fmt.Sprintf("%d (sharing one Redis; requests spread over them in turn)", cfg.Gateways)})
	}
	ps = append(ps,
		Param{"scale", strconv.FormatFloat(cfg.Scale, 'g', -1, 64)},
		Param{"speed", fmt.Sprintf("%g (times are simulated: wall-clock × speed)", cfg.Speed)},
		Param{"stage scale", strconv.FormatFloat(cfg.StageScale, 'g', -1, 64)},
		Param{"seed", strconv.FormatInt(cfg.Seed, 10)},
	)
	return ps
}

// fmtMs formats simulated milliseconds for the table.
func fmtMs(ms float64) string {
	switch {
	case ms <= 0:
		return "–"
	case ms < 1000:
		return fmt.Sprintf("%.0f ms", ms)
	case ms < 100_000:
		return fmt.Sprintf("%.2f s", ms/1000)
	}
	return fmt.Sprintf("%.0f s", ms/1000)
}

// fmtRatio formats a ratio against round-robin ("62× better", "2.1×").
func fmtRatio(v float64, better bool) string {
	if v <= 0 {
		return ""
	}
	prec := 2
	if v >= 10 {
		prec = 0
	} else if v >= 3 {
		prec = 1
	}
	s := strconv.FormatFloat(v, 'f', prec, 64) + "×"
	if better {
		switch {
		case v > 1.005:
			s += " better"
		case v < 0.995:
			s = strconv.FormatFloat(1/v, 'f', prec, 64) + "× worse"
		}
	}
	return "(" + s + ")"
}

func pct(v float64) string { return fmt.Sprintf("%.1f %%", 100*v) }

func pctOrDash(v float64) string {
	if v <= 0 {
		return "–"
	}
	return pct(v)
}

// WriteTable writes the results as an aligned text table with ratios
// against round-robin.
func (rep *Report) WriteTable(w io.Writer) error {
	if rep.Mixed != nil {
		return rep.Mixed.writeTable(w)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "workload %s", rep.Workload)
	for _, p := range rep.Config {
		switch p.Name {
		case "scale", "seed", "stage scale":
			fmt.Fprintf(&b, " · %s %s", p.Name, p.Value)
		case "speed":
			fmt.Fprintf(&b, " · speed %s", strings.Fields(p.Value)[0])
		case "gateways":
			if g := strings.Fields(p.Value)[0]; g != "1" {
				fmt.Fprintf(&b, " · %s gateways", g)
			}
		}
	}
	fmt.Fprintf(&b, " · wall %v\n", rep.Wall.Round(time.Second))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\treqs\terr\tTTFT p50\tTTFT p90\t\tTTFT p99\tE2E p90\tout tok/s\t\treq/s\tcached\tceiling\tof ceil\tLRU ceil\timbal\tmispred\ttok avoided\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.0f\t%s\t%.2f\t%s\t%s\t%s\t%s\t%.2f\t%.0f\t%.0f\t\n",
			r.Policy, r.Requests, r.Errors, fmtMs(r.TTFTP50Ms), fmtMs(r.TTFTP90Ms), fmtRatio(r.TTFTP90Ratio, true),
			fmtMs(r.TTFTP99Ms), fmtMs(r.E2EP90Ms), r.OutputTokensPerS, fmtRatio(r.ThroughputRatio, false),
			r.RequestsPerS, pct(r.CachedFraction), pct(r.Ceiling), pct(r.OfCeiling), pctOrDash(r.LRUCeiling), r.Imbalance, r.Mispredicted, r.TokenizerAvoided)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rep.Results {
		if r.Estimated > 0 {
			fmt.Fprintf(&b, "%s: TTFT estimate error |estimated − measured| ÷ measured p50 %.1f%%, p90 %.1f%% (%d requests); against the engine's own TTFT p50 %.1f%%, p90 %.1f%%\n",
				r.Policy, 100*r.EstimateErrorP50, 100*r.EstimateErrorP90, r.Estimated, 100*r.EngineEstimateErrorP50, 100*r.EngineEstimateErrorP90)
		}
	}
	for _, r := range rep.Results {
		if o := r.Outside; o != nil {
			fmt.Fprintf(&b, "%s: TTFT p50 / mean over p90 tail: engine %s / %s, gateway prepare %s / %s, queue %s / %s, route %s / %s, host %s / %s, after %s / %s; tail reasons %v\n",
				r.Policy, fmtMs(o.Engine.P50Ms), fmtMs(o.Engine.TailMeanMs), fmtMs(o.Prepare.P50Ms), fmtMs(o.Prepare.TailMeanMs),
				fmtMs(o.Queue.P50Ms), fmtMs(o.Queue.TailMeanMs), fmtMs(o.Route.P50Ms), fmtMs(o.Route.TailMeanMs),
				fmtMs(o.Host.P50Ms), fmtMs(o.Host.TailMeanMs), fmtMs(o.After.P50Ms), fmtMs(o.After.TailMeanMs), o.TailReasons)
		}
	}
	for _, r := range rep.Results {
		if r.Errors > 0 {
			fmt.Fprintf(&b, "%s: %d errors %v, first: %s\n", r.Policy, r.Errors, r.ErrorKinds, r.FirstError)
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}

// WriteJSON writes the report as indented JSON.
func (rep *Report) WriteJSON(w io.Writer) error {
	if rep.Mixed != nil {
		return rep.Mixed.writeJSON(w)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteJSONFile writes the report's JSON to path.
func (rep *Report) WriteJSONFile(path string) error {
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		return fmt.Errorf("bench: json: %w", err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("bench: json: %w", err)
	}
	return nil
}

// Charts returns the report's charts: TTFT CDFs per policy and the cached
// fraction over time per policy.
func (rep *Report) Charts() []Chart {
	cdf := Chart{Title: "TTFT distribution (measured requests)", XLabel: "TTFT (simulated seconds, log scale)",
		YLabel: "fraction of requests", LogX: true, YMin: 0, YMax: 1}
	cached := Chart{Title: "Fleet cached-prefix fraction over time", XLabel: "simulated seconds since start",
		YLabel: "cached ÷ prompt tokens (per window)", YMin: 0, YMax: 1}
	var end time.Duration // the last completion of any policy
	for i := range rep.Results {
		end = max(end, rep.Results[i].lastEnd())
	}
	for i := range rep.Results {
		r := &rep.Results[i]
		ttfts := make([]float64, len(r.ttfts))
		for j, v := range r.ttfts {
			ttfts[j] = max(v, 1e-3)
		}
		cdf.Series = append(cdf.Series, CDF(r.Policy, ttfts))
		cached.Series = append(cached.Series, r.cachedOverTime(end/40))
	}
	charts := []Chart{cdf, cached}
	queue := Chart{Title: "Engine waiting queue, longest across replicas", XLabel: "simulated seconds since start",
		YLabel: "requests waiting (max over replicas)"}
	for i := range rep.Results {
		r := &rep.Results[i]
		if len(r.Load) == 0 {
			continue
		}
		s := Series{Name: r.Policy}
		for _, l := range r.Load {
			s.X = append(s.X, l.T)
			s.Y = append(s.Y, float64(slices.Max(l.Waiting)))
		}
		queue.Series = append(queue.Series, s)
	}
	if len(queue.Series) > 0 {
		charts = append(charts, queue)
	}
	return charts
}

// lastEnd is when the last successful request completed.
func (r *Result) lastEnd() time.Duration {
	var end time.Duration
	for i := range r.samples {
		if r.samples[i].ok() {
			end = max(end, r.samples[i].end)
		}
	}
	return end
}

// cachedOverTime buckets the successful requests by completion time into
// windows of the given width and returns each window's cached fraction.
func (r *Result) cachedOverTime(width time.Duration) Series {
	s := Series{Name: r.Policy}
	if width <= 0 {
		return s
	}
	n := int(r.lastEnd()/width) + 1
	cachedTok, prompt := make([]float64, n), make([]float64, n)
	for i := range r.samples {
		x := &r.samples[i]
		if !x.ok() {
			continue
		}
		k := min(n-1, int(x.end/width))
		cachedTok[k] += float64(x.cachedTokens)
		prompt[k] += float64(x.promptTokens)
	}
	for k := range n {
		if prompt[k] == 0 {
			continue
		}
		s.X = append(s.X, (float64(k)+0.5)*width.Seconds())
		s.Y = append(s.Y, cachedTok[k]/prompt[k])
	}
	return s
}

// WriteHTML writes a self-contained HTML report: the configuration, the
// results table and the charts as inline SVG.
func (rep *Report) WriteHTML(w io.Writer) error {
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		return err
	}
	var charts []template.HTML
	for _, c := range rep.Charts() {
		charts = append(charts, template.HTML(c.SVG())) // SVG escapes its own text
	}
	type row struct {
		Result
		TTFTP50, TTFTP90, TTFTP99, E2EP90, Ratio, TRatio, Cached, Ceil, Of, LRU string
	}
	var rows []row
	for _, r := range rep.Results {
		rows = append(rows, row{Result: r, TTFTP50: fmtMs(r.TTFTP50Ms), TTFTP90: fmtMs(r.TTFTP90Ms), TTFTP99: fmtMs(r.TTFTP99Ms),
			E2EP90: fmtMs(r.E2EP90Ms), Ratio: fmtRatio(r.TTFTP90Ratio, true), TRatio: fmtRatio(r.ThroughputRatio, false),
			Cached: pct(r.CachedFraction), Ceil: pct(r.Ceiling), Of: pct(r.OfCeiling), LRU: pctOrDash(r.LRUCeiling)})
	}
	return htmlReport.Execute(w, map[string]any{"R": rep, "Rows": rows, "Charts": charts, "Table": table.String()})
}

// WriteHTMLDir writes the HTML report to dir/index.html, creating dir.
func (rep *Report) WriteHTMLDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bench: report: %w", err)
	}
	var b bytes.Buffer
	if err := rep.WriteHTML(&b); err != nil {
		return fmt.Errorf("bench: report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "index.html"), b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("bench: report: %w", err)
	}
	return nil
}

// htmlReport is parsed once; templates are immutable after parsing.
var htmlReport = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>warmpath bench: {{.R.Workload}}</title>
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border-bottom:1px solid #ddd;padding:.3em .6em;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.params td{text-align:left}.muted{color:#777}pre{background:#f8f8f8;padding:1em;overflow-x:auto}
figure{margin:1.5em 0}
</style></head><body>
<h1>warmpath bench — {{.R.Workload}}</h1>
<p class="muted">Started {{.R.Started.Format "2006-01-02 15:04:05 MST"}}. All times are simulated (wall-clock × speed); ratios are against round-robin.</p>
<h2>Results</h2>
<table><tr><th>policy</th><th>requests</th><th>errors</th><th>TTFT p50</th><th>TTFT p90</th><th>vs RR</th><th>TTFT p99</th><th>E2E p90</th><th>output tok/s</th><th>vs RR</th><th>req/s</th><th>cached</th><th>ceiling</th><th>of ceiling</th><th>LRU ceiling</th><th>imbalance</th><th>mispredicted</th><th>tokenizer avoided</th></tr>
{{range .Rows}}<tr><td>{{.Policy}}</td><td>{{.Requests}}</td><td>{{.Errors}}</td><td>{{.TTFTP50}}</td><td>{{.TTFTP90}}</td><td>{{.Ratio}}</td><td>{{.TTFTP99}}</td><td>{{.E2EP90}}</td><td>{{printf "%.0f" .OutputTokensPerS}}</td><td>{{.TRatio}}</td><td>{{printf "%.2f" .RequestsPerS}}</td><td>{{.Cached}}</td><td>{{.Ceil}}</td><td>{{.Of}}</td><td>{{.LRU}}</td><td>{{printf "%.2f" .Imbalance}}</td><td>{{printf "%.0f" .Mispredicted}}</td><td>{{printf "%.0f" .TokenizerAvoided}}</td></tr>
{{end}}</table>
{{range .Charts}}<figure>{{.}}</figure>
{{end}}
<h2>Configuration</h2>
<table class="params">{{range .R.Config}}<tr><td>{{.Name}}</td><td>{{.Value}}</td></tr>{{end}}</table>
<h2>Workload</h2>
<table class="params">{{range .R.Params}}<tr><td>{{.Name}}</td><td>{{.Value}}</td></tr>{{end}}</table>
<h2>Terminal table</h2>
<pre>{{.Table}}</pre>
</body></html>
`))

// failureKind classes a failed request's message for Result.ErrorKinds:
// "status 502 upstream_error" for an error answer (its status and the
// envelope's code), "stream error upstream_error" for an error event,
// and otherwise the message with the request's URL taken out.
func failureKind(msg string) string {
	var status int
	if n, _ := fmt.Sscanf(msg, "status %d:", &status); n == 1 {
		return strings.TrimSpace(fmt.Sprintf("status %d %s", status, envelopeCode(msg)))
	}
	if rest, ok := strings.CutPrefix(msg, "stream error: "); ok {
		return strings.TrimSpace("stream error " + envelopeCode(rest))
	}
	if i := strings.Index(msg, `": `); strings.HasPrefix(msg, "Post ") && i > 0 {
		return msg[i+3:] // net/http's `Post "URL": cause`
	}
	return msg
}

// envelopeCode is the code of the first OpenAI error envelope in s, or "".
func envelopeCode(s string) string {
	i := strings.IndexByte(s, '{')
	if i < 0 {
		return ""
	}
	var e struct {
		Error struct {
			Code any `json:"code"`
		} `json:"error"`
	}
	if json.NewDecoder(strings.NewReader(s[i:])).Decode(&e) != nil || e.Error.Code == nil {
		return ""
	}
	return fmt.Sprint(e.Error.Code)
}

// sampleRecord is one request of a run as WriteSamples writes it. Times
// are simulated milliseconds from the run's start (or of the request).
type sampleRecord struct {
	Policy       string   `json:"policy"`
	Session      int      `json:"session"`
	Turn         int      `json:"turn"`
	Class        string   `json:"class,omitempty"`
	Tenant       string   `json:"tenant,omitempty"`
	Warmup       bool     `json:"warmup,omitempty"`
	StartMs      float64  `json:"start_ms"`
	TTFTMs       float64  `json:"ttft_ms"`
	E2EMs        float64  `json:"e2e_ms"`
	EngineTTFTMs float64  `json:"engine_ttft_ms"`
	QueueMs      float64  `json:"queue_ms"`
	PrepareMs    *float64 `json:"prepare_ms,omitempty"`
	RouteMs      *float64 `json:"route_ms,omitempty"`
	EstimateMs   *float64 `json:"estimate_ms,omitempty"`
	Replica      string   `json:"replica,omitempty"`
	Reason       string   `json:"reason,omitempty"`
	PromptTokens int      `json:"prompt_tokens"`
	CachedTokens int      `json:"cached_tokens"`
	Predicted    int      `json:"predicted_tokens"`
	OutputTokens int      `json:"output_tokens"`
	Error        string   `json:"error,omitempty"`
}

// WriteSamples writes every request of every policy's run as JSON lines
// (sampleRecord), in start order, for analysis outside the report.
func (rep *Report) WriteSamples(w io.Writer) error {
	enc := json.NewEncoder(w)
	for _, r := range rep.Results {
		for i := range r.samples {
			if err := enc.Encode(r.samples[i].record(r.Policy)); err != nil {
				return err
			}
		}
	}
	return nil
}

// WriteLoad writes every result's sampled engine state as JSON lines,
// one per sample: the policy (or part), the replicas' names in the order
// of the per-replica fields, and the LoadSample.
func (rep *Report) WriteLoad(w io.Writer) error {
	enc := json.NewEncoder(w)
	type line struct {
		Policy   string   `json:"policy"`
		Replicas []string `json:"replicas"`
		LoadSample
	}
	for _, r := range rep.Results {
		for _, l := range r.Load {
			if err := enc.Encode(line{r.Policy, r.loadNames, l}); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *sample) record(policy string) sampleRecord {
	opt := func(d time.Duration) *float64 { v := ms(d); return &v }
	rec := sampleRecord{
		Policy: policy, Session: s.session, Turn: s.turn, Class: s.class, Tenant: s.tenant, Warmup: s.warmup,
		StartMs: ms(s.start), TTFTMs: ms(s.ttft), E2EMs: ms(s.e2e), EngineTTFTMs: ms(s.engineTTFT),
		QueueMs: ms(s.queueWait), Replica: s.replica, Reason: s.reason, PromptTokens: s.promptTokens,
		CachedTokens: s.cachedTokens, Predicted: s.predicted, OutputTokens: s.outputTokens, Error: s.err,
	}
	if s.timing != nil {
		rec.PrepareMs, rec.RouteMs = opt(s.timing.prepare), opt(s.timing.route)
	}
	if s.estimate >= 0 {
		rec.EstimateMs = opt(s.estimate)
	}
	return rec
}
