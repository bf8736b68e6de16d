package scoring

import "math"

// Prior step-time constants: those of vllmsim's default profile, Qwen3-32B
// in BF16 on 2×H100 with tensor parallelism 2 (vllmsim/profile.go documents
// the sources; bench tests that the two agree). They are the prior until
// calibration replaces them; see [Calibrator].
const (
	DefaultPrefillPerToken       = 1.0 / 15000 // seconds per prompt token computed
	DefaultStepBase              = 0.011       // seconds per engine step
	DefaultDecodePerSeq          = 40e-6       // seconds per running sequence per step
	DefaultDecodePerContextToken = 25e-9       // seconds per context token of running sequences per step
	DefaultStepTokens            = 8192        // vLLM's max_num_batched_tokens
)

// Cost is one model's timing model, in the terms of a continuous-batching
// engine's step (vLLM's, and vllmsim's):
//
//	step = StepBase + PrefillPerToken × prefill tokens
//	       + DecodePerSeq × running sequences
//	       + DecodePerContextToken × their context tokens
//
// with at most StepTokens tokens per step, one per decoding sequence and
// the rest prefill. QueueScale, TokenScale and StepScale are the
// calibration: they multiply the three parts of an estimate (the queue
// ahead, the request's own prefill, the steps' fixed costs; see
// [Estimate] and [Calibrator]); 0 means 1. Overhead is calibrated too.
//
// The zero value is [DefaultCost] (see WithDefaults).
type Cost struct {
	PrefillPerToken                   float64
	StepBase                          float64
	DecodePerSeq                      float64
	DecodePerContextToken             float64
	StepTokens                        int
	QueueScale, TokenScale, StepScale float64
	// Overhead is added to every estimate, seconds: what no replica's
	// load explains (network, the engine's front end, a loaded host); it
	// is the same on every replica, so it changes no choice. Calibrated;
	// 0 in the prior.
	Overhead float64
}

// DefaultCost returns the prior cost model (the Default constants).
func DefaultCost() Cost {
	return Cost{
		PrefillPerToken:       DefaultPrefillPerToken,
		StepBase:              DefaultStepBase,
		DecodePerSeq:          DefaultDecodePerSeq,
		DecodePerContextToken: DefaultDecodePerContextToken,
		StepTokens:            DefaultStepTokens,
		QueueScale:            1,
		TokenScale:            1,
		StepScale:             1,
	}
}

// WithDefaults returns c, or DefaultCost when c is the zero value; scales
// of 0 become 1 and a StepTokens of 0 becomes DefaultStepTokens.
func (c Cost) WithDefaults() Cost {
	if c == (Cost{}) {
		return DefaultCost()
	}
	if c.QueueScale == 0 {
		c.QueueScale = 1
	}
	if c.TokenScale == 0 {
		c.TokenScale = 1
	}
	if c.StepScale == 0 {
		c.StepScale = 1
	}
	if c.StepTokens <= 0 {
		c.StepTokens = DefaultStepTokens
	}
	return c
}

// Estimate is one replica's predicted time to first token for one
// request, and what it rests on.
type Estimate struct {
	// TTFT is the predicted time to first token, seconds: QueueScale ×
	// QueueSeconds (or AdmitSeconds, when the replica is not draining its
	// queue) + TokenScale × OwnSeconds + StepScale × StepSeconds +
	// Overhead.
	TTFT float64
	// Others is the delay the request's own prefill imposes on everyone
	// else (the fleet's time and the requests queued behind it), and
	// Future the expected prefill its conversation's next turns pay
	// because the replica will have evicted its prefix by then, seconds:
	// together the cache-placement term (see the package doc); 0 for
	// policies that do not weigh them.
	Others, Future float64
	// Replication is what a copy of the prompt's shared prefix here
	// would save the requests that will share it, seconds of their cost,
	// for a replica holding less of the prompt than the best one (see the
	// package doc); 0 for the holders and for policies that do not weigh
	// it. Cost subtracts it.
	Replication float64
	// QueuedTokens is the prefill work ahead of the request and
	// UncachedTokens its own uncached prompt, in tokens; CachedTokens is
	// the prompt the replica is believed to hold.
	QueuedTokens, UncachedTokens, CachedTokens int64
	// QueueSeconds, OwnSeconds and StepSeconds are the uncalibrated parts
	// of TTFT at the cost model's base constants: the prefill queued ahead,
	// the request's own uncached prefill, and the steps' fixed and decode
	// costs. A Calibrator fits the Cost's scales to them.
	QueueSeconds, OwnSeconds, StepSeconds float64
	// AdmitSeconds is the wait to be admitted when the replica is not
	// draining its queue (its KV cache or batch is full): its waiting
	// requests, and this one, are admitted at the rate the engine has been
	// scheduling requests. AdmitBound reports that it, not QueueSeconds,
	// is the wait.
	AdmitSeconds float64
	AdmitBound   bool
}

// Cost is the estimate's total: TTFT plus the cache-placement term
// (Others + Future − Replication), the quantity the warmpath policy
// minimises.
func (e Estimate) Cost() float64 { return e.TTFT + e.Placement() }

// Placement is the cache-placement term, Others + Future − Replication.
func (e Estimate) Placement() float64 { return e.Others + e.Future - e.Replication }

// load is what the model reads off an endpoint, resolved once per
// decision.
type load struct {
	queued  float64 // prefill tokens ahead
	running float64 // sequences in the batch
	context float64 // their context tokens
	rate    float64 // requests scheduled per second
	admit   float64 // seconds until a new request is admitted, when KV-bound; else 0
	life    float64 // seconds an unused prefix survives in the cache; +Inf when unknown
	cpuLife float64 // seconds it survives in the CPU offload tier as well; life without one
	behind  float64 // requests in the caller's queue that wait for this replica after this one
}

// queuePrice is the price of a waiting request this gateway did not send,
// in tokens: the replica's own measured mean, else the mean of those the
// decision's endpoints report, else fallback (the request's own prompt: a
// queue of requests like this one).
func queuePrice(eps []Endpoint, fallback float64) float64 {
	var sum float64
	n := 0
	for i := range eps {
		if eps[i].RequestTokens > 0 {
			sum += eps[i].RequestTokens
			n++
		}
	}
	if n > 0 {
		return sum / float64(n)
	}
	return fallback
}

// loadOf resolves e's load under cost c: this gateway's in-flight
// prefill less what the head of the line has computed since it got there,
// plus each engine-reported waiting request beyond this gateway's own
// priced at price tokens, plus the uncached prefill of the requests
// waiting in the gateway's queue for this replica ahead of this one.
func (c *Cost) loadOf(e *Endpoint, price float64) load {
	p := price
	if e.RequestTokens > 0 {
		p = e.RequestTokens
	}
	l := load{
		running: float64(max(e.Running, 0)),
		context: max(0, e.KVUsage) * float64(max(e.KVTokens, 0)),
		rate:    max(0, e.ArrivalRate),
		life:    math.Inf(1),
		behind:  float64(max(e.GatewayBehind, 0)),
	}
	// An LRU cache evicts a token for every token it admits: a prefix left
	// unused survives as long as the free part of the cache takes to fill.
	if e.CacheTokens > 0 && e.UncachedRate > 0 {
		l.life = (1 - min(max(e.KVUsage, 0), 1)) * float64(e.CacheTokens) / e.UncachedRate
	}
	// The CPU tier stores every block the engine computes (an LRU as
	// well, always full once warm): an evicted prefix stays loadable
	// until as many newer tokens were offloaded behind it.
	l.cpuLife = l.life
	if e.CPUCacheTokens > 0 && e.UncachedRate > 0 {
		l.cpuLife = l.life + float64(e.CPUCacheTokens)/e.UncachedRate
	}
	own := float64(max(e.InflightPrefillTokens, 0))
	if e.HeadElapsed > 0 && e.HeadPrefillTokens > 0 {
		own -= min(float64(e.HeadPrefillTokens), e.HeadElapsed/c.perToken(l))
	}
	foreign := max(0, e.Waiting-e.InflightPrefillRequests)
	l.queued = max(0, own) + float64(foreign)*p + float64(max(e.GatewayAheadTokens, 0))
	// A queue the engine is not draining by prefill is served by Little's
	// law: each waiting request, and this one, at the rate the engine has
	// been scheduling (no slower than one per MeterWindow; not at all when
	// the rate is unknown). It is such a queue when fewer requests were
	// scheduled over the last MeterWindow than are waiting now, and
	// either the free KV cache cannot hold a waiting request or prefill
	// took less than half the replica's time while it scheduled at least
	// one request over the window (its batch is full): a replica busier
	// with prefill than that drains its queue at prefill speed, which
	// queued already prices. The requests the gateway holds for the
	// replica ahead of this one wait in that queue too, only earlier.
	if ahead := float64(e.Waiting + max(e.GatewayAhead, 0)); ahead > 0 && l.rate > 0 && l.rate*MeterWindow < ahead {
		free := (1 - min(max(e.KVUsage, 0), 1)) * float64(max(e.KVTokens, 0))
		kvFull := e.KVTokens > 0 && free < p
		// A batch that is full keeps scheduling as its sequences finish:
		// with less than one request scheduled over the window, a waiting
		// request is one a scrape caught before its first step, not a
		// full batch.
		batchFull := l.rate*MeterWindow >= 1 && e.UncachedRate*c.perToken(l) < 0.5
		if kvFull || batchFull {
			l.admit = (ahead + 1) / max(l.rate, 1/MeterWindow)
		}
	}
	return l
}

// estimate is the model's prediction for a request with uncached own
// tokens (and cached ones held) on an endpoint under load l:
//
//	W     = queued + uncached                       prefill tokens until the first token
//	o     = StepBase + running × DecodePerSeq + context × DecodePerContextToken
//	B     = max(StepTokens − running, StepTokens ÷ 8)   prefill tokens per step
//	steps = ⌈W ÷ B⌉ (at least 1), plus ½ for the step in progress when busy
//	admit = (waiting + 1) ÷ scheduling rate, when fewer requests were scheduled
//	        over the last MeterWindow than are waiting and the replica's KV cache
//	        is full or prefill took under half its time; else 0
//	TTFT  = max(QueueScale × queued × PrefillPerToken, admit)
//	        + TokenScale × uncached × PrefillPerToken + StepScale × steps × o + Overhead
func (c *Cost) estimate(l load, uncached, cached float64) Estimate {
	w := l.queued + uncached
	o := c.StepBase + l.running*c.DecodePerSeq + l.context*c.DecodePerContextToken
	st := float64(c.StepTokens)
	b := max(st-l.running, st/8)
	steps := max(1, math.Ceil(w/b))
	if l.queued > 0 || l.running > 0 {
		steps += 0.5
	}
	e := Estimate{
		QueuedTokens:   int64(l.queued),
		UncachedTokens: int64(uncached),
		CachedTokens:   int64(cached),
		QueueSeconds:   l.queued * c.PrefillPerToken,
		OwnSeconds:     uncached * c.PrefillPerToken,
		StepSeconds:    steps * o,
	}
	queue := c.QueueScale * e.QueueSeconds
	if l.admit > queue {
		queue, e.AdmitSeconds, e.AdmitBound = l.admit, l.admit, true
	}
	e.TTFT = queue + c.TokenScale*e.OwnSeconds + c.StepScale*e.StepSeconds + max(c.Overhead, 0)
	return e
}

// perToken is the calibrated marginal cost of one more prefill token on a
// replica under load l: its own cost plus its share of the step overhead.
func (c *Cost) perToken(l load) float64 {
	o := c.StepBase + l.running*c.DecodePerSeq + l.context*c.DecodePerContextToken
	st := float64(c.StepTokens)
	return c.TokenScale*c.PrefillPerToken + c.StepScale*o/max(st-l.running, st/8)
}

// others is the delay the request's own prefill (uncached tokens) costs
// everyone but the request itself, on a replica under load l whose
// estimate for it is e, with backlog requests per replica waiting in the
// gateway's admission queue for room on the fleet and l.behind waiting
// there for this replica after this request:
//
//	Others = uncached × perToken × (1 + ArrivalRate × TTFT + backlog + behind)
//
// The prefill's seconds are paid once by the fleet, whose replica can do
// nothing else meanwhile, once more by each request that arrives at the
// replica before it is done and waits behind it (ArrivalRate × TTFT of
// them in expectation, TTFT here without the fixed overhead, which holds
// no replica up), once more by each request the admission queue holds
// for room on this replica after this one (behind), and once more by each
// request it holds for room on the fleet, no replica chosen yet: the
// queue drains at the replicas' pace, so a second of one replica's time
// delays it by that second over the replicas (backlog is the queue's
// share per replica). A cache hit shrinks uncached and so every term: at
// low load the fleet's share keeps a conversation where its prefix is
// unless another replica is faster by more than the prefix costs to
// recompute, and under load the queue's share grows with every request
// that would wait; when the gateway's queue holds a backlog, a miss is
// priced at its cost to all of it, which is what keeps an overloaded
// fleet's cache hits.
func (c *Cost) others(l load, e Estimate, backlog float64) float64 {
	if e.UncachedTokens <= 0 {
		return 0
	}
	return float64(e.UncachedTokens) * c.perToken(l) * (1 + l.rate*max(0, e.TTFT-c.Overhead) + max(0, backlog) + l.behind)
}

// future is what the conversation's later turns are expected to pay for
// being placed on a replica under load l. A placement lasts until the
// conversation's prefix is evicted there: a turn whose gap outlasts the
// replica's cache (SessionStats.Survival of the prefix's life there)
// prefills the whole prompt again, and routing then places the
// conversation anew, so one placement costs at most one such re-prefill.
// Over the turns still to come (SessionStats.Remaining):
//
//	Future = evicted(life) × prompt × perToken
//	evicted(τ) = 1 − (1 − P(gap > τ))^remaining turns
//
// With a CPU offload tier a prefix the GPU evicts is loaded back, at
// CPUHitCost of its prefill, until the tier evicts it too (cpuLife):
//
//	Future = (CPUHitCost × evicted(life) + (1 − CPUHitCost) × evicted(cpuLife)) × prompt × perToken
//
// A replica whose cache churns is a poorer home for a conversation that
// will pause, but for a long conversation every replica's chance of one
// eviction nears 1, and today's churn no longer tells them apart. Pricing
// each remaining turn's eviction (remaining × P(gap > life)) instead
// counted the re-prefills of placements routing would have made after
// the first, and let a momentary difference in churn between two
// replicas outweigh the whole prefix a conversation abandons by moving
// (docs/benchmarks/log/2026-12-07-agentic-real-model.md). Pricing a GPU
// eviction as a re-prefill on a replica with a CPU tier moved
// conversations off the replica whose tier held them, to load nothing
// and prefill everything elsewhere (docs/benchmarks/log/2026-12-07-cpu-tier-estimate.md).
func (c *Cost) future(l load, st *SessionStats, turn int, prompt float64) float64 {
	if st == nil || math.IsInf(l.life, 1) {
		return 0
	}
	r := st.Remaining(turn)
	if r <= 0 {
		return 0
	}
	evicted := func(tau float64) float64 { return 1 - math.Pow(1-st.Survival(tau), r) }
	p := evicted(l.life)
	if l.cpuLife > l.life {
		p = CPUHitCost*p + (1-CPUHitCost)*evicted(l.cpuLife)
	}
	return p * prompt * c.perToken(l)
}

// replication is what a copy of a shared prefix on a replica saves the
// requests that will share it: each of sharers requests like this one
// would pay held (its cost on the cheapest replica holding the prefix)
// and, with the copy, pays as (its cost on this replica holding it):
//
//	Replication = Sharers × max(0, held − as)
//
// Sharers is the prefix's demand over the horizon (see Demand). The
// copy's own price, the prefill of what the replica lacks (in TTFT and
// Others), is in the replica's estimate already.
func replication(sharers, held, as float64) float64 {
	if !(sharers > 0) {
		return 0
	}
	return sharers * max(0, held-as)
}
