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
// request, as the first candidate; nil when only background waits and it
// has no room. The model has requests waiting; bgRoom reports whether
// background has room.
//
// fits (the ticket's Place) may pass over a candidate that could not start
// now where routing would send it: the next in the order is tried, then
// the other class's requests (background only while it has room), at most
// cfg.ScanDepth candidates in all. When none fits, the first candidate
// goes after all (with fallback; without, none goes), to wait in its
// replica's engine queue: held in the queue, a request whose replica
// stays full (a background turn bound to a replica at the KV headroom)
// would wait out its timeout. Background's credit is spent only on a
// background dispatch it bought; one made with interactive room that no
// waiting interactive request could use is extra.
func (m *model) next(cfg *Config, bgRoom func() bool, fits func(*item) bool, fallback bool) *item {
	hasI, hasB := m.classes[Interactive].n > 0, m.classes[Background].n > 0
	room, asked := false, false
	bgOK := func() bool {
		if !asked {
			room, asked = bgRoom(), true
		}
		return room
	}
	credit, first := m.bgCredit, Interactive
	switch {
	case !hasI:
		first = Background
	case hasB:
		credit = min(credit+cfg.BackgroundShare, 1)
		if credit >= 1-1e-9 && bgOK() { // ten shares of 0.1 sum to 0.999…
			first = Background
		}
	}
	budget := cfg.ScanDepth
	var head *item // the first candidate, sent when none fits
	for _, c := range [2]Class{first, Background - first} {
		if m.classes[c].n == 0 || c == Background && !bgOK() {
			continue
		}
		it, h := m.scan(cfg, c, &budget, fits)
		if head == nil {
			head = h
		}
		if it != nil {
			m.spend(hasI && hasB, credit, c == Background && first == Background)
			return it
		}
	}
	if head == nil || !fallback {
		return nil
	}
	m.spend(hasI && hasB, credit, head.t.Class == Background && first == Background)
	return head
}

// spend records a dispatch's effect on background's credit: while both
// classes wait it is credit (the share earned), less one when the
// dispatch was a background one it bought.
func (m *model) spend(both bool, credit float64, bought bool) {
	if !both {
		return
	}
	m.bgCredit = credit
	if bought {
		m.bgCredit = max(0, credit-1)
	}
}

// scan returns the first of class c's waiting requests, in dispatch order,
// that fits, trying at most *budget of them (and counting them off it):
// the tenants' flows by before, each flow's requests in heap order. head
// is the first in that order (nil when the budget was spent).
func (m *model) scan(cfg *Config, c Class, budget *int, fits func(*item) bool) (fit, head *item) {
	if *budget <= 0 {
		return nil, nil
	}
	cq := &m.classes[c]
	var best *flow
	for _, f := range cq.flows {
		if best == nil || m.before(cfg, f, best) {
			best = f
		}
	}
	*budget--
	head = best.items[0]
	if fits(head) {
		return head, head // the common case, found without allocating
	}
	// The frontier holds the next candidate of every flow: its head, or
	// the heap children of the candidates tried.
	frontier := make([]*item, 0, len(cq.flows)+*budget)
	for _, f := range cq.flows {
		if f != best {
			frontier = append(frontier, f.items[0])
		}
	}
	frontier = m.children(frontier, best.items[0])
	for *budget > 0 && len(frontier) > 0 {
		k := 0
		for j := 1; j < len(frontier); j++ {
			if m.itemBefore(cfg, frontier[j], frontier[k]) {
				k = j
			}
		}
		it := frontier[k]
		frontier[k] = frontier[len(frontier)-1]
		frontier = frontier[:len(frontier)-1]
		*budget--
		if fits(it) {
			return it, head
		}
		frontier = m.children(frontier, it)
	}
	return nil, head
}

// children appends it's children in its flow's heap to frontier.
func (m *model) children(frontier []*item, it *item) []*item {
	h := it.flow.items
	for _, child := range [2]int{2*it.idx + 1, 2*it.idx + 2} {
		if child < len(h) {
			frontier = append(frontier, h[child])
		}
	}
	return frontier
}

// itemBefore reports whether waiting request a goes before b (of one
// class): within a flow by its heap order; across flows by before, then
// arrival.
func (m *model) itemBefore(cfg *Config, a, b *item) bool {
	if a.flow == b.flow {
		return a.flow.items.Less(a.idx, b.idx)
	}
	if cfg.Policy == PolicyFair {
		if va, vb := a.flow.ctr.value(), b.flow.ctr.value(); va != vb {
			return va < vb
		}
	}
	return a.seq < b.seq
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
