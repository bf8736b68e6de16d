package gateway

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/internal/lru"
	"github.com/warmpath/warmpath/misses"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/session"
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
//
// The work is off the response path: missed, at the end of accounting,
// takes what the attribution needs and queues it; the tracker's one
// worker (missTracker.Run, under Gateway.Run's errgroup) attributes the
// turns in order. Under overload, when the worker is missQueue jobs or
// missQueueBytes behind, a turn is dropped instead
// (warmpath_miss_attribution_dropped_total{reason="queue_full"}): its
// uncached tokens are counted in warmpath_prompt_tokens_total but in no
// cause, and its session's next turn is compared with the turn before.

// missKeep bounds the previous turns whose sequence number the tracker
// remembers (to tell a replica that changed since then): beyond it the
// oldest are forgotten, and their next turns count the replica as known.
const missKeep = 1 << 17

// The attribution's queue (missed → missTracker.Run). A job holds its
// request's messages and tools (views of the client's body) and block
// keys until the worker is done with it, so the queue is bounded by bytes
// as well as by jobs: 64 MiB is about 0.6 s of the worker's time at
// misses.BenchmarkTurn's 0.9 ms per 100 KB.
const (
	missQueue      = 4096
	missQueueBytes = 64 << 20
	// missFinish is how long Run keeps attributing queued turns after its
	// context ends; what is still queued then is dropped and counted.
	missFinish = time.Second
)

// missTracker is the gateway's miss attribution. missed queues each
// answered request's job; one goroutine (Run) attributes them in the order
// they were queued, so a session's turn is attributed before its next
// one. Its methods are safe for concurrent use.
type missTracker struct {
	prev   *misses.Previous
	recent *misses.Recent
	hints  *misses.Hints
	// blockTokens is the prefix index's block size, the size of the block
	// keys routing computed.
	blockTokens int
	uncached    *prometheus.CounterVec // tenant, model, cause
	dropped     *prometheus.CounterVec // reason
	fleet       *fleet.Fleet
	usage       *tenancy.Usage // nil without tenancy
	log         *slog.Logger
	dropWarn    sometimes

	jobs   chan *missJob
	queued atomic.Int64 // bytes held by the jobs in jobs (missJob.bytes)
	// grace is how long Run keeps attributing after its context ends
	// (missFinish).
	grace time.Duration

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

// missJob is what the attribution of one answered request needs, taken
// on the response path: values, and views of what is no longer written
// once the request is answered (the client's body behind messages and
// tools, request.R's; routing's block keys, which the recorder shares
// too). A job with done set is a flush's marker: the worker closes done.
type missJob struct {
	tenant   string // the metric's tenant label
	tenantID string // the diagnostics' (missTenant)
	model    string
	session  session.Key
	p        *tenancy.Principal // nil without tenancy
	opt      misses.Options
	// chat is set for a chat request, the only kind whose prompt is
	// compared; messages, tools and keys are its parts and block keys.
	chat            bool
	messages, tools gjson.Result
	keys            []uint64
	usage           request.Usage
	rep             *fleet.Replica // the replica that answered
	restarts        int            // its restarts when it answered
	predicted       int            // cached tokens predicted on rep
	sticky          bool           // the plan kept the session's binding
	bestOther       int
	route           misses.Route
	at              time.Time // when the answer ended
	bytes           int64     // held by the job, for missQueueBytes

	done chan struct{}
}

func newMissTracker(blockTokens int, reg prometheus.Registerer, log *slog.Logger, f *fleet.Fleet, usage *tenancy.Usage) *missTracker {
	t := &missTracker{
		prev:        misses.NewPrevious(0),
		recent:      misses.NewRecent(misses.RecentConfig{}),
		hints:       misses.NewHints(misses.HintsConfig{}),
		blockTokens: blockTokens,
		uncached: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmpath_uncached_tokens_total",
			Help: "Prompt tokens not served from cache (prompt − cached, as the replicas reported them), by cause: new, client_prefix_break, evicted, routed_away, stale_index, cold_replica.",
		}, []string{"tenant", "model", "cause"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmpath_miss_attribution_dropped_total",
			Help: "Answered requests whose uncached tokens were not attributed (not in warmpath_uncached_tokens_total, the tenant's usage by cause or the prefix-break hints), by reason: queue_full (the attribution worker was behind), shutdown (still queued when shutdown's bound passed).",
		}, []string{"reason"}),
		fleet:   f,
		usage:   usage,
		log:     log,
		jobs:    make(chan *missJob, missQueue),
		grace:   missFinish,
		turnSeq: map[*misses.Fingerprint]uint64{},
		reps:    map[string]replicaEpoch{},
		totals:  map[string]*[misses.NumCauses]int64{},
	}
	t.dropWarn.period = 10 * time.Second
	reg.MustRegister(t.uncached, t.dropped)
	return t
}

// missed queues the attribution of an answered exchange's uncached
// prompt tokens (u is the usage its replica reported): the hook at the
// end of accounting. It takes what the attribution needs and returns; the
// work (the prompt's fingerprint and diff, about 0.9 ms per 100 KB) is the
// tracker's worker's. With the queue full the turn is not attributed:
// warmpath_miss_attribution_dropped_total counts it.
func (g *Gateway) missed(x *exchange, u request.Usage) {
	r := x.req
	j := &missJob{
		tenant: g.tenant(x), tenantID: missTenant(r.R), model: r.Model(), session: r.Session(), p: r.Principal(),
		opt:   misses.Options{BytesPerToken: r.BytesPerToken, BlockTokens: g.miss.blockTokens},
		usage: u, rep: x.replica, restarts: x.replica.State().Restarts, predicted: x.predicted,
		sticky: x.route.Plan.Reason == scoring.ReasonSticky, bestOther: x.route.BestOther(x.replica.Spec.Name),
		route: misses.RouteOf(x.route.Plan.Rebind), at: time.Now(),
	}
	if j.p != nil {
		j.opt.Excerpts = j.p.BreakExcerpts
	}
	if r.API() == request.Chat {
		j.chat = true
		j.messages, j.tools = r.Parts()
		j.keys = x.route.Keys
		j.bytes = int64(len(j.messages.Raw) + len(j.tools.Raw) + 8*len(j.keys))
	}
	g.miss.queue(x.ctx, j)
}

// queue hands j to the worker, or drops it when the queue is full.
func (t *missTracker) queue(ctx context.Context, j *missJob) {
	if t.queued.Add(j.bytes) <= missQueueBytes {
		select {
		case t.jobs <- j:
			return
		default:
		}
	}
	t.queued.Add(-j.bytes)
	t.dropped.WithLabelValues("queue_full").Inc()
	if ok, held := t.dropWarn.allow(); ok {
		t.log.WarnContext(ctx, "miss attribution behind: a request's uncached tokens were not attributed (warmpath_miss_attribution_dropped_total)",
			"queued", len(t.jobs), "queued_bytes", t.queued.Load(), "held_back", held)
	}
}

// Run attributes the queued turns one at a time, in the order they were
// queued, until ctx ends; then what is still queued, for up to
// missFinish, and drops the rest. It returns nil.
func (t *missTracker) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case j := <-t.jobs:
			t.do(j)
		}
	}
	t.finish()
	return nil
}

// finish attributes what is queued for up to grace and counts what
// remains as dropped (flush markers are always answered).
func (t *missTracker) finish() {
	deadline := time.Now().Add(t.grace)
	dropped := 0
	for {
		select {
		case j := <-t.jobs:
			if j.done == nil && time.Now().After(deadline) {
				t.queued.Add(-j.bytes)
				dropped++
				continue
			}
			t.do(j)
		default:
			if dropped > 0 {
				t.dropped.WithLabelValues("shutdown").Add(float64(dropped))
				t.log.Warn("miss attribution: turns still queued at shutdown were not attributed", "dropped", dropped)
			}
			return
		}
	}
}

// flush waits until every job queued before it is done, or ctx ends (as
// it does if Run is not running): for tests, which read the attribution
// after their requests were answered.
func (t *missTracker) flush(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case t.jobs <- &missJob{done: done}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// do attributes one job's uncached prompt tokens: the split by cause to
// the metric, the totals and the tenant's usage; the prompt's break to the
// tenant's hints; its fingerprint kept for the session's next turn.
func (t *missTracker) do(j *missJob) {
	defer t.queued.Add(-j.bytes)
	if j.done != nil {
		close(j.done)
		return
	}
	prompt := t.prompt(j)
	prev, d := t.previous(j, prompt)
	fresh, seq := t.observe(j.rep, j.restarts, prev)
	turn := misses.Turn{
		Prompt: j.usage.PromptTokens, Cached: j.usage.CachedTokens, Previous: d.Previous, Matched: d.Matched,
		Predicted: t.predicted(j, d), BestOther: j.bestOther, Fresh: fresh,
		Route: j.route, BlockTokens: t.blockTokens,
	}
	causes := misses.Split(turn)
	t.count(j.tenant, j.model, causes)
	if j.p != nil && t.usage != nil {
		t.usage.Record(j.p, tenancy.Counts{Uncached: uncachedCounts(causes)})
	}
	if prompt == nil {
		return
	}
	t.hints.Observe(j.tenantID, j.at, d)
	fp := prompt.Fingerprint(j.opt)
	fp.Tokens = j.usage.PromptTokens
	t.keep(fp, seq)
	if s := j.session.Value; s != "" {
		t.prev.Put(s, fp)
	}
	t.recent.Add(j.tenantID, j.session.Family, fp)
}

// predicted is the prefix routing predicted cached on the replica that
// answered. A sticky turn's prediction is not the index's: it is the
// session's previous prompt, on the assumption that the turn extends it
// (session.Binding); when the client broke the prefix, what lies past the
// break was the client's doing, not a stale index, so the prediction is
// cut at the break's block.
func (t *missTracker) predicted(j *missJob, d misses.Diff) int {
	p := j.predicted
	if !d.Broke() || !j.sticky {
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
func (t *missTracker) prompt(j *missJob) *misses.Prompt {
	if !j.chat {
		return nil
	}
	p, err := misses.NewPrompt(j.messages, j.tools)
	if err != nil {
		return nil
	}
	if j.keys != nil {
		p.SetBlocks(j.keys, t.blockTokens)
	}
	return p
}

// previous finds the turn p continues, the session's last one first,
// then the tenant's recent prompt it most likely continues, and where p
// departs from it.
func (t *missTracker) previous(j *missJob, p *misses.Prompt) (*misses.Fingerprint, misses.Diff) {
	if p == nil {
		return nil, misses.Diff{}
	}
	if s := j.session.Value; s != "" {
		if fp := t.prev.Get(s); fp != nil {
			return fp, misses.Locate(fp, p, j.opt)
		}
	}
	return t.recent.Find(j.tenantID, j.session.Family, p, j.opt)
}

// observe numbers this turn and reports whether rep (restarted restarts
// times when it answered) joined or restarted after prev's turn (never
// without a previous turn). A member first seen answering after the
// fleet's first members were seen counts as joined then: until it
// answered, it held nothing of anyone's.
func (t *missTracker) observe(rep *fleet.Replica, restarts int, prev *misses.Fingerprint) (fresh bool, seq uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seq++
	if !t.primed {
		t.primed = true
		for _, m := range t.fleet.Snapshot().Replicas {
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
