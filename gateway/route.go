package gateway

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/session"
)

// candidate is one replica a request may go to, in the plan's order.
type candidate struct {
	replica *fleet.Replica
	url     *url.URL
	// predicted is how many prompt tokens the router believes the replica
	// holds cached.
	predicted int
}

// plan is a routing decision: replicas in order of preference (the first
// is the choice, the second the retry target), and why.
type plan struct {
	order        []candidate
	promptTokens int // exact when tokenized, estimated otherwise
	reason       string
	rebind       string // why the session left its bound replica, "" if it did not
	eps          []scoring.Endpoint
	decision     *scoring.Decision
	// session and binding are the session key and the binding in force
	// after routing ("" and zero when the policy keeps no bindings).
	session string
	binding session.Binding
}

// Routing reasons, as counted in warmpath_routing_decisions_total.
const (
	reasonSticky = "sticky" // bound replica, no tokenizing, no scoring
	reasonScored = "scored"
	reasonRaced  = "raced" // another gateway bound the session first
)

// Rebind reasons, as counted in warmpath_session_rebinds_total: those of
// scoring.Stick, and unhealthy (bound replica still a member, but down).
const (
	rebindUnhealthy = "unhealthy"
	rebindDiverged  = "diverged" // the turn does not continue the bound conversation
	rebindSaturated = scoring.RebindSaturated
	rebindEvicted   = scoring.RebindEvicted
)

// route decides where r goes. For sticky policies a session stays on its
// bound replica while that replica is healthy, unsaturated and still holds
// the session's prefix, and such a turn is routed without tokenizing;
// otherwise the policy scores every eligible replica.
func (g *Gateway) route(ctx context.Context, r *request) (*plan, error) {
	now := time.Now()
	eligible, err := g.eligible(r.model)
	if err != nil {
		return nil, err
	}
	pol := g.policy
	p := &plan{promptTokens: r.estimatedTokens()}
	key := r.session.Value

	var bind session.Binding
	bound := false
	if key != "" && g.tracksSessions() {
		b, ok, err := g.sessions.Lookup(ctx, key)
		if err != nil {
			g.m.redisErrors.WithLabelValues("lookup").Inc()
			g.log.Debug("session lookup degraded", "err", err)
		}
		bind, bound = b, ok
	}

	names := make([]string, len(eligible))
	p.eps = make([]scoring.Endpoint, len(eligible))
	for i, rep := range eligible {
		st := rep.State()
		sat, _ := rep.Saturated(now)
		names[i] = rep.Spec.Name
		p.eps[i] = scoring.Endpoint{
			ID:                    rep.Spec.Name,
			Waiting:               st.Waiting,
			Running:               st.Running,
			KVUsage:               st.KVUsage,
			InflightRequests:      rep.InflightRequests.Load(),
			InflightPrefillTokens: rep.InflightPrefillTokens.Load(),
			Saturated:             sat,
		}
	}
	var text []byte // the conversation text, for sticky policies
	if pol.Sticky {
		text = r.approxText()
	}
	if pol.Sticky && bound && !continues(text, bind) {
		// The key is shared by another conversation (identical openings):
		// score this one on its own prefix.
		p.rebind = rebindDiverged
		bound = false
	}
	if pol.Sticky && bound {
		i, why := scoring.Stick(bind.Replica, p.eps, func(i int) bool { return g.stillHolds(eligible[i], bind) })
		if i >= 0 {
			g.routeSticky(ctx, p, r, eligible[i], eligible, key, bind, now)
			return p, nil
		}
		p.rebind = why
		if why == scoring.RebindGone && g.fleet.Replica(bind.Replica) != nil {
			p.rebind = rebindUnhealthy
		}
	}

	sr := &scoring.Request{Model: r.model, SessionKey: key, PromptTokens: p.promptTokens}
	if bound {
		sr.Bound = bind.Replica
	}
	var keys, chunks []uint64
	switch {
	case pol.UsesPrecise:
		tokens, err := g.tokenize(ctx, r, eligible)
		if err != nil {
			// Route on load alone rather than fail the request.
			g.log.Warn("tokenize failed; routing without prefix information", "err", err)
			break
		}
		p.promptTokens, sr.PromptTokens = len(tokens), len(tokens)
		keys = g.index.keys(tokens, r.model, r.cacheSalt)
		sr.Matched = g.index.matchTokens(keys, names, len(tokens))
	case pol.UsesApprox:
		chunks = g.approx.keys(r.approxText(), r.model, r.cacheSalt)
		sr.Matched = g.approx.matchTokens(chunks, names, p.promptTokens)
	}
	d, err := pol.Route(ctx, sr, p.eps, nil)
	if err != nil {
		return nil, apierror.Unavailable(err, "no replica can take the request")
	}
	p.decision = &d
	p.reason = reasonScored
	p.order = make([]candidate, len(d.Order))
	for i, j := range d.Order {
		p.order[i] = candidate{replica: eligible[j]}
		if sr.Matched != nil {
			p.order[i].predicted = sr.Matched[j]
		}
	}
	chosen := p.order[0].replica.Spec.Name
	if chunks != nil {
		g.approx.record(chosen, chunks)
	}
	if keys != nil && g.cfg.Routing.SpeculativeTTL > 0 {
		g.index.speculate(chosen, keys, g.cfg.Routing.SpeculativeTTL)
	}
	if key != "" && g.tracksSessions() {
		nb := session.Binding{Replica: chosen, PromptTokens: p.promptTokens, PromptBytes: r.textBytes, Turns: bind.Turns + 1}
		if text != nil {
			nb.TextLen, nb.TextHash = len(text), xxhash.Sum64(text)
		}
		if len(keys) > 0 {
			nb.TipKey, nb.TipDepth = keys[len(keys)-1], len(keys)
		}
		won, err := g.sessions.Remember(ctx, key, nb, !bound && p.rebind == "")
		p.session, p.binding = key, nb
		switch {
		case err != nil:
			g.m.redisErrors.WithLabelValues("remember").Inc()
			g.log.Debug("session remember degraded", "err", err)
		case won.Replica != chosen:
			// A concurrent first turn on another gateway bound the session
			// first: follow it, so both turns share one replica.
			if i := slices.IndexFunc(p.order, func(c candidate) bool { return c.replica.Spec.Name == won.Replica }); i > 0 {
				c := p.order[i]
				p.order = slices.Insert(slices.Delete(p.order, i, i+1), 0, c)
				p.reason = reasonRaced
				p.binding = won
			}
		}
		switch {
		case p.rebind != "":
			// The binding broke for a reason and was re-scored (the best
			// replica may turn out to be the same one).
			g.m.rebinds.WithLabelValues(p.rebind).Inc()
		case bound && bind.Replica != p.order[0].replica.Spec.Name:
			// A non-sticky policy scored the session elsewhere.
			g.m.rebinds.WithLabelValues("rescored").Inc()
		}
	}
	g.m.decisions.WithLabelValues(p.reason).Inc()
	return p, g.resolveURLs(p)
}

// routeSticky sends the turn to its bound replica without tokenizing or
// scoring; the other eligible replicas follow as retry targets, least
// loaded first.
func (g *Gateway) routeSticky(ctx context.Context, p *plan, r *request, rep *fleet.Replica, eligible []*fleet.Replica, key string, bind session.Binding, now time.Time) {
	p.reason = reasonSticky
	if bind.PromptTokens > 0 && bind.PromptBytes > 0 {
		// Scale this turn's text by the session's measured tokens per byte.
		p.promptTokens = max(1, int(int64(r.textBytes)*int64(bind.PromptTokens)/int64(bind.PromptBytes)))
	}
	// A continuing turn's prompt holds at least what the replica caches of
	// the conversation, plus the new message.
	p.promptTokens = max(p.promptTokens, bind.CachedTokens+1)
	known := max(bind.TipDepth*g.cfg.Routing.BlockSize, bind.CachedTokens)
	predicted := min(known/g.cfg.Routing.BlockSize*g.cfg.Routing.BlockSize, max(0, p.promptTokens-1))
	p.session, p.binding = key, bind
	p.order = append(p.order, candidate{replica: rep, predicted: predicted})
	rest := make([]*fleet.Replica, 0, len(eligible)-1)
	for _, e := range eligible {
		if e != rep {
			rest = append(rest, e)
		}
	}
	slices.SortFunc(rest, func(a, b *fleet.Replica) int {
		return cmp.Compare(a.InflightPrefillTokens.Load()+int64(a.State().Waiting)*1024, b.InflightPrefillTokens.Load()+int64(b.State().Waiting)*1024)
	})
	for _, e := range rest {
		p.order = append(p.order, candidate{replica: e})
	}
	g.m.decisions.WithLabelValues(reasonSticky).Inc()
	g.m.tokenizeAvoided.Inc()
	// Refresh the binding's TTL now and then rather than on every turn.
	if now.Sub(bind.Updated) > g.cfg.Routing.SessionTTL/8 {
		bind.Turns++
		if _, err := g.sessions.Remember(ctx, key, bind, false); err != nil {
			g.m.redisErrors.WithLabelValues("remember").Inc()
		}
	}
	_ = g.resolveURLs(p)
}

// rememberCompleted records, after a turn completed on replica, what the
// replica now holds of the session, so the next sticky turn predicts its
// cache hit without tokenizing. It runs after the response, off the
// request's context.
func (g *Gateway) rememberCompleted(p *plan, replica string, u usage) {
	if p.session == "" || p.binding.Replica != replica || u.PromptTokens == 0 {
		return
	}
	b := p.binding
	b.CachedTokens = u.PromptTokens + max(0, u.CompletionTokens-1)
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Redis.Timeout)
	defer cancel()
	if _, err := g.sessions.Remember(ctx, p.session, b, false); err != nil {
		g.m.redisErrors.WithLabelValues("remember").Inc()
	}
}

// continues reports whether text continues the conversation the binding
// fingerprinted: it starts with the same TextLen bytes. Bindings without a
// fingerprint continue anything.
func continues(text []byte, b session.Binding) bool {
	if b.TextLen == 0 {
		return true
	}
	return len(text) >= b.TextLen && xxhash.Sum64(text[:b.TextLen]) == b.TextHash
}

// tracksSessions reports whether the policy uses session bindings.
func (g *Gateway) tracksSessions() bool {
	if g.policy.Sticky {
		return true
	}
	return slices.ContainsFunc(g.policy.Scorers, func(w scoring.Weighted) bool { return w.Name == scoring.ScorerSession })
}

// stillHolds reports whether rep still holds the session's prefix, as far
// as its KV events tell. Replicas that publish no events (or none yet) are
// trusted: the gateway cannot see their evictions.
func (g *Gateway) stillHolds(rep *fleet.Replica, b session.Binding) bool {
	if b.TipDepth == 0 || !g.index.receiving(rep.Spec.Name) {
		return true
	}
	return g.index.holds(rep.Spec.Name, b.TipKey)
}

// eligible returns the healthy replicas serving model, sorted by name.
func (g *Gateway) eligible(model string) ([]*fleet.Replica, error) {
	snap := g.fleet.Snapshot()
	out := make([]*fleet.Replica, 0, len(snap.Replicas))
	served := false
	for _, rep := range snap.Replicas {
		st := rep.State()
		if !st.Serves(model) {
			continue
		}
		served = true
		if st.Healthy {
			out = append(out, rep)
		}
	}
	switch {
	case !served:
		return nil, apierror.NotFound("model_not_found", "The model `%s` does not exist.", model)
	case len(out) == 0:
		return nil, apierror.Unavailable(nil, "no healthy replica serves model %s; try again shortly", model)
	}
	return out, nil
}

func findReplica(rs []*fleet.Replica, name string) *fleet.Replica {
	for _, r := range rs {
		if r.Spec.Name == name {
			return r
		}
	}
	return nil
}

// tokenize gets r's token ids from one of the eligible replicas, trying a
// second one if the first fails.
func (g *Gateway) tokenize(ctx context.Context, r *request, eligible []*fleet.Replica) ([]uint32, error) {
	var err error
	start := int(g.tokenizeNext.Add(1))
	for i := range min(2, len(eligible)) {
		rep := eligible[(start+i)%len(eligible)]
		var ids []uint32
		if ids, err = g.tok.tokens(ctx, rep.Spec.URL, r); err == nil {
			return ids, nil
		}
	}
	return nil, err
}

// resolveURLs parses each candidate's base URL.
func (g *Gateway) resolveURLs(p *plan) error {
	for i := range p.order {
		u, err := url.Parse(p.order[i].replica.Spec.URL)
		if err != nil {
			return fmt.Errorf("gateway: replica %s url: %w", p.order[i].replica.Spec.Name, err)
		}
		p.order[i].url = u
	}
	return nil
}

// debugHeaders names the chosen replica, the decision and each replica's
// score breakdown.
func (g *Gateway) debugHeaders(h interface{ Set(string, string) }, x *exchange) {
	p := x.plan
	if p == nil || x.replica == nil {
		return
	}
	h.Set("X-Warmpath-Replica", x.replica.Spec.Name)
	h.Set("X-Warmpath-Reason", p.reason)
	h.Set("X-Warmpath-Session", x.req.session.Source)
	h.Set("X-Warmpath-Prompt-Tokens", fmt.Sprint(p.promptTokens))
	h.Set("X-Warmpath-Predicted-Cached", fmt.Sprint(x.predicted))
	h.Set("X-Warmpath-Attempts", fmt.Sprint(x.attempts))
	if p.rebind != "" {
		h.Set("X-Warmpath-Rebind", p.rebind)
	}
	// Pure pickers (round-robin, session-hash) leave no scores.
	if d := p.decision; d != nil && d.Totals != nil {
		var parts []string
		for i, e := range p.eps {
			s := fmt.Sprintf("%s=%.3f", e.ID, d.Totals[i])
			var terms []string
			for name, contrib := range d.Breakdown {
				terms = append(terms, fmt.Sprintf("%s:%.3f", name, contrib[i]))
			}
			slices.Sort(terms)
			if len(terms) > 0 {
				s += "(" + strings.Join(terms, ",") + ")"
			}
			parts = append(parts, s)
		}
		h.Set("X-Warmpath-Scores", strings.Join(parts, "; "))
	}
}
