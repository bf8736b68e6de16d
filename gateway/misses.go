package gateway

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/gateway/routing"
	"github.com/warmpath/warmpath/internal/lru"
	"github.com/warmpath/warmpath/misses"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/tenancy"
)

// Miss attribution (package misses, issue #39): when a request's answer
// ends with the replica's usage, explain its uncached prompt tokens. The
// turn's prompt is compared with its previous turn's (the session's, or
// else the tenant's recent prompt it continues: a client that changes its
// opening gets a new session key every turn), the break goes to the
// tenant's hints, and the uncached tokens are split by cause with what
// routing knew: the tokens predicted cached on the replica that answered,
// the best other replica's, the rebind reason, and whether the replica
// joined or restarted since the previous turn. The split feeds
// warmpath_uncached_tokens_total, the tenant's usage and the status page.

// missKeep bounds the previous turns whose sequence number the tracker
// remembers (to tell a replica that changed since then): beyond it the
// oldest are forgotten, and their next turns count the replica as known.
const missKeep = 1 << 17

// missTracker is the gateway's miss attribution. It is safe for
// concurrent use.
type missTracker struct {
	prev   *misses.Previous
	recent *misses.Recent
	hints  *misses.Hints
	// blockTokens is the prefix index's block size, the size of the block
	// keys routing computed.
	blockTokens int
	uncached    *prometheus.CounterVec // tenant, model, cause

	mu sync.Mutex // guards seq, turnSeq, order, reps, primed and totals
	// seq numbers the attributed turns; turnSeq holds the number of the
	// turn each kept fingerprint was made by (order bounds it).
	seq     uint64
	turnSeq map[*misses.Fingerprint]uint64
	order   lru.Set[*misses.Fingerprint]
	// reps holds, per replica name, the member last seen answering, its
	// restarts then, and the turn number at which it was seen to join or
	// restart; primed is set once the fleet's first members are in.
	reps   map[string]replicaEpoch
	primed bool
	// totals are the uncached tokens by cause since start, by metric
	// tenant label (bounded like the metric's).
	totals map[string]*[misses.NumCauses]int64
}

// replicaEpoch is what the tracker knows of a replica's cache lifetime.
type replicaEpoch struct {
	rep      *fleet.Replica
	restarts int
	changed  uint64 // the turn number at which it joined or restarted; 0: before every turn
}

func newMissTracker(blockTokens int, reg prometheus.Registerer) *missTracker {
	t := &missTracker{
		prev:        misses.NewPrevious(0),
		recent:      misses.NewRecent(misses.RecentConfig{}),
		hints:       misses.NewHints(misses.HintsConfig{}),
		blockTokens: blockTokens,
		uncached: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmpath_uncached_tokens_total",
			Help: "Prompt tokens not served from cache (prompt − cached, as the replicas reported them), by cause: new, client_prefix_break, evicted, routed_away, stale_index, cold_replica.",
		}, []string{"tenant", "model", "cause"}),
		turnSeq: map[*misses.Fingerprint]uint64{},
		reps:    map[string]replicaEpoch{},
		totals:  map[string]*[misses.NumCauses]int64{},
	}
	reg.MustRegister(t.uncached)
	return t
}

// missed attributes an answered exchange's uncached prompt tokens (u is
// the usage its replica reported): the hook at the end of accounting.
func (g *Gateway) missed(x *exchange, u request.Usage) {
	t := g.miss
	r := x.req
	opt := misses.Options{BytesPerToken: r.BytesPerToken, BlockTokens: t.blockTokens}
	if p := r.Principal(); p != nil {
		opt.Excerpts = p.BreakExcerpts
	}
	prompt := t.prompt(r.R, x.route)
	prev, d := t.previous(r.R, prompt, opt)
	fresh, seq := t.observe(x.replica, g.fleet, prev)
	turn := misses.Turn{
		Prompt: u.PromptTokens, Cached: u.CachedTokens, Previous: d.Previous, Matched: d.Matched,
		Predicted: t.predicted(x, d), BestOther: x.route.BestOther(x.replica.Spec.Name), Fresh: fresh,
		Route: misses.RouteOf(x.route.Plan.Rebind), BlockTokens: t.blockTokens,
	}
	causes := misses.Split(turn)
	t.count(g.tenant(x), r.Model(), causes)
	if p := r.Principal(); p != nil && g.tenants.usage != nil {
		g.tenants.usage.Record(p, tenancy.Counts{Uncached: uncachedCounts(causes)})
	}
	if prompt == nil {
		return
	}
	tenant := missTenant(r.R)
	t.hints.Observe(tenant, time.Now(), d)
	fp := prompt.Fingerprint(opt)
	fp.Tokens = u.PromptTokens
	t.keep(fp, seq)
	if s := r.Session().Value; s != "" {
		t.prev.Put(s, fp)
	}
	t.recent.Add(tenant, r.Session().Family, fp)
}

// predicted is the prefix routing predicted cached on the replica that
// answered. A sticky turn's prediction is not the index's: it is the
// session's previous prompt, on the assumption that the turn extends it
// (session.Binding); when the client broke the prefix, what lies past the
// break was the client's doing, not a stale index, so the prediction is
// cut at the break's block.
func (t *missTracker) predicted(x *exchange, d misses.Diff) int {
	p := x.predicted
	if !d.Broke() || x.route.Plan.Reason != scoring.ReasonSticky {
		return p
	}
	m := d.Matched
	if t.blockTokens > 0 {
		m -= m % t.blockTokens
	}
	return min(p, m)
}

// missTenant is the tenant id the diagnostics are kept under: "default"
// without tenancy.
func missTenant(r *request.R) string {
	if p := r.Principal(); p != nil {
		return p.TenantID
	}
	return "default"
}

// prompt renders a chat request's prompt for the break locator, with
// the block keys routing computed (nil when it did not tokenize); nil for
// a request that is not chat.
func (t *missTracker) prompt(r *request.R, rt *routing.Route) *misses.Prompt {
	if r.API() != request.Chat {
		return nil
	}
	msgs, tools := r.Parts()
	p, err := misses.NewPrompt(msgs, tools)
	if err != nil {
		return nil
	}
	if rt.Keys != nil {
		p.SetBlocks(rt.Keys, t.blockTokens)
	}
	return p
}

// previous finds the turn p continues, the session's last one first,
// then the tenant's recent prompt it most likely continues, and where p
// departs from it.
func (t *missTracker) previous(r *request.R, p *misses.Prompt, opt misses.Options) (*misses.Fingerprint, misses.Diff) {
	if p == nil {
		return nil, misses.Diff{}
	}
	if s := r.Session().Value; s != "" {
		if fp := t.prev.Get(s); fp != nil {
			return fp, misses.Locate(fp, p, opt)
		}
	}
	return t.recent.Find(missTenant(r), r.Session().Family, p, opt)
}

// observe numbers this turn and reports whether rep joined or restarted
// after prev's turn (never without a previous turn). A member first seen
// answering after the fleet's first members were seen counts as joined
// then: until it answered, it held nothing of anyone's.
func (t *missTracker) observe(rep *fleet.Replica, f *fleet.Fleet, prev *misses.Fingerprint) (fresh bool, seq uint64) {
	restarts := rep.State().Restarts
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seq++
	if !t.primed {
		t.primed = true
		for _, m := range f.Snapshot().Replicas {
			t.reps[m.Spec.Name] = replicaEpoch{rep: m, restarts: m.State().Restarts}
		}
	}
	e, ok := t.reps[rep.Spec.Name]
	if !ok || e.rep != rep || restarts > e.restarts {
		e = replicaEpoch{rep: rep, restarts: restarts, changed: t.seq}
		t.reps[rep.Spec.Name] = e
	}
	if prev == nil {
		return false, t.seq
	}
	at, ok := t.turnSeq[prev]
	return ok && e.changed > at, t.seq
}

// keep remembers the turn number fp was made by, forgetting the oldest
// beyond missKeep.
func (t *missTracker) keep(fp *misses.Fingerprint, seq uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.turnSeq[fp] = seq
	t.order.Touch(fp)
	for t.order.Len() > missKeep {
		old, _ := t.order.RemoveOldest()
		delete(t.turnSeq, old)
	}
}

// count adds a request's causes to the metric and the totals.
func (t *missTracker) count(tenant, model string, c misses.Causes) {
	t.mu.Lock()
	tot := t.totals[tenant]
	if tot == nil {
		tot = new([misses.NumCauses]int64)
		t.totals[tenant] = tot
	}
	for cause, n := range c {
		tot[cause] += int64(n)
	}
	t.mu.Unlock()
	for cause, n := range c {
		if n > 0 {
			t.uncached.WithLabelValues(tenant, model, misses.Cause(cause).String()).Add(float64(n))
		}
	}
}

// byTenant returns the uncached tokens by cause since start, by metric
// tenant label, for the status page.
func (t *missTracker) byTenant() map[string]map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]map[string]int64, len(t.totals))
	for tenant, tot := range t.totals {
		m := make(map[string]int64, misses.NumCauses)
		for c, n := range tot {
			m[misses.Cause(c).String()] = n
		}
		out[tenant] = m
	}
	return out
}

// uncachedCounts converts a split for the tenant's usage.
func uncachedCounts(c misses.Causes) tenancy.Uncached {
	return tenancy.Uncached{
		New: int64(c[misses.CauseNew]), ClientBreak: int64(c[misses.CauseClientBreak]), Evicted: int64(c[misses.CauseEvicted]),
		RoutedAway: int64(c[misses.CauseRoutedAway]), StaleIndex: int64(c[misses.CauseStaleIndex]), ColdReplica: int64(c[misses.CauseColdReplica]),
	}
}
