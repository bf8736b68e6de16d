package gateway

import (
	"fmt"
	"slices"
	"strings"

	"github.com/warmpath/warmpath/scoring"
)

// debugHeaders names the chosen replica, the decision and each replica's
// score breakdown.
func (g *Gateway) debugHeaders(h interface{ Set(string, string) }, x *exchange) {
	p := &x.route.Plan
	h.Set("X-Warmpath-Replica", x.replica.Spec.Name)
	h.Set("X-Warmpath-Reason", p.Reason)
	h.Set("X-Warmpath-Session", x.req.Session().Source)
	h.Set("X-Warmpath-Prompt-Tokens", fmt.Sprint(p.PromptTokens))
	h.Set("X-Warmpath-Predicted-Cached", fmt.Sprint(x.predicted))
	h.Set("X-Warmpath-Attempts", fmt.Sprint(x.attempts))
	if p.Rebind != "" {
		h.Set("X-Warmpath-Rebind", p.Rebind)
	}
	if e, ok := x.route.Estimate(x.replica.Spec.Name); ok {
		h.Set("X-Warmpath-Estimate-TTFT", fmt.Sprintf("%.4f", e.TTFT))
	}
	if p.Estimates != nil {
		h.Set("X-Warmpath-Scores", estimateScores(x.route.Eps, p))
		return
	}
	// Pure pickers (round-robin, session-hash) leave no scores.
	d := p.Decision
	if d == nil || d.Totals == nil {
		return
	}
	// Totals are aligned with the available endpoints, in order.
	var parts []string
	k := 0
	for _, e := range x.route.Eps {
		if !e.Available() {
			continue
		}
		s := fmt.Sprintf("%s=%.3f", e.ID, d.Totals[k])
		var terms []string
		for name, contrib := range d.Breakdown {
			terms = append(terms, fmt.Sprintf("%s:%.3f", name, contrib[k]))
		}
		slices.Sort(terms)
		if len(terms) > 0 {
			s += "(" + strings.Join(terms, ",") + ")"
		}
		parts = append(parts, s)
		k++
	}
	h.Set("X-Warmpath-Scores", strings.Join(parts, "; "))
}

// estimateScores renders each candidate's TTFT estimate, in the plan's
// order: replica=cost(ttft:s,others:s,future:s,queued:tokens,
// uncached:tokens), in seconds and tokens, with replication:s after
// future when the candidate has a replication term.
func estimateScores(eps []scoring.Endpoint, p *scoring.Plan) string {
	parts := make([]string, len(p.Order))
	for k, i := range p.Order {
		e := p.Estimates[k]
		repl := ""
		if e.Replication > 0 {
			repl = fmt.Sprintf(",replication:%.3f", e.Replication)
		}
		parts[k] = fmt.Sprintf("%s=%.3f(ttft:%.3f,others:%.3f,future:%.3f%s,queued:%d,uncached:%d)",
			eps[i].ID, e.Cost(), e.TTFT, e.Others, e.Future, repl, e.QueuedTokens, e.UncachedTokens)
	}
	return strings.Join(parts, "; ")
}
