package scoring

import "context"

// CPUHitCost is what a prompt token held in an engine's CPU offload tier
// costs, relative to prefilling it: its KV is loaded over PCIe, not
// computed. 0.04 is vllmsim's default profile (Qwen3-32B on 2×H100: 2.6 µs
// a token loaded, 66.7 µs prefilled).
const CPUHitCost = 0.04

// cachedValue is the prefill a request saves on endpoint i: its GPU hit,
// and its CPU hit less the cost of loading it.
func cachedValue(r *Request, i int) float64 {
	v := float64(r.Matched[i])
	if r.MatchedCPU != nil {
		v += (1 - CPUHitCost) * float64(r.MatchedCPU[i])
	}
	return v
}

// Prefix scores endpoints by the fraction of the prompt they hold cached:
// (Matched[i] + (1 − CPUHitCost) × MatchedCPU[i]) ÷ PromptTokens.
// Affinity. Zero everywhere when matches are unknown.
type Prefix struct{}

// Score implements Scorer.
func (Prefix) Score(_ context.Context, r *Request, eps []Endpoint) []float64 {
	out := make([]float64, len(eps))
	if r.Matched == nil || r.PromptTokens <= 0 {
		return out
	}
	for i := range eps {
		out[i] = min(1, cachedValue(r, i)/float64(r.PromptTokens))
	}
	return out
}

// Session scores the session's bound replica 1 and every other 0. Affinity.
type Session struct{}

// Score implements Scorer.
func (Session) Score(_ context.Context, r *Request, eps []Endpoint) []float64 {
	out := make([]float64, len(eps))
	if r.Bound == "" {
		return out
	}
	for i := range eps {
		if eps[i].ID == r.Bound {
			out[i] = 1
		}
	}
	return out
}

// Queue scores by the engine's waiting queue, min-max normalised:
// (max − q) ÷ (max − min), 1 for every endpoint when all queues are equal.
// Distribution.
type Queue struct{}

// Score implements Scorer.
func (Queue) Score(_ context.Context, _ *Request, eps []Endpoint) []float64 {
	return minMax(eps, func(e *Endpoint) float64 { return float64(e.Waiting) })
}

// InflightRequests scores by requests this gateway has in flight to each
// endpoint, min-max normalised like Queue. Distribution.
type InflightRequests struct{}

// Score implements Scorer.
func (InflightRequests) Score(_ context.Context, _ *Request, eps []Endpoint) []float64 {
	return minMax(eps, func(e *Endpoint) float64 { return float64(e.InflightRequests) })
}

// KVUtil scores 1 − KVUsage. Distribution.
type KVUtil struct{}

// Score implements Scorer.
func (KVUtil) Score(_ context.Context, _ *Request, eps []Endpoint) []float64 {
	out := make([]float64, len(eps))
	for i := range eps {
		out[i] = 1 - eps[i].KVUsage
	}
	return out
}

// minMax scores (max − v) ÷ (max − min) per endpoint, 1 everywhere when all
// values are equal.
func minMax(eps []Endpoint, v func(*Endpoint) float64) []float64 {
	out := make([]float64, len(eps))
	if len(eps) == 0 {
		return out
	}
	lo, hi := v(&eps[0]), v(&eps[0])
	for i := range eps {
		x := v(&eps[i])
		out[i] = x
		lo, hi = min(lo, x), max(hi, x)
	}
	for i := range out {
		if hi == lo {
			out[i] = 1
		} else {
			out[i] = (hi - out[i]) / (hi - lo)
		}
	}
	return out
}

var (
	_ Scorer = Prefix{}
	_ Scorer = Session{}
	_ Scorer = Queue{}
	_ Scorer = InflightRequests{}
	_ Scorer = KVUtil{}
)
