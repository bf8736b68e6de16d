package bench

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/warmpath/warmpath/gateway"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/scoring/blockindex"
	"github.com/warmpath/warmpath/session"
	"github.com/warmpath/warmpath/vllmsim"
)

// Defaults of AnalyzeConfig.
const (
	// DefaultAnalyzeWindow is the ceiling's window when AnalyzeConfig.Window
	// is nil.
	DefaultAnalyzeWindow = 10 * time.Minute
	// DefaultAnalyzeReplicas is the simulated fleet size.
	DefaultAnalyzeReplicas = 8
	// DefaultPrefillTokensPerSec is each simulated replica's prefill rate:
	// that of vllmsim's default profile (Qwen3-32B on 2×H100,
	// PrefillPerToken = 1s ÷ 15,000).
	DefaultPrefillTokensPerSec = 15000
)

// Constants of the simulated fleet, mirrored from the gateway and vllmsim.
const (
	// decodeTokenTime is the time a simulated replica spends per generated
	// token: vllmsim's default profile takes about 15 ms per decode step
	// with 32 sequences of 4k context (vllmsim/profile.go).
	decodeTokenTime = 15 * time.Millisecond
	// sessionTTL is how long a session binding outlives its last refresh.
	sessionTTL = gateway.DefaultSessionTTL
	// analyzeModel is the model name every simulated request asks for.
	analyzeModel = vllmsim.DefaultModel
)

// AnalyzeConfig configures Analyze. Only Trace is required; every other
// field has a default.
type AnalyzeConfig struct {
	// Trace is the request log to replay.
	Trace *Trace
	// Window is the ceiling's window (see Ceiling): nil means
	// DefaultAnalyzeWindow (10m), a zero duration means unlimited.
	Window *time.Duration
	// Replicas is the simulated fleet size; 0 means DefaultAnalyzeReplicas
	// (8).
	Replicas int
	// CacheBlocks lists the per-replica prefix-cache sizes to sweep, in
	// trace blocks; nil means ¼×, ½×, 1×, 2×, 4× and 8× the KV capacity of
	// vllmsim's default profile (307,328 tokens: 150, 300, 600, 1,200,
	// 2,400 and 4,800 blocks of a Mooncake trace; the larger sizes stand
	// for a CPU or SSD tier behind the GPU cache).
	CacheBlocks []int
	// Policies lists the routing policies to compare; nil means
	// scoring.Policies().
	Policies []string
	// PrefillTokensPerSec is each replica's prefill rate; 0 means
	// DefaultPrefillTokensPerSec (15,000).
	PrefillTokensPerSec float64
	// TimeScale multiplies arrival times: 0.5 replays the trace twice as
	// dense, 2 half as dense; 0 means 1 (as recorded). The ceiling's window
	// applies to the scaled times.
	TimeScale float64
	// Seed seeds the random tie-breaks; every policy and cache size gets
	// the same seed.
	Seed int64
	// CPUBlocks is the size, in trace blocks, of a CPU offload tier behind
	// each replica's cache (see cpuTier); 0 means none.
	CPUBlocks int
}

// AnalyzeReport is the outcome of Analyze.
type AnalyzeReport struct {
	// Format and BlockTokens describe the trace.
	Format      string
	BlockTokens int
	// Window is the ceiling's window, 0 for unlimited.
	Window time.Duration
	// Ceiling is the prefix-reuse ceiling within Window; CeilingUnlimited
	// the one with no window, which no cache of any size can beat.
	Ceiling, CeilingUnlimited CeilingResult
	// Requests and PromptTokens size the trace.
	Requests     int
	PromptTokens int64
	// Replicas, PrefillTokensPerSec, TimeScale and CPUBlocks are the
	// simulated fleet's settings, defaults filled in.
	Replicas            int
	PrefillTokensPerSec float64
	TimeScale           float64
	CPUBlocks           int
	// PooledLRU has one entry per cache size: the yardstick for a finite
	// cache (see PooledLRUResult).
	PooledLRU []PooledLRUResult
	// Results has one entry per (policy, cache size), policies in the
	// configured order, cache sizes ascending within each.
	Results []AnalyzeResult
}

// PooledLRUResult is the cached fraction of one LRU cache holding the whole
// fleet's Replicas × CacheBlocks blocks and seeing every request: what a
// router could expect if it could make the fleet's caches act as one. It is
// the yardstick at a finite cache size, where the ceiling (an unbounded
// cache) is out of reach for any router; it is not a strict bound (LRU is
// not an optimal eviction policy, and separate caches can occasionally
// beat a pooled one).
type PooledLRUResult struct {
	// CacheBlocks is the per-replica cache size; the pooled LRU holds
	// Replicas times as many blocks.
	CacheBlocks int `json:"cache_blocks"`
	// CachedFraction is the pooled LRU's share of prompt tokens cached.
	CachedFraction float64 `json:"cached_fraction"`
}

// AnalyzeResult is one policy's outcome at one cache size.
type AnalyzeResult struct {
	// Policy and CacheBlocks identify the run.
	Policy      string `json:"policy"`
	CacheBlocks int    `json:"cache_blocks"`
	// CachedFraction is the share of prompt tokens served from the chosen
	// replica's cache: Σ cached ÷ Σ prompt tokens.
	CachedFraction float64 `json:"cached_fraction"`
	// CeilingShare is CachedFraction ÷ the report's Ceiling.Fraction, and
	// PooledShare CachedFraction ÷ the pooled LRU's at the same cache size.
	CeilingShare float64 `json:"ceiling_share"`
	PooledShare  float64 `json:"pooled_share"`
	// Imbalance is max ÷ mean over replicas of the prefill tokens each
	// computed (1 is perfectly even; 8 on 8 replicas is all on one).
	Imbalance float64 `json:"imbalance"`
	// CachedTokens is the numerator of CachedFraction.
	CachedTokens int64 `json:"cached_tokens"`
	// ReplicaPrefillTokens holds each replica's computed prefill tokens.
	ReplicaPrefillTokens []int64 `json:"replica_prefill_tokens"`
	// MeanQueueSeconds, P99QueueSeconds and MaxQueueSeconds describe each
	// request's wait before its prefill started.
	MeanQueueSeconds float64 `json:"mean_queue_s"`
	P99QueueSeconds  float64 `json:"p99_queue_s"`
	MaxQueueSeconds  float64 `json:"max_queue_s"`
	// SaturatedShare is the fraction of requests routed to a replica that
	// was saturated at the time.
	SaturatedShare float64 `json:"saturated_share"`
	// StickyShare is the fraction of requests routed by the sticky fast
	// path (sticky policies only).
	StickyShare float64 `json:"sticky_share"`
	// Rebinds counts sessions moved off their bound replica, by reason:
	// scoring's "saturated" and "evicted", and "rescored" when scoring
	// chose another replica for a bound session.
	Rebinds map[string]int64 `json:"rebinds,omitempty"`
	// PredictedTokens is Σ of what the router believed the chosen replica
	// held (for policies that predict), to compare with CachedTokens.
	PredictedTokens int64 `json:"predicted_tokens"`
	// TTFTP50Seconds, TTFTP90Seconds and TTFTP99Seconds describe each
	// request's simulated time to first token: its wait before prefill
	// plus its own uncached prefill.
	TTFTP50Seconds float64 `json:"ttft_p50_s"`
	TTFTP90Seconds float64 `json:"ttft_p90_s"`
	TTFTP99Seconds float64 `json:"ttft_p99_s"`
	// EstimateErrorP50 and EstimateErrorP90 are the median and 90th
	// percentile of |estimated − simulated| ÷ simulated TTFT over the
	// decisions that carried an estimate (Estimated of them); 0 without.
	EstimateErrorP50 float64 `json:"estimate_error_p50"`
	EstimateErrorP90 float64 `json:"estimate_error_p90"`
	Estimated        int64   `json:"estimated"`
	// Predictions samples decisions with their estimate: predicted against
	// simulated TTFT.
	Predictions []Prediction `json:"predictions,omitempty"`
	// CPUCachedTokens is the part of CachedTokens loaded from the CPU
	// tier, and CPUFraction its share of prompt tokens (0 without a tier).
	CPUCachedTokens int64   `json:"cpu_cached_tokens,omitempty"`
	CPUFraction     float64 `json:"cpu_fraction,omitempty"`
}

// Prediction is one routing decision's estimated and simulated time to
// first token on the chosen replica.
type Prediction struct {
	// Request is the request's index in the trace; Replica and Reason the
	// decision.
	Request int    `json:"request"`
	Replica string `json:"replica"`
	Reason  string `json:"reason"`
	// QueuedTokens and UncachedTokens are the estimate's inputs (prefill
	// ahead, own uncached prompt as predicted) and CachedTokens the
	// simulated hit.
	QueuedTokens   int64 `json:"queued_tokens"`
	UncachedTokens int64 `json:"uncached_tokens"`
	CachedTokens   int   `json:"cached_tokens"`
	// EstimatedSeconds and SimulatedSeconds are the TTFTs.
	EstimatedSeconds float64 `json:"estimated_s"`
	SimulatedSeconds float64 `json:"simulated_s"`
}

// predictionSamples is how many decisions per result Predictions keeps,
// evenly spaced over the trace.
const predictionSamples = 8

// Analyze replays cfg.Trace offline through the gateway's own routing code
// against simulated replicas, once per (policy, cache size), each on a
// fresh fleet, and reports how much of the prompts each policy served from
// cache and how evenly it spread the prefill work, against the trace's
// prefix-reuse ceiling.
//
// # Model
//
// Each replica holds an LRU of CacheBlocks block keys (vLLM's prefix cache
// at block granularity). A request hits the longest run of its keys from
// block 0 held by the replica it is routed to; routing it then touches all
// its keys, deepest first (vLLM frees a request's blocks tail first, so
// shared beginnings outlive the conversations hanging from them), evicting
// the least recently used. Blocks enter the cache at routing time, as if
// the prefill completed at once, and stay evictable even while a request
// runs.
//
// Each replica is a FIFO queue of uncached prompt tokens drained at
// PrefillTokensPerSec, followed by a decode phase of OutputTokens × 15 ms
// that overlaps other requests (decode costs no prefill capacity). A
// request's TTFT is its wait before prefill plus its own prefill. The
// policies see, per replica: Waiting = routed requests whose prefill has
// not started (vLLM's waiting queue); Running = those prefilling or
// decoding; InflightRequests = all unfinished; InflightPrefillTokens = the
// gateway's estimate (prompt minus predicted hit) of the prefill work
// routed there that has no first token yet, as gateway/proxy.go counts it,
// with the head of that line and how long it has prefilled; KVUsage = the
// blocks referenced by running requests (distinct prompt blocks plus each
// one's output blocks) ÷ CacheBlocks, which is what vLLM and vllmsim
// report (an LRU prefix cache is always nearly full, so its occupancy
// would tell replicas apart only during warm-up); ArrivalRate,
// UncachedRate and RequestTokens from a scoring.Meter counting requests as
// their prefill starts (vLLM's queue-time histogram); CacheTokens the
// LRU's size; Saturated = the gateway's default thresholds.
//
// Routing is the gateway's own decision, scoring.Decide, given the
// simulated replicas as endpoints and the session's binding: precise
// policies see the replicas' LRUs exactly (a perfectly synchronised
// KV-event index), capped at InputTokens−1; approximate policies use a
// blockindex.Approx sized to CacheBlocks per replica and fed every scored
// decision (trace block keys stand in for its text chunks); sticky
// sessions keep the binding's tip (the last full block of the session's
// last scored turn; sticky turns do not move it) as the evidence the
// replica still holds the conversation, and, as the gateway does after
// each completed turn, the turn's full blocks as its cached tokens. The
// TTFT model's cost is a FIFO's (PrefillTokensPerSec, no step cost),
// calibrated as the gateway calibrates it, by each decision's simulated
// TTFT once its first token is due; the conversation statistics it reads
// (gaps, turns) are the trace's sessions', and the demand for a prefix
// (scoring.Input.Sharers) is counted, as the gateway counts it, over the
// requests scored with the prefix known, each under the key of the
// deepest block any replica holds of it. Session keys come from the
// gateway's request parser for chat logs; a Mooncake request carries no
// session, so its key is the key of its opening's last block (ReadTrace):
// the chain over the prefix its conversation shares with others and the
// first block where it parts from them. Every request asks for the same
// model and PromptTokens is exact (the gateway estimates it from text
// before tokenizing; a trace has no text to estimate from).
//
// Not simulated: decode interference with prefill, chunked-prefill
// batching, KV-bound admission, preemption, failures and retries, several
// gateways, metric staleness and KV-event lag.
func Analyze(ctx context.Context, cfg AnalyzeConfig) (*AnalyzeReport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	t := cfg.Trace
	window := *cfg.Window
	rep := &AnalyzeReport{
		Format:              t.Format,
		BlockTokens:         t.BlockTokens,
		Window:              window,
		Requests:            len(t.Requests),
		Replicas:            cfg.Replicas,
		PrefillTokensPerSec: cfg.PrefillTokensPerSec,
		TimeScale:           cfg.TimeScale,
		CPUBlocks:           cfg.CPUBlocks,
	}
	// Scaling arrivals by s scales their gaps by s: a window w over scaled
	// times is a window w/s over recorded ones.
	scaled := window
	if window > 0 {
		scaled = max(1, time.Duration(float64(window)/cfg.TimeScale))
	}
	rep.Ceiling = Ceiling(t.Requests, t.BlockTokens, scaled)
	rep.CeilingUnlimited = Ceiling(t.Requests, t.BlockTokens, 0)
	rep.PromptTokens = rep.Ceiling.PromptTokens

	in, err := newSimInput(t, cfg)
	if err != nil {
		return nil, err
	}
	fl := newSimFleet(cfg.Replicas, in.universe, cfg.PrefillTokensPerSec)
	fl.withCPU(in.universe, cfg.CPUBlocks)
	pooled := map[int]float64{}
	for _, cb := range cfg.CacheBlocks {
		pooled[cb] = pooledLRU(in, cfg.Replicas*(cb+cfg.CPUBlocks), rep.PromptTokens)
		rep.PooledLRU = append(rep.PooledLRU, PooledLRUResult{CacheBlocks: cb, CachedFraction: pooled[cb]})
	}
	for _, name := range cfg.Policies {
		for _, cb := range cfg.CacheBlocks {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("bench: analyze: %w", err)
			}
			pol, err := scoring.NewPolicy(name, nil)
			if err != nil {
				return nil, fmt.Errorf("bench: analyze: %w", err)
			}
			res, err := simulate(ctx, pol, cb, in, fl, cfg.Seed)
			if err != nil {
				return nil, err
			}
			res.CeilingShare = ratioF(res.CachedFraction, rep.Ceiling.Fraction)
			res.PooledShare = ratioF(res.CachedFraction, pooled[cb])
			rep.Results = append(rep.Results, res)
		}
	}
	return rep, nil
}

// withDefaults fills c's zero fields and validates it.
func (c AnalyzeConfig) withDefaults() (AnalyzeConfig, error) {
	if c.Trace == nil || len(c.Trace.Requests) == 0 {
		return c, errors.New("bench: analyze: no trace, or an empty one")
	}
	if c.Trace.BlockTokens <= 0 {
		return c, fmt.Errorf("bench: analyze: trace block size %d is not positive", c.Trace.BlockTokens)
	}
	if c.Window == nil {
		w := DefaultAnalyzeWindow
		c.Window = &w
	}
	if *c.Window < 0 {
		return c, fmt.Errorf("bench: analyze: negative window %v", *c.Window)
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultAnalyzeReplicas
	}
	if c.Replicas < 1 || c.Replicas > 1024 {
		return c, fmt.Errorf("bench: analyze: %d replicas is not in [1, 1024]", c.Replicas)
	}
	if c.CacheBlocks == nil {
		c.CacheBlocks = DefaultCacheBlocks(c.Trace.BlockTokens)
	}
	if len(c.CacheBlocks) == 0 {
		return c, errors.New("bench: analyze: no cache size to sweep")
	}
	c.CacheBlocks = slices.Clone(c.CacheBlocks)
	slices.Sort(c.CacheBlocks)
	c.CacheBlocks = slices.Compact(c.CacheBlocks)
	if c.CacheBlocks[0] < 1 {
		return c, fmt.Errorf("bench: analyze: cache size %d blocks is not positive", c.CacheBlocks[0])
	}
	if c.Policies == nil {
		c.Policies = scoring.Policies()
	}
	if len(c.Policies) == 0 {
		return c, errors.New("bench: analyze: no policy to compare")
	}
	for _, name := range c.Policies {
		if _, err := scoring.NewPolicy(name, nil); err != nil {
			return c, fmt.Errorf("bench: analyze: %w", err)
		}
	}
	if c.PrefillTokensPerSec == 0 {
		c.PrefillTokensPerSec = DefaultPrefillTokensPerSec
	}
	if !(c.PrefillTokensPerSec > 0) || math.IsInf(c.PrefillTokensPerSec, 0) {
		return c, fmt.Errorf("bench: analyze: prefill rate %v is not a positive number", c.PrefillTokensPerSec)
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.CPUBlocks < 0 {
		return c, fmt.Errorf("bench: analyze: negative CPU tier %d", c.CPUBlocks)
	}
	if !(c.TimeScale > 0) || math.IsInf(c.TimeScale, 0) {
		return c, fmt.Errorf("bench: analyze: time scale %v is not a positive number", c.TimeScale)
	}
	return c, nil
}

// DefaultCacheBlocks returns the cache sizes Analyze sweeps by default for
// a trace of blockTokens-token blocks: ¼×, ½×, 1×, 2×, 4× and 8× the KV
// capacity of vllmsim's default profile, in blocks.
func DefaultCacheBlocks(blockTokens int) []int {
	p := vllmsim.DefaultProfile()
	one := max(1, p.KVBlocks*p.BlockSize/max(1, blockTokens))
	return []int{max(1, one/4), max(1, one/2), one, 2 * one, 4 * one, 8 * one}
}

// simInput is the trace prepared once for every simulated run.
type simInput struct {
	blockTokens int
	reqs        []TraceRequest
	// arrival is each request's scaled arrival time in seconds.
	arrival []float64
	// ids holds each request's block keys as dense ids in [0, universe),
	// and approxKeys the same ids as non-zero keys for a
	// blockindex.Approx.
	ids        [][]int32
	approxKeys [][]uint64
	universe   int
	// sessions holds each request's session key, "" for none.
	sessions []string
}

func newSimInput(t *Trace, cfg AnalyzeConfig) (*simInput, error) {
	if t.Format == FormatMooncake && slices.ContainsFunc(t.Requests, func(r TraceRequest) bool { return r.Opening == 0 }) {
		// A trace built in memory rather than read: derive its openings.
		t = &Trace{Format: t.Format, BlockTokens: t.BlockTokens, Requests: slices.Clone(t.Requests)}
		setOpenings(t.Requests)
	}
	n := len(t.Requests)
	in := &simInput{
		blockTokens: t.BlockTokens,
		reqs:        t.Requests,
		arrival:     make([]float64, n),
		ids:         make([][]int32, n),
		approxKeys:  make([][]uint64, n),
		sessions:    make([]string, n),
	}
	total := 0
	for i := range t.Requests {
		total += len(t.Requests[i].Blocks)
	}
	flat := make([]int32, 0, total)
	flatKeys := make([]uint64, 0, total)
	dense := make(map[uint64]int32, total/2)
	for i := range t.Requests {
		r := &t.Requests[i]
		if r.InputTokens <= 0 {
			return nil, fmt.Errorf("bench: analyze: request %d has no prompt", i)
		}
		in.arrival[i] = r.Arrival.Seconds() * cfg.TimeScale
		start := len(flat)
		for _, k := range r.Blocks {
			id, ok := dense[k]
			if !ok {
				if in.universe >= math.MaxInt32-1 {
					return nil, errors.New("bench: analyze: too many distinct blocks")
				}
				id = int32(in.universe)
				dense[k] = id
				in.universe++
			}
			flat = append(flat, id)
			// Dense ids, not the trace's 64-bit keys, so that every key
			// is a valid non-zero blockindex key.
			flatKeys = append(flatKeys, uint64(id)+1)
		}
		in.ids[i] = flat[start:len(flat):len(flat)]
		in.approxKeys[i] = flatKeys[start:len(flatKeys):len(flatKeys)]
		in.sessions[i] = sessionKey(t.Format, r)
	}
	return in, nil
}

// sessionKey derives a request's session key as the gateway does: by
// parsing a chat request's body with the gateway's own parser (an
// unparseable body has no session). A Mooncake record (no body, no roles)
// never reaches a gateway, so its key is the analyzer's own stand-in for
// the gateway's opening hash: the key of the last block of its opening
// (see ReadTrace), the chain over the blocks it shares with other
// conversations and the first where it parts from them, which every later
// turn of the conversation repeats. A one-block Mooncake request has no
// session.
func sessionKey(format string, r *TraceRequest) string {
	if format != FormatOpenAI {
		if len(r.Blocks) < 2 {
			return ""
		}
		return "m:" + strconv.FormatUint(r.Blocks[max(1, r.Opening)-1], 16)
	}
	req, err := request.Parse(request.Chat, http.Header{}, r.Body, nil)
	if err != nil {
		return ""
	}
	return req.Session().Value
}

// pooledLRU returns the cached fraction of one LRU of capacity blocks that
// sees every request of in; prompt is their total prompt tokens.
func pooledLRU(in *simInput, capacity int, prompt int64) float64 {
	l := newBlockLRU(in.universe, capacity)
	var cached int64
	for i := range in.reqs {
		cached += int64(min(l.prefix(in.ids[i])*in.blockTokens, in.reqs[i].InputTokens))
		l.touch(in.ids[i])
	}
	return ratio(cached, prompt)
}

// binding is a session's binding as the gateway's session store holds it,
// built and checked by the same rules (session.After, Live, StillHeld,
// Completed). Its block keys are the analyzer's: a block's dense id plus
// one (simInput.approxKeys), so TipKey-1 is the tip's dense id. The
// analyzer fingerprints no text (TextLen stays 0): every turn of a
// session continues it (Input.Continues stays true).
type binding struct {
	session.Binding
	// done is when the session's last turn finished, simulated seconds:
	// the pause before the next turn is measured from it. The gateway
	// measures it from Updated, which it restamps when a turn completes;
	// the analyzer's Updated is the time of the plan's last write (see
	// remember).
	done float64
}

// epoch anchors the simulated clock for scoring.Input.Now.
var epoch = time.Unix(0, 0)

// simulate replays in through pol on a fresh fleet whose replicas cache
// cacheBlocks blocks each. Each request is routed by the gateway's own
// decision (scoring.Decide), with the simulated replicas as its
// endpoints: gather, decide, match the prefix when asked, decide again.
func simulate(ctx context.Context, pol *scoring.Policy, cacheBlocks int, in *simInput, fl *simFleet, seed int64) (AnalyzeResult, error) {
	res := AnalyzeResult{Policy: pol.Name, CacheBlocks: cacheBlocks}
	fl.reset(cacheBlocks)
	n := len(fl.reps)
	names := make([]string, n)
	for j := range names {
		names[j] = "replica-" + strconv.Itoa(j)
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x7761726d70617468)) // "warmpath"
	var approx *blockindex.Approx
	if pol.UsesApprox {
		a, err := blockindex.NewApprox(blockindex.ApproxConfig{Capacity: cacheBlocks})
		if err != nil {
			return res, fmt.Errorf("bench: analyze: %w", err)
		}
		approx = a
	}
	sat := scoring.Saturation{}.WithDefaults()
	cal := scoring.NewCalibrator(analyzeCost(fl.reps[0].rate))
	var pending observationHeap
	bindings := map[string]binding{}
	eps := make([]scoring.Endpoint, n)
	matched, matchedCPU := make([]int, n), make([]int, n)
	var hits []blockindex.Hit
	delays := make([]float64, len(in.reqs))
	ttfts := make([]float64, len(in.reqs))
	var errs []float64
	bt := in.blockTokens
	var sticky, saturated int64
	for i := range in.reqs {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return res, fmt.Errorf("bench: analyze: %w", err)
			}
		}
		r := &in.reqs[i]
		now := in.arrival[i]
		ids := in.ids[i]
		for len(pending) > 0 && pending[0].at <= now {
			o := heap.Pop(&pending).(observation)
			cal.Observe(analyzeModel, o.est, o.ttft)
		}
		for j, rp := range fl.reps {
			rp.advance(now)
			eps[j] = rp.endpoint(names[j], sat, now, bt)
		}
		key := in.sessions[i]
		din := scoring.Input{
			Now: epoch.Add(time.Duration(now * float64(time.Second))), Model: analyzeModel, SessionKey: key,
			Endpoints: eps, PromptTokens: r.InputTokens, BlockSize: bt, RefreshAfter: sessionTTL / 8,
			Continues: true, BoundHolds: true, Rand: rng, Cost: cal.Cost(analyzeModel),
		}
		b, bound := lookup(bindings, pol, key, din.Now)
		if bound {
			din.Binding = &b.Binding.Binding
			// The simulated index is perfectly synchronised: every
			// replica's evictions are seen, so none is trusted blindly as
			// the gateway trusts a replica that publishes no KV events.
			rp := fl.reps[slices.Index(names, b.Replica)]
			din.BoundHolds = b.StillHeld(func(tip uint64) bool { return rp.holds(int32(tip - 1)) })
		}
		if pol.Estimated && key != "" {
			turn := 1
			if bound {
				turn = b.Turns + 1
			}
			cal.ObserveTurn(analyzeModel, turn, now-b.done)
			st := cal.Sessions(analyzeModel)
			din.Sessions = &st
		}
		plan, err := pol.Decide(&din)
		if err == nil && plan.NeedsPrefix {
			din.Matched = matchPrefix(pol, fl, approx, in, i, names, matched, &hits)
			din.MatchedCPU = matchCPU(pol, fl, in, i, matched, matchedCPU)
			if pol.Estimated {
				din.Sharers = cal.ObservePrefix(analyzeModel, scoring.HeldPrefix(din.Matched, in.approxKeys[i], bt), now)
			}
			plan, err = pol.Decide(&din)
		}
		if err != nil {
			return res, fmt.Errorf("bench: analyze: route request %d: %w", i, err)
		}
		chosen, predicted := plan.Chosen(), plan.Predicted[0]

		if approx != nil && plan.Reason == scoring.ReasonScored {
			approx.Record(names[chosen], in.approxKeys[i])
		}
		if plan.Reason == scoring.ReasonSticky {
			sticky++
		}
		if plan.Rebind != "" {
			res.addRebind(plan.Rebind)
		}
		remember(bindings, key, &plan, b, in.approxKeys[i], r.InputTokens/bt, bt, din.Now, now+ttfts[i]+float64(r.OutputTokens)*decodeTokenTime.Seconds())
		if eps[chosen].Saturated {
			saturated++
		}
		rp := fl.reps[chosen]
		cached, cpu := rp.hit(ids, r.InputTokens, bt)
		rp.touch(ids)
		work := r.InputTokens - cached + loadCost(cpu)
		delays[i] = rp.admit(now, ids, work, max(0, r.InputTokens-predicted), (r.OutputTokens+bt-1)/bt, float64(r.OutputTokens)*decodeTokenTime.Seconds())
		ttfts[i] = delays[i] + float64(work)/rp.rate

		rp.advance(now)
		res.CachedTokens += int64(cached)
		res.CPUCachedTokens += int64(cpu)
		res.PredictedTokens += int64(predicted)
		if plan.Estimates != nil {
			est := plan.Estimates[0]
			// The gateway learns a request's TTFT when its first token
			// arrives.
			heap.Push(&pending, observation{at: now + ttfts[i], est: est, ttft: ttfts[i]})
			errs = append(errs, math.Abs(est.TTFT-ttfts[i])/max(ttfts[i], 1e-3))

			if k := len(in.reqs) / predictionSamples; k > 0 && i%k == k/2 && len(res.Predictions) < predictionSamples {
				res.Predictions = append(res.Predictions, Prediction{Request: i, Replica: names[chosen], Reason: plan.Reason,
					QueuedTokens: est.QueuedTokens, UncachedTokens: est.UncachedTokens, CachedTokens: cached,
					EstimatedSeconds: est.TTFT, SimulatedSeconds: ttfts[i]})
			}
		}
	}

	var prompt int64
	for i := range in.reqs {
		prompt += int64(in.reqs[i].InputTokens)
	}
	res.CachedFraction = ratio(res.CachedTokens, prompt)
	res.CPUFraction = ratio(res.CPUCachedTokens, prompt)
	res.ReplicaPrefillTokens = make([]int64, n)
	var sum, hi int64
	for j, rp := range fl.reps {
		res.ReplicaPrefillTokens[j] = rp.computed
		sum += rp.computed
		hi = max(hi, rp.computed)
	}
	res.Imbalance = 1
	if sum > 0 {
		res.Imbalance = float64(hi) * float64(n) / float64(sum)
	}
	slices.Sort(delays)
	var total float64
	for _, d := range delays {
		total += d
	}
	res.MeanQueueSeconds = total / float64(len(delays))
	res.P99QueueSeconds = delays[int(math.Ceil(0.99*float64(len(delays))))-1]
	res.MaxQueueSeconds = delays[len(delays)-1]
	slices.Sort(ttfts)
	res.TTFTP50Seconds, res.TTFTP90Seconds, res.TTFTP99Seconds = percentile(ttfts, 50), percentile(ttfts, 90), percentile(ttfts, 99)
	if len(errs) > 0 {
		slices.Sort(errs)
		res.Estimated = int64(len(errs))
		res.EstimateErrorP50, res.EstimateErrorP90 = percentile(errs, 50), percentile(errs, 90)
	}
	res.SaturatedShare = float64(saturated) / float64(len(in.reqs))
	res.StickyShare = float64(sticky) / float64(len(in.reqs))
	return res, nil
}

// analyzeCost is the TTFT model of a simulated replica: a FIFO of prefill
// at rate tokens per second, with no step overhead and no decode
// interference.
func analyzeCost(rate float64) scoring.Cost {
	return scoring.Cost{PrefillPerToken: 1 / rate, StepTokens: math.MaxInt32, TokenScale: 1, StepScale: 1}
}

// lookup returns the session's live binding, as the gateway's session
// store would (session.Binding.Live: it expires sessionTTL after its last
// write), for policies that bind the session (scoring.Policy.Binds).
func lookup(bindings map[string]binding, pol *scoring.Policy, key string, now time.Time) (binding, bool) {
	if !pol.Binds(key) {
		return binding{}, false
	}
	b, ok := bindings[key]
	if ok && !b.Live(now, sessionTTL) {
		delete(bindings, key)
		return binding{}, false
	}
	return b, ok
}

// matchPrefix answers the plan's request for prefix information: precise
// policies see the replicas' LRUs exactly (a perfectly synchronised
// KV-event index), approximate ones their approximate index; both capped
// at the prompt's length minus one, as the gateway's indexes are.
func matchPrefix(pol *scoring.Policy, fl *simFleet, approx *blockindex.Approx, in *simInput, i int, names []string, matched []int, hits *[]blockindex.Hit) []int {
	r := &in.reqs[i]
	bt := in.blockTokens
	switch {
	case pol.UsesPrecise:
		for j, rp := range fl.reps {
			matched[j] = min(rp.cache.prefix(in.ids[i])*bt, max(0, r.InputTokens-1))
		}
	case pol.UsesApprox:
		*hits = approx.Match(in.approxKeys[i], names, *hits)
		for j, h := range *hits {
			matched[j] = min(h.Blocks*bt, max(0, r.InputTokens-1))
		}
	}
	return matched
}

// remember writes the binding the plan leaves behind, by the gateway's
// rule (session.After, as its commit step): keys are the turn's block
// keys, of which the first fullBlocks are full. A scored turn's tip is its
// last full block: the gateway's keys cover full blocks only, so a
// partial last block (Mooncake) is not repeated by the conversation's
// next turn.
//
// What the analyzer does differently, on purpose: the gateway records
// what a sticky turn left cached when its response ends
// (rememberCompleted) and stamps Updated then, renewing the TTL; the
// analyzer records it at the decision, counting the prompt's full blocks
// and no output (its simulated replicas cache prompt blocks only), and
// stamps Updated only when the plan writes (BindRefresh, BindNew,
// BindReplace), so a sticky turn that needs no refresh leaves the TTL
// running from the last write.
func remember(bindings map[string]binding, key string, plan *scoring.Plan, b binding, keys []uint64, fullBlocks, bt int, now time.Time, done float64) {
	nb, ok := session.After(plan, b.Binding, keys[:min(len(keys), fullBlocks)])
	if !ok {
		return
	}
	if plan.Reason == scoring.ReasonSticky {
		nb.Completed(nb.Replica, fullBlocks*bt, 0)
	}
	if plan.Bind != scoring.BindKeep {
		nb.Updated = now
	}
	bindings[key] = binding{Binding: nb, done: done}
}

func (r *AnalyzeResult) addRebind(reason string) {
	if r.Rebinds == nil {
		r.Rebinds = map[string]int64{}
	}
	r.Rebinds[reason]++
}

// ratioF returns a ÷ b, or 0 when b is 0.
func ratioF(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// simFleet is the simulated replicas, reused across runs.
type simFleet struct {
	reps []*simReplica
}

func newSimFleet(n, universe int, rate float64) *simFleet {
	fl := &simFleet{reps: make([]*simReplica, n)}
	for j := range fl.reps {
		fl.reps[j] = &simReplica{rate: rate, cache: newBlockLRU(universe, 1), refs: make([]int32, universe)}
	}
	return fl
}

// reset empties every replica and sizes its cache to capacity blocks.
func (fl *simFleet) reset(capacity int) {
	for _, rp := range fl.reps {
		rp.reset(capacity)
	}
}

// simReplica is one simulated engine: a prefix cache, a FIFO prefill queue
// drained at rate tokens per second, and the requests decoding.
type simReplica struct {
	cache *blockLRU
	cpu   *blockLRU // the CPU offload tier, nil without one (see cpuTier)
	rate  float64
	// busyUntil is when the queued prefill work will be done.
	busyUntil float64
	// prefill holds the requests whose prefill has not finished, in order
	// (their start and end times are non-decreasing), from index head;
	// headStarted reports that prefill[head] has started and holds its
	// blocks.
	prefill     []prefillEntry
	head        int
	headStarted bool
	// decoding holds the requests past prefill, by finish time.
	decoding decodeHeap
	// estPrefill is the gateway's InflightPrefillTokens: Σ est of prefill.
	estPrefill int64
	// refs counts, per block id, the running requests using the block;
	// used is the number of blocks with a reference, and outBlocks the
	// blocks running requests hold for their output. Shared prompt blocks
	// count once, as in vLLM's paged KV cache.
	refs      []int32
	used      int
	outBlocks int
	// computed is the prefill tokens computed so far.
	computed int64
	// meter measures the replica's arrivals and their uncached prompt
	// tokens, as the gateway does from the engine's counters; meterAt is
	// the time it was last advanced to.
	meter   scoring.Meter
	meterAt float64
}

// prefillEntry is a request queued or prefilling on a replica.
type prefillEntry struct {
	start, end, decode float64
	est, work          int64
	ids                []int32
	out                int
}

// decodeEntry is a request decoding on a replica.
type decodeEntry struct {
	finish float64
	ids    []int32
	out    int
}

// observation is a decision's estimate and simulated TTFT, due to the
// calibrator when its first token is.
type observation struct {
	at, ttft float64
	est      scoring.Estimate
}

// observationHeap is a min-heap of observations by due time.
type observationHeap []observation

func (h observationHeap) Len() int           { return len(h) }
func (h observationHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h observationHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *observationHeap) Push(x any)        { *h = append(*h, x.(observation)) }
func (h *observationHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// decodeHeap is a min-heap of decodeEntry by finish time.
type decodeHeap []decodeEntry

func (h decodeHeap) Len() int           { return len(h) }
func (h decodeHeap) Less(i, j int) bool { return h[i].finish < h[j].finish }
func (h decodeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *decodeHeap) Push(x any)        { *h = append(*h, x.(decodeEntry)) }
func (h *decodeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (rp *simReplica) reset(capacity int) {
	rp.cache.reset(capacity)
	if rp.cpu != nil {
		rp.cpu.reset(rp.cpu.capacity)
	}
	clear(rp.refs)
	rp.busyUntil, rp.head, rp.headStarted, rp.estPrefill, rp.computed = 0, 0, false, 0, 0
	rp.meter, rp.meterAt = scoring.Meter{}, 0
	rp.used, rp.outBlocks = 0, 0
	rp.prefill = rp.prefill[:0]
	rp.decoding = rp.decoding[:0]
}

// advance moves the replica's clock to now: queued requests whose prefill
// started take their blocks, those whose prefill ended move to decode, and
// those whose decode ended release their blocks.
func (rp *simReplica) advance(now float64) {
	for rp.head < len(rp.prefill) && rp.prefill[rp.head].start <= now {
		e := &rp.prefill[rp.head]
		if !rp.headStarted {
			rp.hold(e.ids, e.out)
			rp.headStarted = true
			// The engine counts a request when it schedules it (vLLM's
			// queue-time histogram), with its uncached prompt.
			rp.meter.Advance(e.start - rp.meterAt)
			rp.meterAt = max(rp.meterAt, e.start)
			rp.meter.Add(1, float64(e.work))
		}
		if e.end > now {
			break
		}
		rp.head++
		rp.headStarted = false
		rp.estPrefill -= e.est
		if fin := e.end + e.decode; fin > now {
			heap.Push(&rp.decoding, decodeEntry{finish: fin, ids: e.ids, out: e.out})
		} else {
			rp.release(e.ids, e.out)
		}
	}
	if rp.head == len(rp.prefill) {
		rp.prefill, rp.head = rp.prefill[:0], 0
	} else if rp.head > 1024 && rp.head > len(rp.prefill)/2 {
		rp.prefill = rp.prefill[:copy(rp.prefill, rp.prefill[rp.head:])]
		rp.head = 0
	}
	for len(rp.decoding) > 0 && rp.decoding[0].finish <= now {
		e := heap.Pop(&rp.decoding).(decodeEntry)
		rp.release(e.ids, e.out)
	}
}

// hold references a starting request's prompt blocks and output blocks.
func (rp *simReplica) hold(ids []int32, out int) {
	for _, id := range ids {
		if rp.refs[id] == 0 {
			rp.used++
		}
		rp.refs[id]++
	}
	rp.outBlocks += out
}

// release drops a finished request's references.
func (rp *simReplica) release(ids []int32, out int) {
	for _, id := range ids {
		if rp.refs[id]--; rp.refs[id] == 0 {
			rp.used--
		}
	}
	rp.outBlocks -= out
}

// queued returns the uncached prompt tokens waiting or prefilling at now.
func (rp *simReplica) queued(now float64) float64 {
	return max(0, rp.busyUntil-now) * rp.rate
}

// headOf returns the gateway's estimate of the prefill at the head of the
// queue and how long it has been there (0, 0 when none has started).
func (rp *simReplica) headOf(now float64) (int64, float64) {
	if !rp.headStarted {
		return 0, 0
	}
	e := &rp.prefill[rp.head]
	return e.est, now - e.start
}

// kvUsage returns the fraction of the replica's cache referenced by
// running requests, at most 1.
func (rp *simReplica) kvUsage() float64 {
	return min(1, float64(rp.used+rp.outBlocks)/float64(rp.cache.capacity))
}

// endpoint describes the replica (after advance) at now as the gateway
// would see it; bt is the block size in tokens.
func (rp *simReplica) endpoint(id string, sat scoring.Saturation, now float64, bt int) scoring.Endpoint {
	rp.meter.Advance(now - rp.meterAt)
	rp.meterAt = max(rp.meterAt, now)
	pending := len(rp.prefill) - rp.head
	waiting, running := pending, len(rp.decoding)
	if rp.headStarted {
		waiting--
		running++
	}
	kv := rp.kvUsage()
	saturated, _ := sat.Judge(waiting, kv, rp.estPrefill)
	headTokens, headElapsed := rp.headOf(now)
	return scoring.Endpoint{
		ID:                      id,
		Waiting:                 waiting,
		Running:                 running,
		KVUsage:                 kv,
		InflightRequests:        int64(pending + len(rp.decoding)),
		InflightPrefillTokens:   rp.estPrefill,
		HeadPrefillTokens:       headTokens,
		HeadElapsed:             headElapsed,
		InflightPrefillRequests: pending,
		ArrivalRate:             rp.meter.Requests,
		UncachedRate:            rp.meter.Tokens,
		CacheTokens:             rp.cache.capacity * bt,
		RequestTokens:           rp.meter.PerRequest(),
		Saturated:               saturated,
	}
}

// admit queues a request arriving at now with prompt blocks ids, work
// uncached prompt tokens (est by the gateway's reckoning) and out output
// blocks, decoding for decode seconds after its prefill; it returns how
// long the request waits before its prefill starts. Call advance(now)
// after it, so that a request starting at once takes its blocks.
func (rp *simReplica) admit(now float64, ids []int32, work, est, out int, decode float64) float64 {
	start := max(now, rp.busyUntil)
	end := start + float64(work)/rp.rate
	rp.busyUntil = end
	rp.prefill = append(rp.prefill, prefillEntry{start: start, end: end, decode: decode, est: int64(est), work: int64(work), ids: ids, out: out})
	rp.estPrefill += int64(est)
	rp.computed += int64(work)
	return start - now
}

// blockLRU is an exact LRU set of dense block ids in [0, universe): a
// doubly linked list threaded through arrays indexed by id, with a
// sentinel at index universe whose next is the most recent id and whose
// prev the least recent.
type blockLRU struct {
	capacity, n int
	sentinel    int32
	prev, next  []int32
	in          []bool
}

// newBlockLRU returns an empty LRU of capacity ids from [0, universe).
func newBlockLRU(universe, capacity int) *blockLRU {
	l := &blockLRU{
		sentinel: int32(universe),
		prev:     make([]int32, universe+1),
		next:     make([]int32, universe+1),
		in:       make([]bool, universe),
	}
	l.reset(capacity)
	return l
}

// reset empties the LRU and sets its capacity (at least 1).
func (l *blockLRU) reset(capacity int) {
	clear(l.in)
	l.n, l.capacity = 0, max(1, capacity)
	l.prev[l.sentinel], l.next[l.sentinel] = l.sentinel, l.sentinel
}

// contains reports whether id is cached.
func (l *blockLRU) contains(id int32) bool { return l.in[id] }

// prefix returns the length of the longest run of ids, from ids[0], that
// is cached.
func (l *blockLRU) prefix(ids []int32) int {
	for k, id := range ids {
		if !l.in[id] {
			return k
		}
	}
	return len(ids)
}

// touch makes ids the most recent entries, deepest first so that ids[0]
// ends up most recent, adding the absent ones and evicting the least
// recent beyond capacity.
func (l *blockLRU) touch(ids []int32) {
	for k := len(ids) - 1; k >= 0; k-- {
		id := ids[k]
		if l.in[id] {
			l.unlink(id)
		} else {
			l.in[id] = true
			l.n++
		}
		l.pushFront(id)
		if l.n > l.capacity {
			l.evict()
		}
	}
}

func (l *blockLRU) unlink(id int32) {
	p, n := l.prev[id], l.next[id]
	l.next[p], l.prev[n] = n, p
}

func (l *blockLRU) pushFront(id int32) {
	s := l.sentinel
	first := l.next[s]
	l.prev[id], l.next[id] = s, first
	l.prev[first], l.next[s] = id, id
}

// evict drops the least recent id.
func (l *blockLRU) evict() {
	id := l.prev[l.sentinel]
	l.unlink(id)
	l.in[id] = false
	l.n--
}

// oldest returns the ids from least to most recent (for tests).
func (l *blockLRU) oldest() []int32 {
	var out []int32
	for id := l.prev[l.sentinel]; id != l.sentinel; id = l.prev[id] {
		out = append(out, id)
	}
	return out
}

// MarshalJSON encodes the report as
//
//	{"ceiling": f, "requests": n, "prompt_tokens": n, "results": [{"policy": s,
//	 "cache_blocks": n, "cached_fraction": f, "imbalance": f, …}], …}
//
// with the ceiling as a fraction of prompt tokens, plus further fields
// describing the ceiling and the simulated fleet.
func (r *AnalyzeReport) MarshalJSON() ([]byte, error) {
	type out struct {
		Ceiling             float64           `json:"ceiling"`
		Requests            int               `json:"requests"`
		PromptTokens        int64             `json:"prompt_tokens"`
		Results             []AnalyzeResult   `json:"results"`
		PooledLRU           []PooledLRUResult `json:"pooled_lru"`
		Format              string            `json:"format"`
		BlockTokens         int               `json:"block_tokens"`
		WindowSeconds       float64           `json:"window_s"`
		CeilingDetail       CeilingResult     `json:"ceiling_detail"`
		CeilingUnlimited    CeilingResult     `json:"ceiling_unlimited"`
		Replicas            int               `json:"replicas"`
		PrefillTokensPerSec float64           `json:"prefill_tokens_per_s"`
		TimeScale           float64           `json:"time_scale"`
		CPUBlocks           int               `json:"cpu_blocks,omitempty"`
	}
	results := r.Results
	if results == nil {
		results = []AnalyzeResult{}
	}
	return json.Marshal(out{
		Ceiling:             r.Ceiling.Fraction,
		Requests:            r.Requests,
		PromptTokens:        r.PromptTokens,
		Results:             results,
		PooledLRU:           r.PooledLRU,
		Format:              r.Format,
		BlockTokens:         r.BlockTokens,
		WindowSeconds:       r.Window.Seconds(),
		CeilingDetail:       r.Ceiling,
		CeilingUnlimited:    r.CeilingUnlimited,
		Replicas:            r.Replicas,
		PrefillTokensPerSec: r.PrefillTokensPerSec,
		TimeScale:           r.TimeScale,
		CPUBlocks:           r.CPUBlocks,
	})
}

// policies returns the report's policies in result order.
func (r *AnalyzeReport) policies() []string {
	var out []string
	for _, res := range r.Results {
		if !slices.Contains(out, res.Policy) {
			out = append(out, res.Policy)
		}
	}
	return out
}

// cacheSizes returns the report's cache sizes, ascending.
func (r *AnalyzeReport) cacheSizes() []int {
	var out []int
	for _, res := range r.Results {
		out = append(out, res.CacheBlocks)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// result returns the result for policy at cache size cb.
func (r *AnalyzeReport) result(policy string, cb int) (AnalyzeResult, bool) {
	i := slices.IndexFunc(r.Results, func(res AnalyzeResult) bool { return res.Policy == policy && res.CacheBlocks == cb })
	if i < 0 {
		return AnalyzeResult{}, false
	}
	return r.Results[i], true
}

// windowString renders the ceiling's window.
func (r *AnalyzeReport) windowString() string {
	if r.Window == 0 {
		return "unlimited"
	}
	return shortDuration(r.Window)
}

// shortDuration renders d without zero trailing units: 10m, 1h30m, 90s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// WriteTable writes the report as text tables: the trace and the ceiling,
// then one row per cache size with, per policy, the cached fraction, its
// share of the ceiling and the imbalance; then the prefill queueing and,
// for sticky policies, the sticky share and rebinds.
func (r *AnalyzeReport) WriteTable(w io.Writer) error {
	ew := &errWriter{w: w}
	ew.printf("trace: %s, %d requests, %d prompt tokens, %d-token blocks; %d replicas at %.0f prefill tokens/s each, time scale %g\n",
		r.Format, r.Requests, r.PromptTokens, r.BlockTokens, r.Replicas, r.PrefillTokensPerSec, r.TimeScale)
	ew.printf("ceiling (window %s): %.1f%% of prompt tokens (%.1f%% of blocks); unlimited window: %.1f%% (%.1f%% of blocks)\n\n",
		r.windowString(), 100*r.Ceiling.Fraction, 100*r.Ceiling.BlockFraction, 100*r.CeilingUnlimited.Fraction, 100*r.CeilingUnlimited.BlockFraction)
	pols, sizes := r.policies(), r.cacheSizes()

	table := func(title string, withPooled bool, cell func(AnalyzeResult) string) {
		ew.printf("%s\n", title)
		tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
		var hdr strings.Builder
		hdr.WriteString("cache blocks\t")
		if withPooled {
			hdr.WriteString("pooled LRU\t")
		}
		for _, p := range pols {
			hdr.WriteString(p + "\t")
		}
		fmt.Fprintln(tw, hdr.String())
		for _, cb := range sizes {
			var row strings.Builder
			row.WriteString(strconv.Itoa(cb) + "\t")
			if withPooled {
				i := slices.IndexFunc(r.PooledLRU, func(p PooledLRUResult) bool { return p.CacheBlocks == cb })
				if i >= 0 {
					row.WriteString(fmt.Sprintf("%.1f%% (%3.0f%%)", 100*r.PooledLRU[i].CachedFraction, 100*ratioF(r.PooledLRU[i].CachedFraction, r.Ceiling.Fraction)))
				}
				row.WriteString("\t")
			}
			for _, p := range pols {
				if res, ok := r.result(p, cb); ok {
					row.WriteString(cell(res))
				}
				row.WriteString("\t")
			}
			fmt.Fprintln(tw, row.String())
		}
		if err := tw.Flush(); err != nil && ew.err == nil {
			ew.err = err
		}
		ew.printf("\n")
	}
	if r.CPUBlocks > 0 {
		ew.printf("CPU offload tier: %d blocks per replica behind its cache (cached fractions include its hits, loaded at %.0f%% of a prefill's cost)\n\n",
			r.CPUBlocks, 100*scoring.CPUHitCost)
		table("cached fraction (share of ceiling) ×imbalance, of which from CPU; pooled LRU = one LRU of replicas × (cache + CPU) blocks", true, func(res AnalyzeResult) string {
			return fmt.Sprintf("%.1f%% (%3.0f%%) ×%.2f cpu %.1f%%", 100*res.CachedFraction, 100*res.CeilingShare, res.Imbalance, 100*res.CPUFraction)
		})
	} else {
		table("cached fraction (share of ceiling) ×imbalance; pooled LRU = one LRU of replicas × cache blocks", true, func(res AnalyzeResult) string {
			return fmt.Sprintf("%.1f%% (%3.0f%%) ×%.2f", 100*res.CachedFraction, 100*res.CeilingShare, res.Imbalance)
		})
	}
	table("prefill queue wait, mean / p99 (s)", false, func(res AnalyzeResult) string {
		return fmt.Sprintf("%.2f / %.2f", res.MeanQueueSeconds, res.P99QueueSeconds)
	})
	table("TTFT p50 / p90 / p99 (s): wait + own uncached prefill", false, func(res AnalyzeResult) string {
		return fmt.Sprintf("%.2f / %.2f / %.2f", res.TTFTP50Seconds, res.TTFTP90Seconds, res.TTFTP99Seconds)
	})
	if slices.ContainsFunc(r.Results, func(res AnalyzeResult) bool { return res.Estimated > 0 }) {
		table("TTFT estimate error |estimated − simulated| ÷ simulated, p50 / p90 (policies that estimate)", false, func(res AnalyzeResult) string {
			if res.Estimated == 0 {
				return "-"
			}
			return fmt.Sprintf("%.1f%% / %.1f%%", 100*res.EstimateErrorP50, 100*res.EstimateErrorP90)
		})
		r.writePredictions(ew, sizes)
	}
	if slices.ContainsFunc(r.Results, func(res AnalyzeResult) bool { return res.StickyShare > 0 || len(res.Rebinds) > 0 }) {
		table("sticky share, rebinds evicted/saturated/rescored (sticky policies); sat = share of requests routed to a saturated replica", false, func(res AnalyzeResult) string {
			if res.StickyShare == 0 && len(res.Rebinds) == 0 {
				return fmt.Sprintf("sat %.0f%%", 100*res.SaturatedShare)
			}
			return fmt.Sprintf("%.0f%% %d/%d/%d sat %.0f%%", 100*res.StickyShare,
				res.Rebinds[scoring.RebindEvicted], res.Rebinds[scoring.RebindSaturated], res.Rebinds["rescored"], 100*res.SaturatedShare)
		})
	}
	return ew.err
}

// writePredictions prints warmpath's sampled decisions, predicted against
// simulated TTFT, at the median cache size.
func (r *AnalyzeReport) writePredictions(ew *errWriter, sizes []int) {
	res, ok := r.result(scoring.PolicyWarmpath, sizes[len(sizes)/2])
	if !ok || len(res.Predictions) == 0 {
		return
	}
	ew.printf("warmpath at %d cache blocks, sampled decisions: estimated vs simulated TTFT\n", res.CacheBlocks)
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "request\treplica\treason\tqueued tok\tuncached tok\tcached tok\testimated s\tsimulated s\t")
	for _, p := range res.Predictions {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%d\t%.3f\t%.3f\t\n", p.Request, p.Replica, p.Reason,
			p.QueuedTokens, p.UncachedTokens, p.CachedTokens, p.EstimatedSeconds, p.SimulatedSeconds)
	}
	if err := tw.Flush(); err != nil && ew.err == nil {
		ew.err = err
	}
	ew.printf("\n")
}

// errWriter remembers the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) { fmt.Fprintf(e, format, args...) }

// Plot returns the chart of cached fraction against cache size, one line
// per policy, with the ceiling (within the window, and unlimited) as flat
// lines.
func (r *AnalyzeReport) Plot() Chart {
	c := Chart{
		Title:  fmt.Sprintf("Cached fraction of prompt tokens, %d replicas", r.Replicas),
		XLabel: fmt.Sprintf("cache per replica (blocks of %d tokens)", r.BlockTokens),
		YLabel: "cached fraction",
		LogX:   true,
	}
	sizes := r.cacheSizes()
	for _, p := range r.policies() {
		c.Series = append(c.Series, r.series(p, func(res AnalyzeResult) float64 { return res.CachedFraction }))
	}
	if len(sizes) > 0 {
		lo, hi := float64(sizes[0]), float64(sizes[len(sizes)-1])
		c.Series = append(c.Series,
			Series{Name: "ceiling (" + r.windowString() + ")", X: []float64{lo, hi}, Y: []float64{r.Ceiling.Fraction, r.Ceiling.Fraction}},
		)
		if r.Window != 0 {
			c.Series = append(c.Series,
				Series{Name: "ceiling (unlimited)", X: []float64{lo, hi}, Y: []float64{r.CeilingUnlimited.Fraction, r.CeilingUnlimited.Fraction}})
		}
	}
	if len(r.PooledLRU) > 0 {
		s := Series{Name: "pooled LRU"}
		for _, p := range r.PooledLRU {
			s.X = append(s.X, float64(p.CacheBlocks))
			s.Y = append(s.Y, p.CachedFraction)
		}
		c.Series = append(c.Series, s)
	}
	return c
}

// ImbalancePlot returns the chart of imbalance (max ÷ mean prefill tokens
// per replica) against cache size, one line per policy.
func (r *AnalyzeReport) ImbalancePlot() Chart {
	c := Chart{
		Title:  fmt.Sprintf("Prefill imbalance (max ÷ mean per replica), %d replicas", r.Replicas),
		XLabel: fmt.Sprintf("cache per replica (blocks of %d tokens)", r.BlockTokens),
		YLabel: "imbalance",
		LogX:   true,
	}
	for _, p := range r.policies() {
		c.Series = append(c.Series, r.series(p, func(res AnalyzeResult) float64 { return res.Imbalance }))
	}
	return c
}

// series returns policy p's values of v against cache size.
func (r *AnalyzeReport) series(p string, v func(AnalyzeResult) float64) Series {
	var rs []AnalyzeResult
	for _, res := range r.Results {
		if res.Policy == p {
			rs = append(rs, res)
		}
	}
	slices.SortFunc(rs, func(a, b AnalyzeResult) int { return cmp.Compare(a.CacheBlocks, b.CacheBlocks) })
	s := Series{Name: p}
	for _, res := range rs {
		s.X = append(s.X, float64(res.CacheBlocks))
		s.Y = append(s.Y, v(res))
	}
	return s
}
