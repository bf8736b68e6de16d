package scoring

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
)

// ErrNoEndpoint is returned by Route when no endpoint is eligible.
var ErrNoEndpoint = errors.New("scoring: no eligible endpoint")

// Endpoint is what the router knows about one replica at decision time.
type Endpoint struct {
	// ID names the replica (its fleet name).
	ID string
	// Waiting and Running are the engine's queue and batch sizes, from its
	// metrics.
	Waiting, Running int
	// KVUsage is the fraction of the engine's KV blocks in use, 0..1.
	KVUsage float64
	// InflightRequests counts requests this gateway sent that have not
	// finished.
	InflightRequests int64
	// InflightPrefillTokens counts uncached prompt tokens this gateway sent
	// that have not produced a first token yet: the prefill work queued in
	// front of a new request.
	InflightPrefillTokens int64
	// InflightPrefillRequests counts the requests behind
	// InflightPrefillTokens: the engine's waiting requests beyond them
	// are other gateways' (or clients') and priced at RequestTokens.
	InflightPrefillRequests int
	// KVTokens is the engine's KV capacity in tokens (num_gpu_blocks ×
	// block_size from cache_config_info); 0 when unknown. KVUsage × KVTokens
	// is the context the running sequences hold, the decode interference
	// of the TTFT model.
	KVTokens int
	// HeadPrefillTokens is the oldest of this gateway's requests counted
	// in InflightPrefillTokens, and HeadElapsed how long, in seconds, it
	// has been first in line: since it was sent or since the request
	// before it produced its first token, whichever is later. The model
	// takes the head's prefill to have progressed meanwhile.
	HeadPrefillTokens int64
	HeadElapsed       float64
	// ArrivalRate is the engine's recent requests scheduled per second
	// (its queue-time histogram's count; in steady state its arrivals),
	// whichever gateway sent them; 0 when unknown.
	ArrivalRate float64
	// UncachedRate is the engine's recent uncached prompt tokens per second:
	// the rate new blocks enter its prefix cache; 0 when unknown.
	UncachedRate float64
	// CacheTokens is the engine's prefix-cache capacity in tokens (vLLM's
	// is its KV cache: KVTokens); 0 when unknown. With UncachedRate it
	// sets how long an unused prefix survives there.
	CacheTokens int
	// CPUCacheTokens is the engine's CPU offload tier in tokens (vLLM's
	// num_cpu_blocks × block size); 0 for none or unknown. A prefix the
	// GPU evicts survives there CPUCacheTokens ÷ UncachedRate seconds,
	// and a turn finding it there loads it at CPUHitCost of a prefill.
	CPUCacheTokens int
	// RequestTokens is the engine's recent mean uncached prompt per
	// request, in tokens: the price of a waiting request this gateway did
	// not send; 0 when unknown.
	RequestTokens float64
	// Saturated reports that the replica should not take more affinity
	// traffic (long queue, full cache, stale metrics); see [Saturation].
	// Policies that route by estimate ignore it.
	Saturated bool
	// Unhealthy reports that the replica may take no traffic at all. Only
	// Decide reads it (through Available): Route and the scorers are given
	// available endpoints.
	Unhealthy bool
	// GatewayAheadTokens and GatewayAhead are the uncached prefill tokens
	// and the requests waiting in the caller's admission queue whose plan
	// chose this replica and that leave the queue before this request
	// (routing-aware dispatch holds each for room on its replica): they
	// reach the engine's queue first, so the model prices them as it
	// prices that queue. GatewayBehind counts those that leave after it
	// (all of them, once this request has left the queue): its prefill
	// here delays each, which Estimate.Others prices. 0 without a queue
	// (the offline analyzer).
	GatewayAheadTokens          int64
	GatewayAhead, GatewayBehind int
	// Reserved reports that the replica takes none of this request's
	// class (the admission queue's interactive reserve, for background):
	// like Unhealthy it takes no traffic, but a session leaving it is
	// counted as RebindReserved.
	Reserved bool
	// BlockSize is the engine's KV block size in tokens (vLLM's
	// cache_config_info), 0 when unknown. The engine caches whole blocks
	// only, so Decide rounds a sticky turn's prediction down to it.
	BlockSize int
	// PromptBlocksOnly reports an engine that caches blocks of prompt
	// tokens only, not those its generated tokens fill
	// (llm-d-inference-sim): a sticky turn's prediction leaves out
	// Binding.GeneratedTokens.
	PromptBlocksOnly bool
}

// Request is what the router knows about one request.
type Request struct {
	// Model is the requested model.
	Model string
	// SessionKey identifies the conversation; see package session.
	SessionKey string
	// PromptTokens is the prompt length in tokens: exact when the request
	// was tokenized, estimated otherwise.
	PromptTokens int
	// Matched holds, aligned with the endpoints given to Route, how many of
	// the prompt's tokens each endpoint is believed to hold in its prefix
	// cache, or nil when unknown.
	Matched []int
	// MatchedCPU holds, aligned likewise, how many prompt tokens after
	// Matched each endpoint holds in a CPU offload tier: loaded rather
	// than prefilled, at CPUHitCost each. Nil when none.
	MatchedCPU []int
	// Bound is the ID of the replica the session is bound to, "" when none.
	Bound string
}

// Scorer scores endpoints for a request.
type Scorer interface {
	// Score returns one score per endpoint, aligned with eps, each in [0,1]
	// where 1 is best.
	Score(ctx context.Context, r *Request, eps []Endpoint) []float64
}

// Category says what a scorer is for.
type Category int

const (
	// Distribution scorers prefer replicas with room.
	Distribution Category = iota
	// Affinity scorers prefer replicas holding the request's state.
	Affinity
)

// Weighted is one scorer of a policy with its weight.
type Weighted struct {
	Name     string
	Weight   float64
	Category Category
	Scorer   Scorer
}

// Picker chooses an order of preference over scored endpoints: the first
// index is the choice, the rest are fallbacks in order (for retries).
type Picker interface {
	Pick(r *Request, eps []Endpoint, totals []float64, rng *rand.Rand) []int
}

// Decision is the outcome of routing one request.
type Decision struct {
	// Order lists endpoint indexes by preference; Order[0] is the choice.
	Order []int
	// Totals holds each endpoint's weighted score (nil for pickers that do
	// not score).
	Totals []float64
	// Breakdown holds each scorer's weighted contribution per endpoint, by
	// scorer name.
	Breakdown map[string][]float64
}

// Chosen returns the index of the chosen endpoint.
func (d Decision) Chosen() int { return d.Order[0] }

// Policy is a named routing policy: weighted scorers and a picker.
type Policy struct {
	// Name labels every metric of a gateway running this policy.
	Name string
	// Scorers are summed with their weights; empty for pure pickers such as
	// round-robin.
	Scorers []Weighted
	// Picker chooses among scored endpoints; nil means MaxScore.
	Picker Picker
	// Estimated makes the policy route by the TTFT model instead of
	// scores: the available endpoint with the lowest Estimate.Cost wins
	// (see the package doc); Scorers and Picker are unused.
	Estimated bool
	// UsesPrecise and UsesApprox say which prefix index fills
	// Request.Matched for this policy.
	UsesPrecise, UsesApprox bool
	// Sticky says the gateway keeps a session on its bound replica while
	// that replica is healthy and still holds the session's prefix, and
	// (Estimated) staying costs no more than moving or (otherwise) it is
	// unsaturated, without scoring.
	Sticky bool
}

// Route scores eps for r and picks one. rng breaks ties; nil uses the
// goroutine-safe top-level generator.
func (p *Policy) Route(ctx context.Context, r *Request, eps []Endpoint, rng *rand.Rand) (Decision, error) {
	if len(eps) == 0 {
		return Decision{}, ErrNoEndpoint
	}
	var d Decision
	if len(p.Scorers) > 0 {
		d.Totals = make([]float64, len(eps))
		d.Breakdown = make(map[string][]float64, len(p.Scorers))
		for _, w := range p.Scorers {
			scores := w.Scorer.Score(ctx, r, eps)
			contrib := make([]float64, len(eps))
			for i := range eps {
				contrib[i] = w.Weight * clamp01(scores[i])
				d.Totals[i] += contrib[i]
			}
			d.Breakdown[w.Name] = contrib
		}
	}
	picker := p.Picker
	if picker == nil {
		picker = MaxScore{}
	}
	d.Order = picker.Pick(r, eps, d.Totals, rng)
	return d, nil
}

// allSaturated reports whether every endpoint is saturated.
func allSaturated(eps []Endpoint) bool {
	for i := range eps {
		if !eps[i].Saturated {
			return false
		}
	}
	return true
}

func clamp01(v float64) float64 {
	switch {
	case v != v || v < 0: // NaN or negative
		return 0
	case v > 1:
		return 1
	}
	return v
}

// MaxScore picks the endpoint with the highest total, breaking exact ties at
// random; the fallbacks follow in descending score.
type MaxScore struct{}

// Pick implements Picker.
func (MaxScore) Pick(_ *Request, eps []Endpoint, totals []float64, rng *rand.Rand) []int {
	order := make([]int, len(eps))
	for i := range order {
		order[i] = i
	}
	shuffle(order, rng)
	if totals != nil {
		slices.SortStableFunc(order, func(a, b int) int {
			switch {
			case totals[a] > totals[b]:
				return -1
			case totals[a] < totals[b]:
				return 1
			}
			return 0
		})
	}
	return order
}

func shuffle(s []int, rng *rand.Rand) {
	if rng != nil {
		rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
		return
	}
	rand.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
}
