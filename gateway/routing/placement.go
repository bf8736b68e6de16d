package routing

import (
	"context"
	"slices"
	"time"

	"github.com/warmpath/warmpath/gateway/admission"
	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/session"
)

// Placement is a request's routing, split around admission: prepare
// does the I/O before the request may wait (fleet snapshot, session
// binding, prefix match when the plan needs one); place decides, with
// the gateway's own scoring.Decide on the replicas' load as it is when the
// queue considers the request (late binding), and tells the queue whether
// the replica chosen can start it now; route uses the plan place made.
type Placement struct {
	router *Router
	r      *Turn
	reps   []*fleet.Replica
	in     *scoring.Input
	bind   session.Binding
	// version is the fleet's membership version reps were read at
	// (follow).
	version uint64
	// keys and chunks are the prompt's block keys and text chunks, for
	// commit; nil when it was not matched.
	keys, chunks []uint64

	// plan is the decision place made, valid when placed; claim is the
	// room it claimed for it (claimTokens its uncached prompt), given back
	// once the request is sent (or ends before).
	plan   scoring.Plan
	placed bool
	claim  *admission.Claim
}

// Prepare gathers r's routing inputs and matches its prompt when the
// policy would need the match to decide now. A model nothing serves is a
// 404 and one with no healthy replica a 503, before admission.
func (g *Router) Prepare(ctx context.Context, r *Turn) (*Placement, error) {
	version := g.fleet.Snapshot().Version // before gather reads the members: a change between is followed
	reps, in, bind, err := g.gather(ctx, r)
	if err != nil {
		return nil, err
	}
	p := &Placement{router: g, r: r, reps: reps, in: in, bind: bind, version: version}
	if p.Bound() {
		// Such a policy's first phase is pure (a sticky plan or "needs the
		// prefix"), so deciding here does not advance a picker.
		plan, err := g.policy.Decide(in)
		if err != nil {
			return nil, apierror.Unavailable(err, "no healthy replica serves model %s; try again shortly", r.Model())
		}
		if plan.NeedsPrefix {
			p.match(ctx)
		}
	}
	r.Placement = p
	return p, nil
}

// Bound reports whether the policy binds a request to a replica (by its
// session or its prefix), so that where it can start depends on which
// request it is: only then does the queue ask place. The others (such as
// round-robin, whose every decision advances its rotation) are routed
// once, as they leave the queue.
func (p *Placement) Bound() bool {
	return p.router.policy.TracksSessions() || p.router.policy.NeedsPrefix()
}

// match fills the input's prefix matches (tokenizing when the policy
// needs token ids) and the matched prefix's demand (ObserveDemand).
func (p *Placement) match(ctx context.Context) {
	p.keys, p.chunks = p.router.matchPrefix(ctx, p.r, p.reps, p.in)
	p.router.ObserveDemand(p.r, p.in, p.keys)
}

// refresh reads the replicas' load and availability as they are at now,
// following the fleet's membership first (follow; waiting, also the
// members that began to serve the model since).
func (p *Placement) refresh(now time.Time, waiting bool) {
	p.follow(waiting)
	eps := endpoints(p.reps, now)
	for i := range eps {
		eps[i].PromptBlocksOnly = p.in.Endpoints[i].PromptBlocksOnly
	}
	c := p.router.capacity
	c.KeepReserve(p.r.Class(), p.reps, eps)
	c.AddClaims(p.reps, eps)
	p.router.backlog.Fill(p, p.reps, eps)
	p.in.Now, p.in.Endpoints, p.in.Backlog = now, eps, p.router.backlog.Of(p.r.Model())
}

// follow re-reads the replicas serving the request's model when the
// fleet's membership changed since they were read: a request may wait in
// the queue through a rolling restart, and one routed on the members of
// its arrival would go to replicas that have left (whose last state still
// reads healthy: nothing probes them any more) and never to the ones that
// joined. Members that stay keep what the request knows of them (its
// prefix match); one that joined is taken to hold nothing of the prompt
// (its cache starts empty; what it has gathered since it joined is not
// looked up, which would be one index match per change). A session
// bound to a replica that left is rebound (scoring.RebindGone) and
// matched again as it is routed. A member that joined serves a model
// only once its first probe has read it, which changes no version: with
// waiting (the queue's placement, where a request may wait long), the
// members are compared whatever the version.
func (p *Placement) follow(waiting bool) {
	snap := p.router.fleet.Snapshot()
	if snap.Version == p.version && !waiting {
		return
	}
	p.version = snap.Version
	reps := servingIn(snap, p.r.Model())
	if slices.Equal(reps, p.reps) {
		return
	}
	was := make(map[*fleet.Replica]int, len(p.reps))
	for i, rep := range p.reps {
		was[rep] = i
	}
	in := p.in
	eps := make([]scoring.Endpoint, len(reps))
	carry := func(old []int) []int {
		if old == nil {
			return nil
		}
		out := make([]int, len(reps))
		for i, rep := range reps {
			if j, ok := was[rep]; ok {
				out[i] = old[j]
			}
		}
		return out
	}
	for i, rep := range reps {
		if j, ok := was[rep]; ok {
			eps[i] = in.Endpoints[j]
		} else if in.Binding != nil && rep.Spec.Name == in.Binding.Replica {
			// The session's replica left and came back (a new member,
			// whose index the gateway forgot): nothing says it holds the
			// session any more.
			in.BoundHolds = false
		}
	}
	in.Matched, in.MatchedCPU = carry(in.Matched), carry(in.MatchedCPU)
	p.reps, in.Endpoints = reps, eps
}

// Place is the request's fairq.Ticket.Place: it routes the request on
// the fleet as it is now and reports whether the replica chosen has room
// for its class (admission.Capacity.Claim). When it has, the plan is the one
// the request is sent with, and the room stays claimed until it is sent.
// A plan that needs the prompt matched first (a session leaving its
// replica, when the match was not needed on arrival) cannot be made
// without I/O: such a request fits, and route matches it after dispatch,
// as does one nothing can serve (route answers the 503).
func (p *Placement) Place(c *admission.Capacity) bool {
	now := time.Now()
	p.refresh(now, true)
	p.in.Backlog = max(0, p.in.Backlog-1) // the backlog it would delay is the others waiting
	plan, err := p.router.policy.Decide(p.in)
	if err != nil || plan.NeedsPrefix {
		return true
	}
	tokens := int64(max(0, plan.PromptTokens-plan.Predicted[0]))
	claim, ok := c.Claim(p.reps[plan.Chosen()], p.r.Class(), tokens, now)
	p.router.backlog.Plan(p, p.reps[plan.Chosen()], &plan, ok)
	if !ok {
		return false
	}
	p.plan, p.placed, p.claim = plan, true, claim
	return true
}

// Unclaim gives back the room place claimed, once: when the request has
// been sent (the replica's in-flight count has it) or ends before.
func (p *Placement) Unclaim() {
	if p != nil {
		p.claim.Release()
	}
}

// Placed reports whether the queue placed the request (Place found it
// room, and Route uses that plan).
func (p *Placement) Placed() bool { return p != nil && p.placed }
