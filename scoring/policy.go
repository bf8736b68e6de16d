package scoring

import (
	"fmt"
	"slices"
	"strings"
)

// Policy names.
const (
	PolicyRoundRobin    = "round-robin"
	PolicyLeastLoad     = "least-load"
	PolicySessionHash   = "session-hash"
	PolicyApproxPrefix  = "approx-prefix"
	PolicyPrecisePrefix = "precise-prefix"
	PolicyWarmpath      = "warmpath"
)

// Policies lists every policy name, baselines first.
func Policies() []string {
	return []string{PolicyRoundRobin, PolicyLeastLoad, PolicySessionHash, PolicyApproxPrefix, PolicyPrecisePrefix, PolicyWarmpath}
}

// Weights overrides scorer weights of a policy by scorer name ("prefix",
// "session", "queue", "kv", "inflight"); a missing name keeps the policy's
// default, a zero weight drops the scorer. warmpath has no weights: it
// routes by estimated time to first token.
type Weights map[string]float64

// Scorer names, as used in Weights and in Decision.Breakdown.
const (
	ScorerPrefix   = "prefix"
	ScorerSession  = "session"
	ScorerQueue    = "queue"
	ScorerKV       = "kv"
	ScorerInflight = "inflight"
)

// NewPolicy returns the named policy with default weights, overridden by w.
//
// The baselines are configured as their peers ship them:
//   - round-robin: rotation, blind to everything (a Kubernetes Service);
//   - least-load: queue ×1 + KV use ×1 + in-flight requests ×1;
//   - session-hash: consistent (rendezvous) hashing of the session key, as
//     production-stack's session router;
//   - approx-prefix: approximate prefix ×3 + queue ×2 + KV ×2 (the Gateway
//     API Inference Extension's default profile);
//   - precise-prefix: precise prefix ×2 + KV ×1 + queue ×1 (llm-d's
//     precise-prefix example configuration).
//
// warmpath routes each request to the replica with the lowest estimated
// time to first token plus the delay its prefill imposes on the requests
// behind it (the package doc states the model), keeps sessions on their
// replica without tokenizing while staying costs no more than moving, and
// matches prefixes precisely.
func NewPolicy(name string, w Weights) (*Policy, error) {
	var p *Policy
	switch name {
	case PolicyRoundRobin:
		p = &Policy{Picker: &RoundRobin{}}
	case PolicySessionHash:
		p = &Policy{Picker: Rendezvous{}}
	case PolicyLeastLoad:
		p = &Policy{Scorers: []Weighted{
			{ScorerQueue, 1, Distribution, Queue{}},
			{ScorerKV, 1, Distribution, KVUtil{}},
			{ScorerInflight, 1, Distribution, InflightRequests{}},
		}}
	case PolicyApproxPrefix:
		p = &Policy{UsesApprox: true, Scorers: []Weighted{
			{ScorerPrefix, 3, Affinity, Prefix{}},
			{ScorerQueue, 2, Distribution, Queue{}},
			{ScorerKV, 2, Distribution, KVUtil{}},
		}}
	case PolicyPrecisePrefix:
		p = &Policy{UsesPrecise: true, Scorers: []Weighted{
			{ScorerPrefix, 2, Affinity, Prefix{}},
			{ScorerKV, 1, Distribution, KVUtil{}},
			{ScorerQueue, 1, Distribution, Queue{}},
		}}
	case PolicyWarmpath:
		p = &Policy{UsesPrecise: true, Sticky: true, Estimated: true}
	default:
		return nil, fmt.Errorf("scoring: unknown policy %q (want one of %s)", name, strings.Join(Policies(), ", "))
	}
	p.Name = name
	if err := p.reweigh(w); err != nil {
		return nil, err
	}
	return p, nil
}

// reweigh applies w to p's scorers; a weight for a scorer the policy lacks
// adds it, so operators can extend a baseline.
func (p *Policy) reweigh(w Weights) error {
	if p.Estimated {
		if len(w) > 0 {
			return fmt.Errorf("scoring: policy %s routes by estimated TTFT and has no weights", p.Name)
		}
		return nil
	}
	for name, weight := range w {
		if weight < 0 || weight != weight {
			return fmt.Errorf("scoring: weight %q: %v is not a non-negative number", name, weight)
		}
		i := slices.IndexFunc(p.Scorers, func(s Weighted) bool { return s.Name == name })
		if i >= 0 {
			p.Scorers[i].Weight = weight
			continue
		}
		if p.Picker != nil {
			return fmt.Errorf("scoring: policy %s does not score; weight %q does not apply", p.Name, name)
		}
		s, ok := scorerByName(name)
		if !ok {
			return fmt.Errorf("scoring: unknown scorer %q in weights", name)
		}
		s.Weight = weight
		p.Scorers = append(p.Scorers, s)
	}
	p.Scorers = slices.DeleteFunc(p.Scorers, func(s Weighted) bool { return s.Weight == 0 })
	if p.Picker == nil && len(p.Scorers) == 0 {
		return fmt.Errorf("scoring: policy %s has no scorer with a positive weight", p.Name)
	}
	return nil
}

func scorerByName(name string) (Weighted, bool) {
	switch name {
	case ScorerPrefix:
		return Weighted{Name: name, Category: Affinity, Scorer: Prefix{}}, true
	case ScorerSession:
		return Weighted{Name: name, Category: Affinity, Scorer: Session{}}, true
	case ScorerQueue:
		return Weighted{Name: name, Category: Distribution, Scorer: Queue{}}, true
	case ScorerKV:
		return Weighted{Name: name, Category: Distribution, Scorer: KVUtil{}}, true
	case ScorerInflight:
		return Weighted{Name: name, Category: Distribution, Scorer: InflightRequests{}}, true
	}
	return Weighted{}, false
}
