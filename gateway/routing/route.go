package routing

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/session"
)

// Route is a routing decision with what the gateway needs to carry it
// out: the replicas behind the plan's endpoint indexes, and the session
// binding to update when the turn completes.
type Route struct {
	Plan scoring.Plan
	// Reps are the replicas behind Plan's endpoints (aligned with
	// in.Endpoints).
	Reps []*fleet.Replica
	Eps  []scoring.Endpoint
	// session and binding are the session key and the binding in force
	// after routing ("" and zero when the policy keeps no bindings).
	session string
	binding session.Binding
	// At is when the plan was made: the first candidate's estimate is
	// checked against the time from here to its first byte.
	At time.Time
	// speculated, when not nil, closes when the speculative blocks of a
	// long prompt are recorded (commit); JoinSpeculation waits for it.
	speculated chan struct{}
	// proposed is set when commit kept a new or refreshed binding in
	// process memory only: rememberCompleted writes it to Redis, and a new
	// one (fresh) is also written when the replica's first byte arrives.
	proposed, fresh bool
	// Keys are the prompt's block keys routing computed (nil when it did
	// not tokenize), for the miss attribution (misses.go).
	Keys []uint64
}

// speculateAsideKeys is the prompt length, in block keys, from which commit
// records the speculative blocks beside the upstream call rather than
// before it: about 0.7 µs a key (BenchmarkSpeculate16k), so 0.7 ms on a
// 16k-token prompt, against a goroutine's microsecond.
const speculateAsideKeys = 64

// JoinSpeculation waits for commit's speculation, so that by the time the
// client has its response the chosen replica's predicted blocks are in the
// index, as if they had been recorded before forwarding.
func (rt *Route) JoinSpeculation() {
	if rt != nil && rt.speculated != nil {
		<-rt.speculated
	}
}

// Estimate returns the plan's TTFT estimate for the named replica, if it
// has one.
func (rt *Route) Estimate(replica string) (scoring.Estimate, bool) {
	for k, i := range rt.Plan.Order {
		if rt.Eps[i].ID == replica && k < len(rt.Plan.Estimates) {
			return rt.Plan.Estimates[k], true
		}
	}
	return scoring.Estimate{}, false
}

// Candidate returns the k-th replica of the plan and its predicted cached
// tokens.
func (rt *Route) Candidate(k int) (*fleet.Replica, int) {
	return rt.Reps[rt.Plan.Order[k]], rt.Plan.Predicted[k]
}

// Candidates is the number of replicas in the plan's order.
func (rt *Route) Candidates() int { return len(rt.Plan.Order) }

// PromptTokens is the plan's prompt size in tokens.
func (rt *Route) PromptTokens() int { return rt.Plan.PromptTokens }

// Route decides where the admitted request r goes: the plan its
// placement made as it left the queue, or else scoring.Decide on the
// fleet as it is now (matching the prompt against the prefix index when
// the plan needs it); then it does the decision's I/O (remember the
// binding, speculate).
func (g *Router) Route(ctx context.Context, r *Turn) (*Route, error) {
	p := r.Placement
	plan, ok := p.plan, p.placed
	if !ok {
		p.refresh(time.Now(), r.QueueWait > 0) // one that waited compares members, as place does
		var err error
		plan, err = g.policy.Decide(p.in)
		if err == nil && plan.NeedsPrefix {
			p.match(ctx)
			plan, err = g.policy.Decide(p.in)
		}
		if err != nil {
			return nil, apierror.Unavailable(err, "no healthy replica serves model %s; try again shortly", r.Model())
		}
	}
	rt := &Route{Plan: plan, Reps: p.reps, Eps: p.in.Endpoints}
	g.commit(ctx, r, rt, p.bind, p.keys, p.chunks)
	rt.At = time.Now()
	return rt, nil
}

// gather collects what the decision depends on: the replicas serving the
// model with their load and availability, and the session's binding.
func (g *Router) gather(ctx context.Context, r *Turn) ([]*fleet.Replica, *scoring.Input, session.Binding, error) {
	now := time.Now()
	reps := g.serving(r.Model())
	if len(reps) == 0 {
		return nil, nil, session.Binding{}, apierror.NotFound("model_not_found", "The model `%s` does not exist.", r.Model())
	}
	in := &scoring.Input{
		Now: now, Model: r.Model(), SessionKey: r.Session().Value, Endpoints: endpoints(reps, now),
		PromptTokens: r.Estimate(), TextBytes: r.TextBytes(), BlockSize: g.cfg.BlockSize,
		RefreshAfter: g.cfg.SessionTTL / 8, Continues: true, BoundHolds: true,
		Cost: g.cal.Cost(r.Model()), Backlog: g.backlog.Of(r.Model()),
	}
	g.capacity.KeepReserve(r.Class(), reps, in.Endpoints)
	var bind session.Binding
	if !g.policy.Binds(in.SessionKey) {
		return reps, in, bind, nil
	}
	g.tokenizeEarly(ctx, r, reps, in)
	bind, ok, err := g.lookup(ctx, r)
	if err != nil {
		g.m.redisErrors.WithLabelValues("lookup").Inc()
		g.log.DebugContext(ctx, "session lookup degraded", "err", err)
	}
	if g.policy.Estimated {
		// What conversations look like: how far they go, how long they
		// pause (the binding is rewritten as each turn completes).
		turn := 1
		if ok {
			turn = bind.Turns + 1
		}
		g.cal.ObserveTurn(r.Model(), turn, now.Sub(bind.Updated).Seconds())
		st := g.cal.Sessions(r.Model())
		in.Sessions = &st
	}
	if ok {
		in.Binding = &bind.Binding
		if g.policy.Sticky {
			in.Continues = bind.Continues(r.ApproxText())
		}
		if i := slices.IndexFunc(reps, func(rep *fleet.Replica) bool { return rep.Spec.Name == bind.Replica }); i >= 0 {
			in.BoundHolds, in.BoundOnCPU = g.stillHolds(reps[i], bind)
			in.Endpoints[i].PromptBlocksOnly = !g.index.CachesGenerated(bind.Replica)
		}
	} else if rel := r.Session().Relatives(); rel != "" && err == nil {
		// A conversation's first turn: where do its relatives run?
		if fam, ok, _ := g.sessions.Lookup(ctx, rel); ok {
			in.Parent = fam.Replica
		}
	}
	return reps, in, bind, nil
}

// lookup returns r's session binding. A chat conversation's first turn
// (no assistant turn yet) that this gateway has not bound asks Redis
// nothing: only a retry, or another conversation with the same opening,
// could have bound it, the prefix index finds where that prompt went,
// and the first turn's binding write (SET NX) still follows another
// gateway that bound it first. That spares a fresh prompt one of its two
// Redis round trips.
func (g *Router) lookup(ctx context.Context, r *Turn) (session.Binding, bool, error) {
	if r.API() == request.Chat && r.Turns() == 0 {
		if _, ok := g.sessions.Local(r.Session().Value); !ok {
			return session.Binding{}, false, nil
		}
	}
	return g.sessions.Lookup(ctx, r.Session().Value)
}

// tokenizeEarly starts tokenizing r before its session lookup when the
// lookup has to ask Redis about a session this gateway holds no binding
// of, which is almost always a first turn and then needs the tokens:
// the two round trips overlap. Should the session turn out bound after
// all (another gateway's, or one from before a restart) the ids land in
// the tokenize cache unused, or for the session's tip. Under
// routing.skip_unseen the prompt may need no tokens, so nothing starts.
func (g *Router) tokenizeEarly(ctx context.Context, r *Turn, reps []*fleet.Replica, in *scoring.Input) {
	if !g.policy.UsesPrecise || g.skipUnseen(r) {
		return
	}
	if _, ok := g.sessions.Local(in.SessionKey); ok {
		return
	}
	r.early = g.startTokenize(ctx, r.R, reps, in.Endpoints)
}

// serving returns the fleet's replicas that serve model, healthy or not,
// sorted by name.
func (g *Router) serving(model string) []*fleet.Replica {
	return servingIn(g.fleet.Snapshot(), model)
}

// servingIn returns the members of snap that serve model.
func servingIn(snap *fleet.Snapshot, model string) []*fleet.Replica {
	out := make([]*fleet.Replica, 0, len(snap.Replicas))
	for _, rep := range snap.Replicas {
		if st := rep.State(); st.Serves(model) {
			out = append(out, rep)
		}
	}
	return out
}

// endpoints describes reps as the router sees them at now: the one place
// replica health and saturation are read.
func endpoints(reps []*fleet.Replica, now time.Time) []scoring.Endpoint {
	eps := make([]scoring.Endpoint, len(reps))
	for i, rep := range reps {
		st := rep.State()
		sat, _ := rep.Saturated(now)
		line, headTokens, headFor := rep.PrefillLine(now)
		eps[i] = scoring.Endpoint{
			ID:                      rep.Spec.Name,
			Waiting:                 st.Waiting,
			Running:                 st.Running,
			KVUsage:                 st.KVUsage,
			InflightRequests:        rep.InflightRequests(),
			InflightPrefillTokens:   rep.InflightPrefillTokens(),
			InflightPrefillRequests: line,
			HeadPrefillTokens:       headTokens,
			HeadElapsed:             headFor.Seconds(),
			KVTokens:                st.NumGPUBlocks * st.BlockSize,
			CacheTokens:             st.NumGPUBlocks * st.BlockSize,
			CPUCacheTokens:          st.NumCPUBlocks * st.BlockSize,
			ArrivalRate:             st.Rates.Requests,
			UncachedRate:            st.Rates.Tokens,
			RequestTokens:           st.Rates.PerRequest(),
			Saturated:               sat,
			Unhealthy:               !st.Healthy,
			BlockSize:               st.BlockSize,
		}
	}
	return eps
}

// matchPrefix fills in.Matched from the policy's prefix index: the precise
// index over the prompt's token ids (and the exact prompt length), or the
// approximate one over its text. It returns the block keys and text
// chunks for commit (the chunks also feed the precise policies' record of
// what was sent, which spares unseen prompts the tokenizer). A failed
// tokenization routes on load alone rather than fail the request.
func (g *Router) matchPrefix(ctx context.Context, r *Turn, reps []*fleet.Replica, in *scoring.Input) (keys, chunks []uint64) {
	names := make([]string, len(in.Endpoints))
	for i := range in.Endpoints {
		names[i] = in.Endpoints[i].ID
	}
	switch {
	case g.policy.UsesPrecise:
		if g.skipUnseen(r) {
			// A prompt whose opening no replica was sent (as far as this
			// gateway's record of sent text tells) has nothing to match:
			// route it on load without the tokenizer round trip.
			chunks = g.approx.Keys(r.ApproxText(), r.Model(), r.CacheSalt())
			if len(chunks) > 0 && !g.approx.Seen(chunks[0], names) {
				g.m.tokenizeUnseen.Inc()
				in.Matched = make([]int, len(names))
				return nil, chunks
			}
		}
		call := r.early
		if call == nil {
			call = g.startTokenize(ctx, r.R, reps, in.Endpoints)
		}
		tokens, err := call.Wait(ctx)
		r.Tokenized = Tokenized{Start: call.Started, End: time.Now(), Source: call.Source, Tokens: len(tokens), Err: err}
		if err != nil {
			// Tokenizers backed off were logged when they refused.
			if !errors.Is(err, ErrTokenizeUnavailable) && g.tokenizeFailed != nil {
				g.tokenizeFailed(ctx, r.ID(), err)
			}
			in.Matched = make([]int, len(names))
			return nil, nil
		}
		in.PromptTokens = len(tokens)
		keys = g.index.Keys(tokens, r.Model(), r.CacheSalt())
		in.Matched, in.MatchedCPU = g.index.MatchTiers(keys, names, len(tokens), engineBlocks(in.Endpoints))
		return keys, chunks
	case g.policy.UsesApprox:
		chunks = g.approx.Keys(r.ApproxText(), r.Model(), r.CacheSalt())
		in.Matched = g.approx.MatchTokens(chunks, names, in.PromptTokens, r.BytesPerToken)
	}
	return keys, chunks
}

// skipUnseen reports whether routing.skip_unseen applies to r: not when
// an in-process tokenizer makes its ids cheap.
func (g *Router) skipUnseen(r *Turn) bool {
	return g.cfg.SkipUnseen && !g.tok.LocalFor(r.Model())
}

// ObserveDemand counts r as a request sharing the longest prefix of its
// prompt any replica holds, and gives the decision that prefix's demand
// (Input.Sharers), which prices a second copy of it. Only policies that
// estimate weigh it.
func (g *Router) ObserveDemand(r *Turn, in *scoring.Input, keys []uint64) {
	if !g.policy.Estimated || len(keys) == 0 {
		return
	}
	if k := scoring.HeldPrefix(in.Matched, in.MatchedCPU, keys, in.BlockSize); k != 0 {
		in.Sharers = g.cal.ObservePrefix(r.Model(), k, scoring.SessionID(in.SessionKey), float64(in.Now.UnixMicro())/1e6)
	}
}

// engineBlocks lists the endpoints' engine block sizes.
func engineBlocks(eps []scoring.Endpoint) []int {
	out := make([]int, len(eps))
	for i := range eps {
		out[i] = eps[i].BlockSize
	}
	return out
}

// commit does the decision's I/O: it records what the chosen replica will
// hold (approximate chunks, speculative blocks), writes the session
// binding (following another gateway that bound a first turn first), and
// counts the decision. A long prompt's speculative blocks are recorded
// beside the upstream call (route.speculated).
func (g *Router) commit(ctx context.Context, r *Turn, rt *Route, bind session.Binding, keys, chunks []uint64) {
	p := &rt.Plan
	chosen := rt.Eps[p.Chosen()].ID
	rt.Keys = keys
	if chunks != nil {
		g.approx.Record(chosen, chunks)
	}
	if ttl := g.cfg.SpeculativeTTL; keys != nil && ttl > 0 {
		if len(keys) < speculateAsideKeys {
			g.index.Speculate(chosen, keys, ttl)
		} else {
			done := make(chan struct{})
			go func() {
				defer close(done)
				g.index.Speculate(chosen, keys, ttl)
			}()
			rt.speculated = done
		}
	}
	if nb, ok := g.newBinding(r, p, bind, keys); ok {
		rt.session, rt.binding = r.Session().Value, nb
	}
	switch p.Bind {
	case scoring.BindReplace:
		// A rebinding is written at once: until it lands, Redis's copy
		// (the old replica) is what every lookup, this gateway's too, uses.
		if _, err := g.sessions.Remember(ctx, rt.session, rt.binding, false); err != nil {
			g.m.redisErrors.WithLabelValues("remember").Inc()
			g.log.DebugContext(ctx, "session remember degraded", "err", err)
		}
	case scoring.BindNew, scoring.BindRefresh:
		// Not on the request path: a new binding is written when a
		// stream's first byte arrives (PublishBinding), beside the
		// response, so it is in Redis before the client can send the next
		// turn to another gateway; both kinds when the response ends
		// (RememberCompleted), with what the turn left cached (a whole
		// answer's first byte is its end: one write).
		g.sessions.Propose(rt.session, rt.binding)
		rt.proposed, rt.fresh = true, p.Bind == scoring.BindNew
	}
	if fam := r.Session().Family; fam != "" && fam != rt.session && (p.Bind == scoring.BindNew || p.Bind == scoring.BindReplace) {
		// Publish where the family's conversation now runs, for its
		// relatives' first turns (scored turns only: sticky ones stay put).
		// It is advice, not a binding, so it goes through the write pool
		// and no turn waits for it; a full backlog drops it.
		fb := session.Binding{Binding: scoring.Binding{Replica: rt.Eps[p.Chosen()].ID}}
		g.writes.try(func(ctx context.Context) {
			if _, err := g.sessions.Remember(ctx, fam, fb, false); err != nil {
				g.m.redisErrors.WithLabelValues("remember").Inc()
			}
		})
	}
	sticky := p.Reason == scoring.ReasonSticky
	if g.policy.UsesPrecise && (!sticky && keys == nil || sticky && rt.binding.TipDepth == 0) {
		// A prompt routed without the tokenizer (an unseen opening, a
		// failed tokenization), or a session that came back without a
		// tip: tokenize it off the request path, so the chosen replica is
		// known to hold its blocks before their events arrive.
		g.tipLater(tipJob{req: r, reps: rt.Reps, eps: rt.Eps, replica: rt.Eps[p.Chosen()].ID, session: rt.session, binding: rt.binding})
	}
	if p.Rebind != "" {
		g.m.rebinds.WithLabelValues(p.Rebind).Inc()
	}
	g.m.decisions.WithLabelValues(p.Reason).Inc()
	if len(p.Estimates) > 0 && p.Estimates[0].Replication > 0 {
		g.m.copies.Inc()
	}
	if p.Reason == scoring.ReasonSticky {
		g.m.tokenizeAvoided.Inc()
	}
	if g.decided != nil {
		g.decided(r, rt)
	}
}

// newBinding is the session binding after this turn (session.After):
// the plan's, plus what only the gateway knows (the deepest block key,
// the text fingerprint); false when the plan leaves none. A sticky turn
// keeps the looked-up binding's.
func (g *Router) newBinding(r *Turn, p *scoring.Plan, bind session.Binding, keys []uint64) (session.Binding, bool) {
	nb, ok := session.After(p, bind, keys)
	if ok && p.Reason != scoring.ReasonSticky && g.policy.Sticky {
		nb.Fingerprint(r.ApproxText())
	}
	return nb, ok
}

// RememberCompleted records, when a turn's response ended, what the
// replica now holds of the session, so the next sticky turn predicts its
// cache hit without tokenizing: the prompt, and the output but for its
// last token (whose KV is never computed), which the next turn leaves out
// when the replica turns out to cache prompt blocks only (decided then,
// once this turn's KV events have arrived). u is zero when the turn did
// not complete (an error, a cut stream); a binding commit proposed is
// written all the same. The binding is updated in process memory at once
// (this gateway's next lookup prefers it) and written to Redis in a batch
// (bindingFlusher): the response's last bytes do not wait for Redis. A
// full backlog writes inline rather than lose the update.
func (g *Router) RememberCompleted(rt *Route, replica string, u request.Usage) {
	if rt.session == "" {
		return
	}
	if !g.updateCompleted(rt, replica, u) && !rt.proposed {
		return
	}
	g.flusher.add(rt.session)
}

// PublishBinding writes a first turn's binding, which commit kept in
// process memory, when its replica's first byte arrives: the SET NX GET
// runs beside the response, where before the request waited for it.
// Concurrent first turns of the session on other gateways may have
// started elsewhere; the first write to land binds the session, and the
// others adopt it (session.Store.FlushAll).
func (g *Router) PublishBinding(rt *Route) {
	if !rt.fresh || rt.session == "" {
		return
	}
	g.flusher.add(rt.session)
}

// updateCompleted updates the session's binding in process memory with
// what the turn left cached on replica, and reports whether it changed it.
func (g *Router) updateCompleted(rt *Route, replica string, u request.Usage) bool {
	if rt.binding.Replica != replica || u.PromptTokens == 0 {
		return false
	}
	_, changed := g.sessions.UpdateLocal(rt.session, rt.binding, func(b *session.Binding) bool {
		return b.Completed(replica, u.PromptTokens, u.CompletionTokens) // false: rebound meanwhile
	})
	return changed
}

// stillHolds reports whether rep still holds the session's prefix, as far
// as its KV events tell, and whether it holds the prefix's tip only in its
// CPU offload tier (scoring.Input.BoundOnCPU). Replicas that publish no
// events (or none yet) are trusted: the gateway cannot see their
// evictions.
func (g *Router) stillHolds(rep *fleet.Replica, b session.Binding) (holds, onCPU bool) {
	name := rep.Spec.Name
	if !g.index.Receiving(name) {
		return true, false
	}
	holds = b.StillHeld(func(tip uint64) bool {
		gpu, cpu := g.index.Tiers(name, tip)
		onCPU = !gpu && cpu
		return gpu || cpu
	})
	return holds, onCPU
}

// Tokenize gets r's token ids from the healthy replicas serving its
// model (or the tokenizer service, or in process).
func (g *Router) Tokenize(ctx context.Context, r *request.R) ([]uint32, error) {
	reps := g.serving(r.Model())
	return g.tokenize(ctx, r, reps, endpoints(reps, time.Now()))
}

// Retried counts a request answered by a replica after the first
// (warmpath_routing_decisions_total's retry).
func (g *Router) Retried() { g.m.decisions.WithLabelValues("retry").Inc() }

// tokenize gets r's token ids from the available replicas.
func (g *Router) tokenize(ctx context.Context, r *request.R, reps []*fleet.Replica, eps []scoring.Endpoint) ([]uint32, error) {
	return g.startTokenize(ctx, r, reps, eps).Wait(ctx)
}

// startTokenize starts tokenize's work without waiting for the answer.
func (g *Router) startTokenize(ctx context.Context, r *request.R, reps []*fleet.Replica, eps []scoring.Endpoint) *TokenCall {
	up := make([]*fleet.Replica, 0, len(reps))
	for i, rep := range reps {
		if !eps[i].Unhealthy {
			up = append(up, rep)
		}
	}
	return g.tok.Start(ctx, r, up)
}

// BestOther returns the most cached tokens the plan predicted on a
// replica other than the named one.
func (rt *Route) BestOther(replica string) int {
	best := 0
	for k, i := range rt.Plan.Order {
		if rt.Eps[i].ID != replica && k < len(rt.Plan.Predicted) {
			best = max(best, rt.Plan.Predicted[k])
		}
	}
	return best
}
