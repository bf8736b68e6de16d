package admission

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/tenancy/fairq"
)

// Capacity is the queue's Capacity: the fleet's replicas judged by
// Saturation. It reads the fleet's published state only (atomics and
// a snapshot), so it never blocks.
type Capacity struct {
	fleet *fleet.Fleet
	sat   Saturation
	// priority: the class reaches the engines (queue.vllm_priority), so
	// an interactive request waits in an engine behind interactive ones
	// only.
	priority bool
	// loads holds each replica's *load. Entries of replicas that
	// left stay (a few bytes per departed replica).
	loads sync.Map
	// joinMu serializes joining the interactive reserve, so that no more
	// than InteractiveReserve replicas join it.
	joinMu sync.Mutex
	// down holds, per model that has lost every answering replica since
	// start, whether it has none now that answers (*atomic.Bool), for
	// noteDown's log.
	down sync.Map
	log  *slog.Logger // nil: noteDown logs nothing
}

// load is this gateway's admission bookkeeping for one replica.
type load struct {
	// pending counts, per class, this gateway's requests routed to the
	// replica that have not started there (no first byte yet): waiting
	// in its engine or prefilling.
	pending [2]atomic.Int64
	// lastInteractive is when this gateway last sent the replica an
	// interactive request (Unix nanoseconds); reserved whether it joined
	// the interactive reserve since (it holds until ReserveIdle after
	// lastInteractive).
	lastInteractive atomic.Int64
	reserved        atomic.Bool
	// started counts this gateway's streaming requests on the replica
	// whose first byte came after the scrape taken at startedAt and that
	// have not finished: they left the engine's queue since that scrape
	// counted them waiting (or since they were sent), so room opens at a
	// request's first token rather than at the next scrape.
	startedMu sync.Mutex
	startedAt time.Time
	started   int
	// claimed counts the requests the queue dispatched to the replica
	// (Queue.Admit's place, Claim) that have not been sent yet: room they hold
	// before the replica's in-flight count shows them; claimedTokens is
	// their uncached prompt tokens, the prefill they bring.
	claimed, claimedTokens atomic.Int64
}

func (c *Capacity) loadFor(rep *fleet.Replica) *load {
	if v, ok := c.loads.Load(rep); ok {
		return v.(*load)
	}
	v, _ := c.loads.LoadOrStore(rep, new(load))
	return v.(*load)
}

// startedSince is how many of started count under the scrape taken at
// scrapedAt (none after a newer scrape, which saw them start).
func (l *load) startedSince(scrapedAt time.Time) int {
	l.startedMu.Lock()
	defer l.startedMu.Unlock()
	if !l.startedAt.Equal(scrapedAt) {
		return 0
	}
	return l.started
}

// noteStarted counts a streaming request's first byte under the scrape
// taken at scrapedAt and returns it, for unnoteStarted.
func (l *load) noteStarted(scrapedAt time.Time) time.Time {
	l.startedMu.Lock()
	defer l.startedMu.Unlock()
	if !l.startedAt.Equal(scrapedAt) {
		l.startedAt, l.started = scrapedAt, 0
	}
	l.started++
	return scrapedAt
}

// unnoteStarted takes a finished request out of started, if it still
// counts there: once it has finished, the in-flight count nets it out.
func (l *load) unnoteStarted(scrapedAt time.Time) {
	l.startedMu.Lock()
	defer l.startedMu.Unlock()
	if l.startedAt.Equal(scrapedAt) && l.started > 0 {
		l.started--
	}
}

// noteInteractive records an interactive request sent to rep, one of the
// model's replicas reps, at now; rep joins the reserve if it has room.
func (c *Capacity) noteInteractive(rep *fleet.Replica, reps []*fleet.Replica, now time.Time) {
	l := c.loadFor(rep)
	l.lastInteractive.Store(now.UnixNano())
	if c.sat.InteractiveReserve <= 0 || l.reserved.Load() {
		return
	}
	c.joinMu.Lock()
	defer c.joinMu.Unlock()
	n := 0
	for _, o := range reps {
		if o != rep && c.reserved(o, now) {
			n++
		}
	}
	if n < min(c.sat.InteractiveReserve, len(reps)-1) && l.reserved.CompareAndSwap(false, true) && c.log != nil {
		c.log.Info("queue: replica joins the interactive reserve (no background requests while interactive traffic lasts)",
			"replica", rep.Spec.Name, "reserve_idle", c.sat.ReserveIdle)
	}
}

// reserved reports whether rep is in the interactive reserve at now. A
// replica idle for ReserveIdle leaves it here.
func (c *Capacity) reserved(rep *fleet.Replica, now time.Time) bool {
	l := c.loadFor(rep)
	if !l.reserved.Load() {
		return false
	}
	last := l.lastInteractive.Load()
	if now.UnixNano()-last < int64(c.sat.ReserveIdle) {
		return true
	}
	if !l.reserved.CompareAndSwap(true, false) {
		return false
	}
	if last = l.lastInteractive.Load(); now.UnixNano()-last < int64(c.sat.ReserveIdle) {
		// noteInteractive renewed it meanwhile (and, seeing it reserved,
		// left the flag to this): it stays.
		l.reserved.Store(true)
		return true
	}
	if c.log != nil {
		c.log.Info("queue: replica leaves the interactive reserve (no interactive request for reserve_idle); background may use it",
			"replica", rep.Spec.Name, "last_interactive", time.Unix(0, last))
	}
	return false
}

// reserveCollector exports the interactive reserve's membership:
// warmpath_queue_interactive_reserve{replica} is 1 for a replica that
// takes no background requests now, else 0.
type reserveCollector struct{ c *Capacity }

var reserveDesc = prometheus.NewDesc("warmpath_queue_interactive_reserve",
	"1 while the replica is in the interactive reserve (queue.saturation.interactive_reserve): it takes no background requests unless no other replica is healthy.",
	[]string{"replica"}, nil)

func (r reserveCollector) Describe(ch chan<- *prometheus.Desc) { ch <- reserveDesc }

func (r reserveCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, rep := range r.c.fleet.Snapshot().Replicas {
		v := 0.0
		if r.c.reserved(rep, now) {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(reserveDesc, prometheus.GaugeValue, v, rep.Spec.Name)
	}
}

// KeepReserve hides the reserved replicas from a background request's
// routing (as unable to take traffic), unless no other replica is
// healthy; eps are the endpoints of reps. A nil Capacity (no queue)
// reserves nothing.
func (c *Capacity) KeepReserve(class fairq.Class, reps []*fleet.Replica, eps []scoring.Endpoint) {
	if c == nil || class < fairq.Background {
		return
	}
	now := time.Now()
	res := make([]bool, len(reps))
	other := false
	for i, rep := range reps {
		res[i] = c.reserved(rep, now)
		other = other || (!res[i] && !eps[i].Unhealthy)
	}
	if !other {
		return
	}
	for i := range eps {
		eps[i].Reserved = res[i]
	}
}

var _ fairq.ClassCapacity = (*Capacity)(nil)

// Saturated implements fairq.Capacity: saturated for interactive
// requests.
func (c *Capacity) Saturated(model string, inflight int) bool {
	return c.SaturatedFor(model, inflight, fairq.Interactive)
}

// SaturatedFor implements fairq.ClassCapacity; inflight is the queue's
// requests for model admitted and not finished. Background counts no
// room on reserved replicas while another replica is healthy (routing
// sends it none there).
func (c *Capacity) SaturatedFor(model string, inflight int, class fairq.Class) bool {
	now := time.Now()
	room, reservedRoom, routed := 0, 0, 0
	other, up := false, false
	for _, rep := range c.fleet.Snapshot().Replicas {
		st := rep.State()
		if !st.Serves(model) {
			continue
		}
		n := int(rep.InflightRequests())
		claimed := int(c.loadFor(rep).claimed.Load())
		routed += n + claimed
		res := class == fairq.Background && c.reserved(rep, now)
		other = other || (!res && st.Healthy)
		up = up || (st.Healthy && !rep.Failing())
		if usable(rep, now) {
			if r := max(0, c.room(rep, st, n, class)-claimed); res {
				reservedRoom += r
			} else {
				room += r
			}
		}
	}
	if !other {
		room += reservedRoom
	}
	c.noteDown(model, !up)
	return room-max(0, inflight-routed) <= 0
}

// usable reports whether the queue may send rep a request at now: routing
// finds it available (healthy, fresh metrics, under routing's thresholds)
// and nothing sent to it, nor its health check, failed since its last
// success (fleet.Replica.Failing). A replica that fails but is not yet
// marked unhealthy (health.failures, and calls in flight together count
// as one failure) has no room: the requests that failed there freed
// places in this gateway's count of what it sent but none in an engine,
// and a waiting request sent there would fail too, or find by the time it
// is routed that no replica is healthy. So waiting requests stay queued
// until a request or health check succeeds there again.
func usable(rep *fleet.Replica, now time.Time) bool {
	sat, _ := rep.Saturated(now)
	return !sat && !rep.Failing()
}

// noteDown logs when model, which has requests reaching the queue, loses
// its last replica that is healthy and not failing (down) and when it has
// one again: meanwhile its waiting requests stay queued, until a replica
// answers again or queue.timeout passes. A nil log logs nothing.
func (c *Capacity) noteDown(model string, down bool) {
	if c.log == nil {
		return
	}
	v, ok := c.down.Load(model)
	if !ok {
		if !down {
			return
		}
		v, _ = c.down.LoadOrStore(model, new(atomic.Bool))
	}
	if v.(*atomic.Bool).Swap(down) == down {
		return
	}
	if down {
		c.log.Warn("queue: no replica of the model is answering (every one unhealthy or failing); waiting requests stay queued until one answers again (at most queue.timeout)", "model", model)
		return
	}
	c.log.Info("queue: a replica of the model answers again; waiting requests dispatch", "model", model)
}

// Claim is a place a dispatched request holds on its replica until it
// is sent there (the replica's in-flight count has it then) or ends.
type Claim struct {
	l        *load
	tokens   int64
	released atomic.Bool
}

// Claim takes a place for a request of class with tokens of uncached
// prompt on rep, the replica its routing chose, if rep has room for it by
// the rule SaturatedFor sums (a usable replica, room less what the
// queue dispatched to it and has not sent yet).
func (c *Capacity) Claim(rep *fleet.Replica, class fairq.Class, tokens int64, now time.Time) (*Claim, bool) {
	if !usable(rep, now) {
		return nil, false
	}
	l := c.loadFor(rep)
	if c.room(rep, rep.State(), int(rep.InflightRequests()), class)-int(l.claimed.Load()) <= 0 {
		return nil, false
	}
	l.claimed.Add(1)
	l.claimedTokens.Add(tokens)
	return &Claim{l: l, tokens: tokens}, true
}

// Release gives the place back, once; a nil Claim has none.
func (cl *Claim) Release() {
	if cl != nil && cl.released.CompareAndSwap(false, true) {
		cl.l.claimed.Add(-1)
		cl.l.claimedTokens.Add(-cl.tokens)
	}
}

// AddClaims counts, in eps (the endpoints of reps), the requests claimed
// on each replica and not sent yet as this gateway's in flight, with
// their prefill: routing then sees the load the queue has just sent
// there, so that the requests a dispatch considers one after another do
// not all pick the replica that looked least loaded before the first.
func (c *Capacity) AddClaims(reps []*fleet.Replica, eps []scoring.Endpoint) {
	if c == nil {
		return
	}
	for i, rep := range reps {
		l := c.loadFor(rep)
		eps[i].InflightRequests += l.claimed.Load()
		eps[i].InflightPrefillTokens += l.claimedTokens.Load()
	}
}

// room is an available replica's room for class (negative when its queue
// is longer than allowed); inflight is its requests from this gateway.
func (c *Capacity) room(rep *fleet.Replica, st *fleet.State, inflight int, class fairq.Class) int {
	sent := inflight - st.InflightAtScrape
	pend := &c.loadFor(rep).pending
	// For interactive, this gateway's requests not started on rep are in
	// its queue (or prefilling) whatever the last scrape says: a scrape
	// taken after a request was sent but before the engine saw it would
	// hide it. Background keeps the scraped count: there one long prefill
	// would hold all background off the replica (measured: 40 s waits with
	// capacity idle, and timeouts).
	queued := st.Waiting + sent
	if queued > 0 { // those that started since the scrape wait no more
		queued -= min(queued, c.loadFor(rep).startedSince(st.ScrapedAt))
	}
	if class == fairq.Interactive {
		queued = max(queued, int(pend[fairq.Interactive].Load()+pend[fairq.Background].Load()))
	}
	var room int
	switch {
	case class == fairq.Interactive && c.priority:
		// The engine runs interactive requests first: only those are
		// ahead of this one.
		room = c.sat.EngineWaiting - int(pend[fairq.Interactive].Load())
	case class == fairq.Background && c.sat.BackgroundMaxKVUsage >= 0:
		if st.KVUsage >= c.sat.BackgroundMaxKVUsage {
			return 0
		}
		room = c.sat.BackgroundEngineWaiting - queued
	default:
		room = c.sat.EngineWaiting - queued
	}
	if c.sat.MaxRunning > 0 {
		room = min(room, c.sat.MaxRunning-(st.Running+sent))
	}
	return room
}

// ReleaseReserve releases the interactive reserve as if no interactive
// request had been sent for ReserveIdle: each replica leaves it at its
// next check, and background requests may use it again.
func (c *Capacity) ReleaseReserve() {
	past := time.Now().Add(-c.sat.ReserveIdle).UnixNano()
	c.loads.Range(func(_, v any) bool {
		v.(*load).lastInteractive.Store(past)
		return true
	})
}
