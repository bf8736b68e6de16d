package fairq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/apierror"
)

// Ticket is what admission knows about one request.
type Ticket struct {
	// Tenant identifies the tenant; "" is a tenant like any other.
	Tenant string
	// Weight is the tenant's fair-share weight; 0 (or anything not
	// positive) means 1. Weights are clamped to [0.001, 1000].
	Weight float64
	// Class is the request's class, already derived and capped by the
	// caller (see DeriveClass); values beyond Background count as
	// Background.
	Class Class
	// Model is the model requested; each model has its own queue.
	Model string
	// Session is the session key; "" means the request belongs to none.
	Session string
	// Turn is the number of turns of the session already dispatched; 0 is
	// a first turn. Turns of sessions in progress go first.
	Turn int
	// Attained is the service the session has received so far, in tokens;
	// among turns in progress the least served go first.
	Attained float64
	// Cost is the request's predicted prompt cost in tokens: prompt tokens
	// net of the predicted prefix-cache hit. It is charged at dispatch.
	Cost float64
	// Place, when not nil, is asked, while the request waits and the model
	// has room, whether it could start at once where routing would send it
	// now (the gateway routes it as it leaves the queue). False lets a
	// request further down the order (Config.ScanDepth) that can take the
	// room; when none can, the first goes anyway. True commits the
	// dispatch, so an implementation may reserve the room it found. Nil
	// always fits. It is called with the model's queue lock held: it must
	// be fast, must not block and must not call the Queue. A request
	// admitted at once (nothing waits) is not asked.
	Place func() bool
}

// Capacity tells the queue whether a model's replicas can start another
// request now. The gateway implements it from replica signals.
type Capacity interface {
	// Saturated reports whether model can take no more requests now.
	// inflight is the number of this queue's grants for model that are not
	// Done, including grants made a moment ago that the replicas' signals
	// cannot show yet, so an implementation can bound it. It is called
	// with the model's queue lock held: it must be fast, must not block
	// and must not call the Queue.
	Saturated(model string, inflight int) bool
}

// ClassCapacity is an optional ability of a [Capacity], found by type
// assertion: it judges room per class, so that headroom can be kept from
// Background for Interactive turns (such as KV-cache blocks free for them
// in the engines). Background must never have room where Interactive has
// none. The same rules as Saturated's apply to the call.
type ClassCapacity interface {
	Capacity
	// SaturatedFor reports whether model can take no more requests of
	// class c now; inflight is as for Saturated.
	SaturatedFor(model string, inflight int, c Class) bool
}

// CapacityFunc adapts a function to [Capacity].
type CapacityFunc func(model string, inflight int) bool

// Saturated calls f.
func (f CapacityFunc) Saturated(model string, inflight int) bool { return f(model, inflight) }

// Sentinels wrapped by Admit's 429 errors; match them with errors.Is.
var (
	ErrFull    = errors.New("fairq: queue full")
	ErrTimeout = errors.New("fairq: queue timeout")
)

// Queue admits requests: at once while their model has capacity and
// nothing waits for it, otherwise in fair order as capacity frees. Its
// methods are safe for concurrent use.
type Queue struct {
	cfg      Config
	capacity Capacity
	classCap ClassCapacity         // capacity's per-class judgement; nil when it has none
	rdb      redis.UniversalClient // nil: counters stay local
	log      *slog.Logger
	met      *metrics
	epoch    time.Time // origin of the aged ordering keys

	models  cowMap[*model]  // by name; never shrinks
	tenants cowMap[*tenant] // by ID; Run forgets idle ones
	total   atomic.Int64    // waiting requests, all models
	seq     atomic.Uint64

	syncMu    sync.Mutex // serializes syncs; guards redisDown
	redisDown bool
}

// New returns a queue. rdb, when not nil, shares the tenants' virtual
// counters with other gateways (Run does the exchange); nil keeps them
// local. reg, when not nil, registers the queue's metrics; log nil
// discards. New starts no goroutine.
func New(cfg Config, capacity Capacity, rdb redis.UniversalClient, reg prometheus.Registerer, log *slog.Logger) (*Queue, error) {
	if capacity == nil {
		return nil, errors.New("fairq: nil Capacity")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	met, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	q := &Queue{cfg: cfg, capacity: capacity, rdb: rdb, log: log, met: met, epoch: time.Now()}
	q.classCap, _ = capacity.(ClassCapacity)
	return q, nil
}

// saturated asks the capacity whether model m can take a request of class
// c. The caller holds m.mu.
func (q *Queue) saturated(m *model, c Class) bool {
	if q.classCap != nil {
		return q.classCap.SaturatedFor(m.name, m.running, c)
	}
	return q.capacity.Saturated(m.name, m.running)
}

// Admit returns at once when t's model is not saturated and nothing waits
// for it. Otherwise it queues t and blocks until t is dispatched, ctx ends
// (t leaves the queue at once; the error wraps ctx.Err()) or Config.Timeout
// passes. A full queue or a timeout is an *apierror.Error 429
// rate_limit_exceeded with Retry-After, wrapping ErrFull or ErrTimeout.
// The caller must call the Grant's Done when the request ends.
func (q *Queue) Admit(ctx context.Context, t Ticket) (*Grant, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("fairq: admit: %w", err)
	}
	g, it, err := q.submit(t)
	if it == nil {
		return g, err
	}
	return q.await(ctx, it)
}

// submit admits t at once (a grant) or queues it (an item), without
// blocking.
func (q *Queue) submit(t Ticket) (*Grant, *item, error) {
	t = sanitize(t)
	ten := q.tenantFor(t.Tenant)
	ten.weight.Store(math.Float64bits(t.Weight))
	ten.uses.Add(1)
	m := q.modelFor(t.Model)
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.counterFor(t.Tenant, q.rdb != nil)
	if m.queued == 0 && !q.saturated(m, t.Class) {
		if c.idle() {
			c.lift(m.last)
		}
		g := new(Grant)
		q.grantLocked(m, g, c, ten, t)
		ten.series.Load().fast[t.Class].Inc()
		return g, nil, nil
	}
	if r, ok := q.reserve(ten); !ok {
		ten.series.Load().shed[t.Class][r].Inc()
		return nil, nil, tooMany(r, m.retryAfter(q.cfg.Timeout), t.Model)
	}
	now := time.Now()
	it := &item{t: t, seq: q.seq.Add(1), enq: now, ten: ten, m: m, ready: make(chan struct{})}
	if q.cfg.Policy == PolicyFair {
		it.first = t.Session == "" || t.Turn == 0
		it.key = t.Attained + q.cfg.AgeCredit*now.Sub(q.epoch).Seconds()
	}
	it.depth = ten.series.Load().depth[t.Class]
	it.depth.Inc()
	ten.winBacklogged.Store(true)
	m.push(it, c, now)
	q.dispatchLocked(m, true)
	return nil, it, nil
}

// await blocks until it is dispatched, ctx ends or the timeout passes.
func (q *Queue) await(ctx context.Context, it *item) (*Grant, error) {
	timer := time.NewTimer(q.cfg.Timeout)
	defer timer.Stop()
	select {
	case <-it.ready:
		return &it.grant, nil
	case <-ctx.Done():
		if g := q.leave(it, false); g != nil {
			g.giveBack()
		}
		return nil, fmt.Errorf("fairq: left the queue: %w", ctx.Err())
	case <-timer.C:
		if g := q.leave(it, true); g != nil {
			return g, nil // dispatched as the timer fired
		}
		it.m.mu.Lock()
		retry := it.m.retryAfter(q.cfg.Timeout)
		it.m.mu.Unlock()
		return nil, tooMany(reasonTimeout, retry, it.t.Model)
	}
}

// reserve counts one more waiting request against the limits.
func (q *Queue) reserve(ten *tenant) (reason, bool) {
	if q.total.Add(1) > int64(q.cfg.MaxQueued) {
		q.total.Add(-1)
		return reasonFull, false
	}
	if ten.queued.Add(1) > int64(q.cfg.MaxQueuedPerTenant) {
		ten.queued.Add(-1)
		q.total.Add(-1)
		return reasonTenantFull, false
	}
	return 0, true
}

func (q *Queue) unreserve(ten *tenant) {
	ten.queued.Add(-1)
	q.total.Add(-1)
}

// leave takes it out of the queue after a cancel or a timeout, or returns
// its grant if it was dispatched meanwhile.
func (q *Queue) leave(it *item, timedOut bool) *Grant {
	m := it.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if it.idx < 0 {
		return &it.grant
	}
	m.remove(it, time.Now())
	q.unreserve(it.ten)
	it.depth.Dec()
	s := it.ten.series.Load()
	if timedOut {
		s.shed[it.t.Class][reasonTimeout].Inc()
	} else {
		s.canceled[it.t.Class].Inc()
	}
	return nil
}

// dispatchLocked grants waiting requests, best first (the first of the
// order that fits, see model.next; with fallback the first candidate when
// none fits), while the model has capacity. The caller holds m.mu.
func (q *Queue) dispatchLocked(m *model, fallback bool) {
	var now time.Time
	bgRoom := func() bool { return q.classCap == nil || !q.saturated(m, Background) }
	for m.queued > 0 && !q.saturated(m, Interactive) {
		it := m.next(&q.cfg, bgRoom, fits, fallback)
		if it == nil {
			break // the room left is interactive's, or no candidate can use it
		}
		if now.IsZero() {
			now = time.Now()
		}
		m.remove(it, now)
		q.unreserve(it.ten)
		it.depth.Dec()
		q.grantLocked(m, &it.grant, it.flow.ctr, it.ten, it.t)
		it.grant.waited = now.Sub(it.enq)
		m.observeWait(it.grant.waited)
		s := it.ten.series.Load()
		s.queued[it.t.Class].Inc()
		s.wait[it.t.Class].Observe(it.grant.waited.Seconds())
		it.ten.winDispatched.Add(1)
		close(it.ready)
	}
}

// grantLocked fills g for a dispatch of t and charges its prompt cost to
// the tenant's counter. The caller holds m.mu.
func (q *Queue) grantLocked(m *model, g *Grant, c *counter, ten *tenant, t Ticket) {
	m.last = c.value()
	c.charge(t.Cost / t.Weight)
	c.inflight++
	m.running++
	g.q, g.m, g.c, g.ten = q, m, c, ten
	g.class, g.weight, g.cost = t.Class, t.Weight, t.Cost
	if t.Cost > 0 {
		ten.series.Load().service[t.Class].Add(t.Cost)
	}
}

// fits reports whether it may be dispatched now (Ticket.Place).
func fits(it *item) bool { return it.t.Place == nil || it.t.Place() }

// Kick re-checks capacity for every model with waiting requests and
// dispatches what it allows. Call it whenever capacity may have changed
// (the gateway calls it on every metrics scrape). It does not block on
// anything but the queue's locks.
func (q *Queue) Kick() { q.kick(true) }

// Refill is Kick without the fallback: it dispatches only requests that
// can start where routing sends them (Ticket.Place reports true), never a
// first candidate that cannot. Call it when room may have appeared on a
// replica that no waiting request's routing chose: a request dispatched
// without a place (the fallback, or one whose routing was left to the
// moment it is sent) held the model's room until it reached its replica
// (see Capacity's inflight), and went to one without room. A Kick there
// would send the next such candidate to its busy replica too, one each
// time a request reaches its replica.
func (q *Queue) Refill() { q.kick(false) }

func (q *Queue) kick(fallback bool) {
	for _, m := range q.models.snapshot() {
		m.mu.Lock()
		if m.queued > 0 {
			q.dispatchLocked(m, fallback)
		}
		m.mu.Unlock()
	}
}

func (q *Queue) modelFor(name string) *model {
	if m, ok := q.models.get(name); ok {
		return m
	}
	return q.models.getOrAdd(name, func() *model {
		return &model{
			name:     name,
			key:      q.cfg.KeyPrefix + "fairq:vtc:" + name,
			inflight: q.met.inflight.WithLabelValues(name),
			satTotal: q.met.saturated.WithLabelValues(name),
			counters: map[string]*counter{},
		}
	})
}

func (q *Queue) tenantFor(id string) *tenant {
	if t, ok := q.tenants.get(id); ok {
		return t
	}
	return q.tenants.getOrAdd(id, func() *tenant {
		t := &tenant{id: id}
		t.series.Store(q.met.seriesFor(q.cfg.Label(id)))
		return t
	})
}

// sanitize makes t's numbers usable: garbage weights become 1, garbage
// costs and service 0.
func sanitize(t Ticket) Ticket {
	if !(t.Weight > 0) || math.IsInf(t.Weight, 1) {
		t.Weight = 1
	}
	t.Weight = min(max(t.Weight, 0.001), 1000)
	if !(t.Cost > 0) || math.IsInf(t.Cost, 1) {
		t.Cost = 0
	}
	if !(t.Attained > 0) {
		t.Attained = 0
	}
	t.Attained = min(t.Attained, math.MaxFloat64)
	t.Class = min(t.Class, Background)
	t.Turn = max(t.Turn, 0)
	return t
}

// tooMany is the 429 for a refused request.
func tooMany(r reason, retryAfter int, model string) *apierror.Error {
	var msg string
	err := ErrFull
	switch r {
	case reasonTimeout:
		msg, err = fmt.Sprintf("The request waited too long for capacity on model %s; retry after %d s.", quoteShort(model), retryAfter), ErrTimeout
	case reasonTenantFull:
		msg = fmt.Sprintf("Too many of your requests are waiting for capacity; retry after %d s.", retryAfter)
	default:
		msg = fmt.Sprintf("Too many requests are waiting for capacity on model %s; retry after %d s.", quoteShort(model), retryAfter)
	}
	return &apierror.Error{
		Status: http.StatusTooManyRequests, Type: apierror.TypeRateLimit, Code: "rate_limit_exceeded",
		Msg: msg, Err: err, Header: http.Header{"Retry-After": {strconv.Itoa(retryAfter)}},
	}
}

// Waiting returns how many requests wait now, by class name (every class,
// zero included), summed over the models.
func (q *Queue) Waiting() map[string]int {
	out := make(map[string]int, numClasses)
	for c := range Class(numClasses) {
		out[c.String()] = 0
	}
	for _, m := range q.models.snapshot() {
		m.mu.Lock()
		for c := range Class(numClasses) {
			out[c.String()] += m.classes[c].n
		}
		m.mu.Unlock()
	}
	return out
}
