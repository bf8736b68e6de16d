package bench

import (
	"container/heap"

	"github.com/warmpath/warmpath/scoring"
)

// simFleet is the simulated replicas, reused across runs.
type simFleet struct {
	reps []*simReplica
}

func newSimFleet(n, universe int, rate float64) *simFleet {
	fl := &simFleet{reps: make([]*simReplica, n)}
	for j := range fl.reps {
		fl.reps[j] = &simReplica{rate: rate, cache: newBlockLRU(universe, 1), refs: make([]int32, universe)}
	}
	return fl
}

// reset empties every replica and sizes its cache to capacity blocks.
func (fl *simFleet) reset(capacity int) {
	for _, rp := range fl.reps {
		rp.reset(capacity)
	}
}

// simReplica is one simulated engine: a prefix cache, a FIFO prefill queue
// drained at rate tokens per second, and the requests decoding.
type simReplica struct {
	cache *blockLRU
	cpu   *blockLRU // the CPU offload tier, nil without one (see cpuTier)
	rate  float64
	// busyUntil is when the queued prefill work will be done.
	busyUntil float64
	// prefill holds the requests whose prefill has not finished, in order
	// (their start and end times are non-decreasing), from index head;
	// headStarted reports that prefill[head] has started and holds its
	// blocks.
	prefill     []prefillEntry
	head        int
	headStarted bool
	// decoding holds the requests past prefill, by finish time.
	decoding decodeHeap
	// estPrefill is the gateway's InflightPrefillTokens: Σ est of prefill.
	estPrefill int64
	// refs counts, per block id, the running requests using the block;
	// used is the number of blocks with a reference, and outBlocks the
	// blocks running requests hold for their output. Shared prompt blocks
	// count once, as in vLLM's paged KV cache.
	refs      []int32
	used      int
	outBlocks int
	// computed is the prefill tokens computed so far.
	computed int64
	// meter measures the replica's arrivals and their uncached prompt
	// tokens, as the gateway does from the engine's counters; meterAt is
	// the time it was last advanced to.
	meter   scoring.Meter
	meterAt float64
}

// prefillEntry is a request queued or prefilling on a replica.
type prefillEntry struct {
	start, end, decode float64
	est, work          int64
	ids                []int32
	out                int
}

// decodeEntry is a request decoding on a replica.
type decodeEntry struct {
	finish float64
	ids    []int32
	out    int
}

// observation is a decision's estimate and simulated TTFT, due to the
// calibrator when its first token is.
type observation struct {
	at, ttft float64
	est      scoring.Estimate
}

// observationHeap is a min-heap of observations by due time.
type observationHeap []observation

func (h observationHeap) Len() int           { return len(h) }
func (h observationHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h observationHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *observationHeap) Push(x any)        { *h = append(*h, x.(observation)) }
func (h *observationHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// decodeHeap is a min-heap of decodeEntry by finish time.
type decodeHeap []decodeEntry

func (h decodeHeap) Len() int           { return len(h) }
func (h decodeHeap) Less(i, j int) bool { return h[i].finish < h[j].finish }
func (h decodeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *decodeHeap) Push(x any)        { *h = append(*h, x.(decodeEntry)) }
func (h *decodeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (rp *simReplica) reset(capacity int) {
	rp.cache.reset(capacity)
	if rp.cpu != nil {
		rp.cpu.reset(rp.cpu.capacity)
	}
	clear(rp.refs)
	rp.busyUntil, rp.head, rp.headStarted, rp.estPrefill, rp.computed = 0, 0, false, 0, 0
	rp.meter, rp.meterAt = scoring.Meter{}, 0
	rp.used, rp.outBlocks = 0, 0
	rp.prefill = rp.prefill[:0]
	rp.decoding = rp.decoding[:0]
}

// advance moves the replica's clock to now: queued requests whose prefill
// started take their blocks, those whose prefill ended move to decode, and
// those whose decode ended release their blocks.
func (rp *simReplica) advance(now float64) {
	for rp.head < len(rp.prefill) && rp.prefill[rp.head].start <= now {
		e := &rp.prefill[rp.head]
		if !rp.headStarted {
			rp.hold(e.ids, e.out)
			rp.headStarted = true
			// The engine counts a request when it schedules it (vLLM's
			// queue-time histogram), with its uncached prompt.
			rp.meter.Advance(e.start - rp.meterAt)
			rp.meterAt = max(rp.meterAt, e.start)
			rp.meter.Add(1, float64(e.work))
		}
		if e.end > now {
			break
		}
		rp.head++
		rp.headStarted = false
		rp.estPrefill -= e.est
		if fin := e.end + e.decode; fin > now {
			heap.Push(&rp.decoding, decodeEntry{finish: fin, ids: e.ids, out: e.out})
		} else {
			rp.release(e.ids, e.out)
		}
	}
	if rp.head == len(rp.prefill) {
		rp.prefill, rp.head = rp.prefill[:0], 0
	} else if rp.head > 1024 && rp.head > len(rp.prefill)/2 {
		rp.prefill = rp.prefill[:copy(rp.prefill, rp.prefill[rp.head:])]
		rp.head = 0
	}
	for len(rp.decoding) > 0 && rp.decoding[0].finish <= now {
		e := heap.Pop(&rp.decoding).(decodeEntry)
		rp.release(e.ids, e.out)
	}
}

// hold references a starting request's prompt blocks and output blocks.
func (rp *simReplica) hold(ids []int32, out int) {
	for _, id := range ids {
		if rp.refs[id] == 0 {
			rp.used++
		}
		rp.refs[id]++
	}
	rp.outBlocks += out
}

// release drops a finished request's references.
func (rp *simReplica) release(ids []int32, out int) {
	for _, id := range ids {
		if rp.refs[id]--; rp.refs[id] == 0 {
			rp.used--
		}
	}
	rp.outBlocks -= out
}

// queued returns the uncached prompt tokens waiting or prefilling at now.
func (rp *simReplica) queued(now float64) float64 {
	return max(0, rp.busyUntil-now) * rp.rate
}

// headOf returns the gateway's estimate of the prefill at the head of the
// queue and how long it has been there (0, 0 when none has started).
func (rp *simReplica) headOf(now float64) (int64, float64) {
	if !rp.headStarted {
		return 0, 0
	}
	e := &rp.prefill[rp.head]
	return e.est, now - e.start
}

// kvUsage returns the fraction of the replica's cache referenced by
// running requests, at most 1.
func (rp *simReplica) kvUsage() float64 {
	return min(1, float64(rp.used+rp.outBlocks)/float64(rp.cache.capacity))
}

// endpoint describes the replica (after advance) at now as the gateway
// would see it; bt is the block size in tokens.
func (rp *simReplica) endpoint(id string, sat scoring.Saturation, now float64, bt int) scoring.Endpoint {
	rp.meter.Advance(now - rp.meterAt)
	rp.meterAt = max(rp.meterAt, now)
	pending := len(rp.prefill) - rp.head
	waiting, running := pending, len(rp.decoding)
	if rp.headStarted {
		waiting--
		running++
	}
	kv := rp.kvUsage()
	saturated, _ := sat.Judge(waiting, kv, rp.estPrefill)
	headTokens, headElapsed := rp.headOf(now)
	return scoring.Endpoint{
		ID:                      id,
		Waiting:                 waiting,
		Running:                 running,
		KVUsage:                 kv,
		InflightRequests:        int64(pending + len(rp.decoding)),
		InflightPrefillTokens:   rp.estPrefill,
		HeadPrefillTokens:       headTokens,
		HeadElapsed:             headElapsed,
		InflightPrefillRequests: pending,
		ArrivalRate:             rp.meter.Requests,
		UncachedRate:            rp.meter.Tokens,
		CacheTokens:             rp.cache.capacity * bt,
		CPUCacheTokens:          rp.cpuTokens(bt),
		RequestTokens:           rp.meter.PerRequest(),
		Saturated:               saturated,
	}
}

// admit queues a request arriving at now with prompt blocks ids, work
// uncached prompt tokens (est by the gateway's reckoning) and out output
// blocks, decoding for decode seconds after its prefill; it returns how
// long the request waits before its prefill starts. Call advance(now)
// after it, so that a request starting at once takes its blocks.
func (rp *simReplica) admit(now float64, ids []int32, work, est, out int, decode float64) float64 {
	start := max(now, rp.busyUntil)
	end := start + float64(work)/rp.rate
	rp.busyUntil = end
	rp.prefill = append(rp.prefill, prefillEntry{start: start, end: end, decode: decode, est: int64(est), work: int64(work), ids: ids, out: out})
	rp.estPrefill += int64(est)
	rp.computed += int64(work)
	return start - now
}

// prefillSpread returns each replica's computed prefill tokens and their
// imbalance: max ÷ mean, 1 when none was computed.
func (fl *simFleet) prefillSpread() ([]int64, float64) {
	tokens := make([]int64, len(fl.reps))
	var sum, hi int64
	for j, rp := range fl.reps {
		tokens[j] = rp.computed
		sum += rp.computed
		hi = max(hi, rp.computed)
	}
	if sum == 0 {
		return tokens, 1
	}
	return tokens, float64(hi) * float64(len(fl.reps)) / float64(sum)
}
