package scoring

import (
	"cmp"
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Binding is what routing knows of a session's affinity to one replica:
// the routing-relevant part of the record package session stores.
type Binding struct {
	// Replica is the bound replica's ID.
	Replica string
	// TipDepth is how many of the conversation's blocks (of
	// Input.BlockSize tokens) are known cached on Replica: the full blocks
	// of the last scored turn's prompt.
	TipDepth int
	// CachedTokens is how many tokens of the conversation Replica is
	// believed to hold after the last completed turn; 0 when unknown.
	CachedTokens int
	// GeneratedTokens is the part of CachedTokens the last completed turn
	// generated: held only by engines that cache the blocks generated
	// tokens fill (not by Endpoint.PromptBlocksOnly ones).
	GeneratedTokens int
	// PromptTokens and PromptBytes are the last scored turn's prompt length
	// in tokens and in bytes of text; their ratio estimates later turns'
	// lengths without tokenizing.
	PromptTokens, PromptBytes int
	// Turns counts turns routed for the session.
	Turns int
	// Updated is when the binding was last written.
	Updated time.Time
}

// Input is everything one routing decision depends on. The caller gathers
// it (fleet snapshot, session binding, and, in the second phase, prefix
// matches); Decide does no I/O and reads no clock.
type Input struct {
	// Now is the decision's time, for the binding's refresh.
	Now time.Time
	// Model and SessionKey identify the request; SessionKey is "" when the
	// request names no session.
	Model, SessionKey string
	// Endpoints are the replicas serving Model, healthy or not, each with
	// its load and availability. Decide judges availability from them.
	Endpoints []Endpoint
	// PromptTokens is the prompt's length in tokens: exact once tokenized,
	// an estimate from its text before.
	PromptTokens int
	// TextBytes is the size of the prompt's text; 0 when the caller has
	// only token counts (the offline analyzer).
	TextBytes int
	// Binding is the session's binding, nil when it has none or the policy
	// keeps none (see Policy.TracksSessions).
	Binding *Binding
	// Continues reports that the request continues the conversation the
	// binding was made for (its text starts with the bound turn's text).
	// A request that does not is another conversation sharing the key.
	Continues bool
	// BoundHolds reports whether the bound replica still holds the
	// session's prefix, as far as its KV events tell (true when they tell
	// nothing).
	BoundHolds bool
	// BoundOnCPU reports that the bound replica holds the session's tip
	// only in its CPU offload tier: the engine evicted it from GPU memory
	// and would load the prefix's tail back rather than find it there.
	// An estimated policy then scores the turn with its prefix known
	// (Matched, MatchedCPU) instead of pricing the whole prefix as
	// GPU-resident, which misses the load by CPUHitCost of a prefill per
	// token (a 200k-token conversation's half second).
	BoundOnCPU bool
	// Matched holds, aligned with Endpoints, how many prompt tokens each
	// is believed to hold cached: nil until the prefix phase (see
	// Plan.NeedsPrefix).
	Matched []int
	// MatchedCPU holds, aligned with Endpoints, how many prompt tokens
	// after Matched each holds in a CPU offload tier (see
	// Request.MatchedCPU); nil when none. The plan predicts both as
	// cached, as engines report them.
	MatchedCPU []int
	// BlockSize is the prefix index's block size in tokens.
	BlockSize int
	// RefreshAfter is how old a sticky session's binding may grow before
	// the turn rewrites it (renewing its TTL).
	RefreshAfter time.Duration
	// Cost is the model's timing model, calibrated (see Calibrator); the
	// zero value is DefaultCost.
	Cost Cost
	// Sessions describes the model's conversations (inter-turn gaps, turns
	// reached), for the cache-placement term; nil knows nothing.
	Sessions *SessionStats
	// Parent is the replica the request's parent conversation is bound to
	// (a sub-agent's, or another conversation under the same session id),
	// "" when none: estimated policies prefer it among equal costs, so a
	// family's first turns land together where nothing tells replicas
	// apart.
	Parent string
	// Sharers is how many requests shared, over the last horizon, the
	// prefix of this prompt that the best-matching replica holds (see
	// Calibrator.ObservePrefix): the demand that prices a second copy of
	// it, for the warmpath policy once Matched is known; 0 when unknown.
	Sharers float64
	// Backlog is how many requests for Model wait in the caller's
	// admission queue for room on the replicas (this gateway's; 0 without
	// a queue), not counting this one: each waits a share of any replica
	// time a decision spends (all of it on its own replica, for those
	// whose plan chose one: Endpoint.GatewayAhead and GatewayBehind),
	// which the warmpath policy prices in Estimate.Others.
	Backlog int
	// Rand breaks ties; nil uses the goroutine-safe top-level generator.
	Rand *rand.Rand
}

// BindWrite says what the caller should write to the session store after
// a decision.
type BindWrite uint8

const (
	// BindKeep writes nothing.
	BindKeep BindWrite = iota
	// BindRefresh rewrites the binding in force to renew its TTL.
	BindRefresh
	// BindNew writes Plan.Binding only if the session has no binding yet
	// (a first turn, which may race another gateway's).
	BindNew
	// BindReplace overwrites the binding with Plan.Binding.
	BindReplace
)

// Routing reasons (Plan.Reason).
const (
	ReasonSticky = "sticky" // the bound replica, no prefix information needed
	ReasonScored = "scored" // the policy scored every available replica
)

// Rebind reasons (Plan.Rebind): why a session left its bound replica.
const (
	RebindGone      = "gone"      // the bound replica is no longer a member
	RebindUnhealthy = "unhealthy" // it is a member but down
	RebindReserved  = "reserved"  // it is kept for another class (the interactive reserve)
	RebindSaturated = "saturated" // staying costs more than moving (estimated policies), or it is saturated while another is not
	RebindEvicted   = "evicted"   // it no longer holds the session's prefix
	RebindDiverged  = "diverged"  // the turn does not continue the bound conversation
	RebindRescored  = "rescored"  // a non-sticky policy scored the session elsewhere
)

// Plan is a routing decision.
type Plan struct {
	// NeedsPrefix reports that the policy needs prefix information: call
	// Decide again with Input.Matched filled (and PromptTokens exact, for
	// the precise index). Nothing else is set.
	NeedsPrefix bool
	// Order lists Input.Endpoints indexes by preference: the choice first,
	// then the retry targets. Only available endpoints appear.
	Order []int
	// Predicted holds, aligned with Order, how many prompt tokens each
	// candidate is predicted to serve from its cache.
	Predicted []int
	// Estimates holds, aligned with Order, each candidate's TTFT estimate,
	// for policies that know what each candidate holds (prefix policies
	// once matched, sticky turns); nil otherwise.
	Estimates []Estimate
	// PromptTokens is the prompt length the plan assumed.
	PromptTokens int
	// Reason is ReasonSticky or ReasonScored.
	Reason string
	// Rebind says why the session left its bound replica, "" if it did
	// not (or was not bound).
	Rebind string
	// Bind says what to write to the session store, and Binding is the
	// binding in force after this turn (the caller adds what Decide cannot
	// know: the tip block's key, the text fingerprint).
	Bind    BindWrite
	Binding Binding
	// Decision holds the scores, nil for sticky turns.
	Decision *Decision
}

// Chosen returns the index (into Input.Endpoints) of the chosen replica.
func (p *Plan) Chosen() int { return p.Order[0] }

// TracksSessions reports whether the policy uses session bindings: sticky
// policies and those with a session scorer.
func (p *Policy) TracksSessions() bool {
	return p.Sticky || slices.ContainsFunc(p.Scorers, func(w Weighted) bool { return w.Name == ScorerSession })
}

// Binds reports whether the policy keeps a binding for the session with
// key sessionKey: it tracks sessions, and the request names one.
func (p *Policy) Binds(sessionKey string) bool {
	return sessionKey != "" && p.TracksSessions()
}

// NeedsPrefix reports whether the policy scores on prefix matches.
func (p *Policy) NeedsPrefix() bool { return p.UsesPrecise || p.UsesApprox }

// Decide makes the whole routing decision for one request, in up to two
// phases. First without prefix information: a sticky turn whose bound
// replica is available, or a policy that needs no prefix information, is
// decided; otherwise the plan says NeedsPrefix, and the caller matches the
// prompt against its index and calls Decide again with Input.Matched.
//
// Availability is judged here and only here: an endpoint takes traffic
// when it is healthy. A sticky session stays on its replica while the
// replica also still holds its prefix and, for estimated policies,
// staying costs no more than moving to the cheapest other replica (taken
// to hold nothing of the prompt; otherwise the turn is scored with its
// prefix known) and the replica holds the session's tip on GPU (one held
// only in a CPU tier is scored with its prefix known, Input.BoundOnCPU);
// for other sticky policies, while the
// replica is unsaturated or every available endpoint is saturated (moving
// work then only trades a warm queue for a cold one).
func (p *Policy) Decide(in *Input) (Plan, error) {
	avail := available(in.Endpoints)
	if len(avail) == 0 {
		return Plan{}, ErrNoEndpoint
	}
	plan := Plan{PromptTokens: in.PromptTokens}
	b := in.Binding
	bound := b != nil && p.Binds(in.SessionKey)
	if p.Sticky && bound && !in.Continues {
		plan.Rebind, bound = RebindDiverged, false
	}
	if p.Sticky && bound {
		sp, why := p.stay(in, avail)
		// An estimated policy scores a turn whose prefix it knows, or
		// whose replica holds the tip only on CPU, instead of staying.
		scored := p.Estimated && (in.Matched != nil || in.BoundOnCPU)
		if why == "" && !scored {
			return sp, nil
		}
		plan.Rebind = why
	}
	if p.NeedsPrefix() && in.Matched == nil {
		return Plan{NeedsPrefix: true}, nil
	}
	if p.Estimated {
		p.cheapest(in, avail, &plan)
	} else if err := p.score(in, avail, bound, &plan); err != nil {
		return Plan{}, err
	}
	if p.Binds(in.SessionKey) {
		p.rebind(in, bound, &plan)
	}
	return plan, nil
}

// stay decides whether a bound session stays on its replica: it returns
// the sticky plan, or why the session must leave.
func (p *Policy) stay(in *Input, avail []int) (Plan, string) {
	i, why := stick(in, in.Binding.Replica, !p.Estimated && allSaturated(pick(in.Endpoints, avail)), !p.Estimated)
	if i < 0 {
		return Plan{}, why
	}
	sp := p.sticky(in, i, avail)
	if p.Estimated && len(sp.Order) > 1 && sp.Estimates[0].Cost() > sp.Estimates[1].Cost() {
		return Plan{}, RebindSaturated
	}
	return sp, ""
}

// Available reports whether the endpoint may take this request: it is
// healthy and not kept for another class (Reserved). It is the one rule:
// Decide, and whatever aligns with its decision (Decision.Totals), judge
// by it.
func (e *Endpoint) Available() bool { return !e.Unhealthy && !e.Reserved }

// available returns the indexes of the endpoints that may take traffic.
func available(eps []Endpoint) []int {
	out := make([]int, 0, len(eps))
	for i := range eps {
		if eps[i].Available() {
			out = append(out, i)
		}
	}
	return out
}

// pick returns eps[idx...] as a new slice.
func pick(eps []Endpoint, idx []int) []Endpoint {
	out := make([]Endpoint, len(idx))
	for k, i := range idx {
		out[k] = eps[i]
	}
	return out
}

// stick decides whether the session may stay on its bound replica: it
// returns the replica's index, or -1 and why the session must be rebound.
// With checkSat, a saturated replica must leave unless allSat (every
// available endpoint is saturated).
func stick(in *Input, bound string, allSat, checkSat bool) (int, string) {
	i := slices.IndexFunc(in.Endpoints, func(e Endpoint) bool { return e.ID == bound })
	switch {
	case i < 0:
		return -1, RebindGone
	case in.Endpoints[i].Unhealthy:
		return -1, RebindUnhealthy
	case in.Endpoints[i].Reserved:
		return -1, RebindReserved
	case checkSat && in.Endpoints[i].Saturated && !allSat:
		return -1, RebindSaturated
	case !in.BoundHolds:
		return -1, RebindEvicted
	}
	return i, ""
}

// sticky plans a turn for its bound replica i without prefix information:
// the prompt is estimated from the session's measured tokens per byte and
// the prediction from what the replica is known to hold; the other
// available replicas follow as retry targets, cheapest first (least
// backlog first for policies without estimates), each taken to hold
// nothing of the prompt.
func (p *Policy) sticky(in *Input, i int, avail []int) Plan {
	b := *in.Binding
	prompt := in.PromptTokens
	if b.PromptTokens > 0 && b.PromptBytes > 0 && in.TextBytes > 0 {
		prompt = max(1, int(int64(in.TextBytes)*int64(b.PromptTokens)/int64(b.PromptBytes)))
	}
	// A continuing turn's prompt holds at least what the replica caches of
	// the conversation, plus the new message.
	prompt = max(prompt, b.CachedTokens+1)
	bs := max(in.BlockSize, 1)
	cached := b.CachedTokens
	if in.Endpoints[i].PromptBlocksOnly {
		cached -= b.GeneratedTokens
	}
	known := max(b.TipDepth*bs, cached)
	predicted := min(known/bs*bs, max(0, prompt-1))
	if ebs := in.Endpoints[i].BlockSize; ebs > 0 {
		// The engine hits whole blocks of its own size, never the one
		// holding the prompt's last token.
		predicted = min(known, max(0, prompt-1)) / ebs * ebs
	}
	plan := Plan{
		Order:        []int{i},
		Predicted:    []int{predicted},
		PromptTokens: prompt,
		Reason:       ReasonSticky,
		Binding:      b,
	}
	rest := slices.DeleteFunc(slices.Clone(avail), func(j int) bool { return j == i })
	if p.Estimated || p.NeedsPrefix() {
		all := append([]int{i}, rest...)
		est := p.estimates(in, all, prompt, func(j int) int {
			if j == i {
				return predicted
			}
			return 0
		})
		others := est[1:]
		ord := make([]int, len(rest))
		for k := range ord {
			ord[k] = k
		}
		slices.SortStableFunc(ord, func(x, y int) int { return cmp.Compare(others[x].Cost(), others[y].Cost()) })
		plan.Estimates = []Estimate{est[0]}
		for _, k := range ord {
			plan.Order = append(plan.Order, rest[k])
			plan.Predicted = append(plan.Predicted, 0)
			plan.Estimates = append(plan.Estimates, others[k])
		}
	} else {
		slices.SortStableFunc(rest, func(x, y int) int {
			return cmp.Compare(in.Endpoints[x].InflightPrefillTokens, in.Endpoints[y].InflightPrefillTokens)
		})
		for _, j := range rest {
			plan.Order = append(plan.Order, j)
			plan.Predicted = append(plan.Predicted, 0)
		}
	}
	plan.Binding.Turns++ // written with the turn's cached tokens once it completes, or now on a refresh
	if in.Now.Sub(b.Updated) > in.RefreshAfter {
		plan.Bind = BindRefresh
	}
	return plan
}

// estimates returns the TTFT model's estimate for each endpoint of idx,
// for a prompt of prompt tokens of which endpoint j holds cached(j)
// (clamped to the prompt). Estimated policies add the placement term.
func (p *Policy) estimates(in *Input, idx []int, prompt int, cached func(j int) int) []Estimate {
	c := in.Cost.WithDefaults()
	price := queuePrice(in.Endpoints, float64(prompt))
	out := make([]Estimate, len(idx))
	for k, j := range idx {
		l := c.loadOf(&in.Endpoints[j], price)
		m := float64(min(max(cached(j), 0), prompt))
		out[k] = p.placed(in, &c, l, float64(prompt), m)
	}
	return out
}

// placed is the estimate for a prompt of prompt tokens, cached of them
// held, on a replica under load l: the TTFT model's, with the placement
// term for estimated policies.
func (p *Policy) placed(in *Input, c *Cost, l load, prompt, cached float64) Estimate {
	e := c.estimate(l, prompt-cached, cached)
	if p.Estimated {
		e.Others = c.others(l, e, in.backlogShare())
		if in.SessionKey != "" {
			e.Future = c.future(l, in.Sessions, in.turn(), prompt)
		}
	}
	return e
}

// backlogShare is the part of the admission queue's backlog that waits
// for each replica with no replica chosen yet: Backlog less the requests
// whose plan chose one (Endpoint.GatewayAhead and GatewayBehind, priced
// on their replica), over the available endpoints (the queue dispatches
// those to whichever has room, so a second of any replica's time delays
// their drain by a second over their number).
func (in *Input) backlogShare() float64 {
	n := in.Backlog
	for i := range in.Endpoints {
		n -= max(0, in.Endpoints[i].GatewayAhead) + max(0, in.Endpoints[i].GatewayBehind)
	}
	if n <= 0 {
		return 0
	}
	return float64(n) / float64(max(1, len(available(in.Endpoints))))
}

// turn is the request's turn in its session: 1 without a binding.
func (in *Input) turn() int {
	if in.Binding != nil {
		return in.Binding.Turns + 1
	}
	return 1
}

// replicate sets the replication term of the estimates est (aligned
// with avail, the prefix known) of the candidates that hold less of the
// prompt than the best: a copy there saves each of in.Sharers requests
// like this one what it would pay on the cheapest holder beyond what it
// would pay there as a holder (see replication).
func (p *Policy) replicate(in *Input, avail []int, est []Estimate) {
	if !p.Estimated || !(in.Sharers > 0) || len(est) < 2 {
		return
	}
	var best int64
	for k := range est {
		best = max(best, est[k].CachedTokens)
	}
	held := math.Inf(1)
	for k := range est {
		if est[k].CachedTokens == best {
			held = min(held, est[k].Cost())
		}
	}
	c := in.Cost.WithDefaults()
	price := queuePrice(in.Endpoints, float64(in.PromptTokens))
	for k, j := range avail {
		if est[k].CachedTokens < best {
			l := c.loadOf(&in.Endpoints[j], price)
			as := p.placed(in, &c, l, float64(in.PromptTokens), float64(best))
			est[k].Replication = replication(in.Sharers, held, as.Cost())
		}
	}
}

// effectiveHit is endpoint j's prompt tokens the model counts as cached:
// its GPU hit, plus the CPU tier's less the transfer each of those tokens
// still costs (CPUHitCost of a prefill), so that
//
//	uncached = P − Matched − (1 − CPUHitCost) × MatchedCPU
//
// in the estimate's own-prefill, steps and Others terms.
func (in *Input) effectiveHit(j int) int {
	m := in.Matched[j]
	if in.MatchedCPU != nil {
		m += int(math.Round((1 - CPUHitCost) * float64(in.MatchedCPU[j])))
	}
	return m
}

// cheapest orders the available endpoints by estimated cost, cheapest
// first: exact ties go to the parent's replica, then at random.
func (p *Policy) cheapest(in *Input, avail []int, plan *Plan) {
	est := p.estimates(in, avail, in.PromptTokens, in.effectiveHit)
	p.replicate(in, avail, est)
	ord := make([]int, len(avail))
	for k := range ord {
		ord[k] = k
	}
	shuffle(ord, in.Rand)
	parent := func(k int) int {
		if in.Parent != "" && in.Endpoints[avail[k]].ID == in.Parent {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(ord, func(x, y int) int {
		if c := cmp.Compare(est[x].Cost(), est[y].Cost()); c != 0 {
			return c
		}
		return cmp.Compare(parent(x), parent(y))
	})
	plan.Reason = ReasonScored
	plan.Order = make([]int, len(ord))
	plan.Predicted = make([]int, len(ord))
	plan.Estimates = make([]Estimate, len(ord))
	for n, k := range ord {
		plan.Order[n] = avail[k]
		plan.Predicted[n] = in.Matched[avail[k]]
		if in.MatchedCPU != nil {
			plan.Predicted[n] += in.MatchedCPU[avail[k]] // engines count loads as cached
		}
		plan.Estimates[n] = est[k]
	}
}

// score runs the policy's scorers and picker over the available endpoints.
func (p *Policy) score(in *Input, avail []int, bound bool, plan *Plan) error {
	r := &Request{Model: in.Model, SessionKey: in.SessionKey, PromptTokens: in.PromptTokens}
	if bound {
		r.Bound = in.Binding.Replica
	}
	if in.Matched != nil {
		r.Matched = make([]int, len(avail))
		for k, i := range avail {
			r.Matched[k] = in.Matched[i]
		}
	}
	if in.MatchedCPU != nil {
		r.MatchedCPU = make([]int, len(avail))
		for k, i := range avail {
			r.MatchedCPU[k] = in.MatchedCPU[i]
		}
	}
	d, err := p.Route(context.Background(), r, pick(in.Endpoints, avail), in.Rand)
	if err != nil {
		return err
	}
	plan.Decision = &d
	plan.Reason = ReasonScored
	plan.Order = make([]int, len(d.Order))
	plan.Predicted = make([]int, len(d.Order))
	for k, j := range d.Order {
		plan.Order[k] = avail[j]
		if r.Matched != nil {
			plan.Predicted[k] = r.Matched[j]
		}
		if r.MatchedCPU != nil {
			plan.Predicted[k] += r.MatchedCPU[j]
		}
	}
	if in.Matched != nil {
		plan.Estimates = p.estimates(in, plan.Order, in.PromptTokens, in.effectiveHit)
	}
	return nil
}

// rebind fills the binding a scored turn leaves behind.
func (p *Policy) rebind(in *Input, bound bool, plan *Plan) {
	chosen := in.Endpoints[plan.Chosen()].ID
	turns := 1
	if in.Binding != nil {
		turns = in.Binding.Turns + 1
	}
	switch {
	case plan.Rebind == "" && bound && in.Binding.Replica != chosen:
		plan.Rebind = RebindRescored
	case plan.Rebind == RebindSaturated && in.Binding.Replica == chosen:
		plan.Rebind = "" // scored with its prefix known, the bound replica won after all
	}
	plan.Binding = Binding{Replica: chosen, PromptTokens: in.PromptTokens, PromptBytes: in.TextBytes, Turns: turns}
	plan.Bind = BindReplace
	if !bound && plan.Rebind == "" {
		plan.Bind = BindNew // a first turn: written only if no other gateway bound it first
	}
}
