package fairq

import (
	"container/heap"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// model is the queue state of one model: its waiting requests, its grants
// in flight and its tenants' counters.
type model struct {
	name     string
	key      string // Redis hash of the model's counters
	inflight prometheus.Gauge
	satTotal prometheus.Counter

	mu       sync.Mutex // guards everything below
	running  int        // grants not Done
	queued   int        // waiting requests, both classes
	classes  [numClasses]classQueue
	counters map[string]*counter
	last     float64 // VTC: the counter of the tenant dispatched last, before its charge
	bgCredit float64 // background dispatches owed while both classes wait
	waitAvg  float64 // moving average of queue waits, seconds, for Retry-After
	// backlogSince is when the model last started having waiting requests
	// (or when that time was last added to satTotal); zero when none wait.
	backlogSince time.Time
}

// classQueue holds one class's waiting requests, one flow per tenant.
type classQueue struct {
	n        int
	flows    []*flow // backlogged flows, in no particular order
	byTenant map[string]*flow
}

// flow is one tenant's waiting requests of one class for one model.
type flow struct {
	ctr   *counter
	ten   *tenant
	items itemHeap
	pos   int // index in classQueue.flows
}

// item is one waiting request. Fields other than grant and idx are fixed
// when it is queued.
type item struct {
	t     Ticket
	first bool    // a first turn (or no session): ordered after turns in progress
	key   float64 // least attained service, aged: Attained + AgeCredit × enqueue time
	seq   uint64  // arrival order
	enq   time.Time
	ten   *tenant
	m     *model
	depth prometheus.Gauge // the series counted at enqueue

	flow  *flow
	idx   int           // heap index; -1 once it left the queue
	ready chan struct{} // closed when granted
	grant Grant         // valid once ready is closed
}

// itemHeap orders a flow: turns in progress first, then least (aged)
// attained service, then arrival.
type itemHeap []*item

func (h itemHeap) Len() int { return len(h) }
func (h itemHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.first != b.first {
		return !a.first
	}
	if a.key != b.key {
		return a.key < b.key
	}
	return a.seq < b.seq
}
func (h itemHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *itemHeap) Push(x any) {
	it := x.(*item)
	it.idx = len(*h)
	*h = append(*h, it)
}
func (h *itemHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	it.idx = -1
	return it
}

// counterFor returns tenant's counter, creating it.
func (m *model) counterFor(tenant string, shared bool) *counter {
	c := m.counters[tenant]
	if c == nil {
		c = newCounter(tenant, shared)
		m.counters[tenant] = c
	}
	return c
}

// push queues it. A tenant returning from idle (nothing waiting for the
// model and nothing running) has its counter lifted to the least counter
// of the tenants that wait (to the last dispatched tenant's when none
// do), as VTC lifts a newly active client.
func (m *model) push(it *item, c *counter, now time.Time) {
	if c.idle() {
		c.lift(m.activeFloor())
	}
	if m.queued == 0 {
		m.backlogSince = now
	}
	cq := &m.classes[it.t.Class]
	if cq.byTenant == nil {
		cq.byTenant = make(map[string]*flow)
	}
	f := cq.byTenant[it.t.Tenant]
	if f == nil {
		f = &flow{ctr: c, ten: it.ten, pos: len(cq.flows)}
		cq.byTenant[it.t.Tenant] = f
		cq.flows = append(cq.flows, f)
	}
	it.flow = f
	heap.Push(&f.items, it)
	cq.n++
	m.queued++
	c.queued++
}

// activeFloor is the least counter among tenants with requests waiting for
// the model, or the last dispatched tenant's counter when none wait.
func (m *model) activeFloor() float64 {
	floor, found := math.Inf(1), false
	for i := range m.classes {
		for _, f := range m.classes[i].flows {
			floor, found = min(floor, f.ctr.value()), true
		}
	}
	if !found {
		return m.last
	}
	return floor
}

// remove takes it out of the queue; now accounts saturated time.
func (m *model) remove(it *item, now time.Time) {
	f := it.flow
	heap.Remove(&f.items, it.idx)
	cq := &m.classes[it.t.Class]
	if f.items.Len() == 0 {
		last := cq.flows[len(cq.flows)-1]
		cq.flows[f.pos], last.pos = last, f.pos
		cq.flows[len(cq.flows)-1] = nil
		cq.flows = cq.flows[:len(cq.flows)-1]
		delete(cq.byTenant, it.t.Tenant)
	}
	cq.n--
	m.queued--
	f.ctr.queued--
	if m.queued == 0 {
		m.satTotal.Add(now.Sub(m.backlogSince).Seconds())
		m.backlogSince = time.Time{}
	}
}

// next picks the request to dispatch: the class (interactive unless
// background is owed its share), then the tenant, then the tenant's best
// request; nil when only background waits and it has no room. The model
// has requests waiting; bgRoom reports whether background has room.
func (m *model) next(cfg *Config, bgRoom func() bool) *item {
	c, ok := m.pickClass(cfg.BackgroundShare, bgRoom)
	if !ok {
		return nil
	}
	cq := &m.classes[c]
	var best *flow
	for _, f := range cq.flows {
		if best == nil || m.before(cfg, f, best) {
			best = f
		}
	}
	return best.items[0]
}

// pickClass chooses Interactive unless only Background waits or
// Background has accrued a dispatch of credit: every dispatch made while
// both classes wait earns it share of one. Background is chosen only when
// bgRoom reports room for it (a ClassCapacity may hold headroom back from
// it); meanwhile its credit stays at most one dispatch, so none is banked.
// ok is false when only Background waits and it has no room.
func (m *model) pickClass(share float64, bgRoom func() bool) (c Class, ok bool) {
	hasI, hasB := m.classes[Interactive].n > 0, m.classes[Background].n > 0
	if !hasB {
		return Interactive, true
	}
	if !hasI {
		return Background, bgRoom()
	}
	m.bgCredit = min(m.bgCredit+share, 1)
	if m.bgCredit >= 1-1e-9 && bgRoom() { // ten shares of 0.1 sum to 0.999…
		m.bgCredit = max(0, m.bgCredit-1)
		return Background, true
	}
	return Interactive, true
}

// before reports whether flow a goes before flow b: the lower virtual
// counter under PolicyFair, the earlier head of line under PolicyStrict.
func (m *model) before(cfg *Config, a, b *flow) bool {
	if cfg.Policy == PolicyFair {
		if va, vb := a.ctr.value(), b.ctr.value(); va != vb {
			return va < vb
		}
	}
	return a.items[0].seq < b.items[0].seq
}

// observeWait folds one queue wait into the moving average.
func (m *model) observeWait(d time.Duration) {
	const alpha = 0.2
	m.waitAvg += alpha * (d.Seconds() - m.waitAvg)
}

// retryAfter is the Retry-After to send when the model's queue refuses a
// request: the recent average wait, at least 1s, at most the timeout.
func (m *model) retryAfter(timeout time.Duration) int {
	s := math.Ceil(m.waitAvg)
	return int(max(1, min(s, math.Ceil(timeout.Seconds()))))
}
