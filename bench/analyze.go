package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/warmpath/warmpath/gateway"
	"github.com/warmpath/warmpath/scoring"
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
	// (8), or for a recording (FormatRecord) as many as it names.
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
	// Recorded is, for a recording (FormatRecord), what the fleet
	// actually got on it; nil otherwise.
	Recorded *RecordedResult
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
	// Turns splits the requests by where they went relative to their
	// session's previous turn (see TurnStat), keyed "first", "stayed" and
	// "moved".
	Turns map[string]TurnStat `json:"turns,omitempty"`
	// RebindCost describes the Rebinds by reason: what the bound replica
	// still held of each rebound request and what it found where it went.
	RebindCost map[string]RebindStat `json:"rebind_cost,omitempty"`
}

// RebindStat sums the rebinds of one reason. HeldTokens is what the
// replica the session was bound to still held of each request (both
// tiers) when it was rebound, CachedTokens what the request found cached
// on the replica it was routed to, and Moved how many went to another
// replica: HeldTokens − CachedTokens is the cache the rebinds gave up
// (negative when they found more elsewhere).
type RebindStat struct {
	Rebinds      int64 `json:"rebinds"`
	Moved        int64 `json:"moved"`
	HeldTokens   int64 `json:"held_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
}

// TurnStat counts the requests of one kind of turn and what they found
// cached. A session's first request (or one without a session) is
// "first": where a new conversation was placed. A later one is "stayed"
// when routed to the replica that served the session's previous request,
// so what it misses was evicted during the pause, and "moved" otherwise,
// so what it misses is the cost of the move.
type TurnStat struct {
	Requests     int64 `json:"requests"`
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
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
		Recorded:            t.Recorded,
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
		if rec := c.Trace.Recorded; rec != nil {
			c.Replicas = rec.Replicas
		}
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

// ratioF returns a ÷ b, or 0 when b is 0.
func ratioF(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
