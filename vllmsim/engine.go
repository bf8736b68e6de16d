package vllmsim

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmpath/warmpath/kvevents"
)

// Clock is the engine's source of real time. Step durations are slept
// through it (divided by the speed factor). The zero Config uses the system
// clock; tests may inject one whose Sleep returns at once.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// Sleep blocks for d or until ctx is done, returning ctx.Err() then.
	Sleep(ctx context.Context, d time.Duration) error
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// eventSink receives the engine's KV-event batches; *kvevents.Publisher
// satisfies it.
type eventSink interface {
	Publish(b kvevents.Batch) error
	Reset()
}

var _ eventSink = (*kvevents.Publisher)(nil)

// errRestarted fails requests in flight when a replica restarts.
var errRestarted = errors.New("engine restarted: request aborted")

// errTooLarge fails a request that needs more KV blocks than the cache has.
var errTooLarge = errors.New("request needs more KV blocks than the cache holds")

// Sequence states.
const (
	seqWaiting = iota
	seqRunning
	seqFinished
	seqAborted
)

// seq is one request inside the engine. Fields above the line are fixed at
// creation; engine fields are guarded by engine.mu; the progress fields are
// how the engine hands results to the HTTP handler without locks.
type seq struct {
	promptLen int
	plan      genPlan
	salt      string
	session   string
	priority  int

	// Engine state, guarded by engine.mu.
	order       uint64
	tokens      []uint32 // prompt, then sampled output; only appended to
	hashes      []uint64 // chained hashes of full blocks of tokens; only appended to
	blockIDs    []int32
	numComputed int // tokens whose KV is computed
	stored      int // leading blocks cached (reported or hit)
	state       int
	scheduled   bool
	arrival     time.Duration // simulated time the engine saw the request

	// Written by the engine before generated is first stored (so a handler
	// that saw generated ≥ 1 or done may read them).
	cachedTokens    int           // GPU hits and CPU loads, as vLLM's num_cached_tokens
	cpuCachedTokens int           // of which loaded from the CPU tier
	queueTime       time.Duration // arrival → first scheduled, simulated
	ttft            time.Duration // arrival → first token, simulated
	e2e             time.Duration // arrival → last token, simulated (set before done)

	generated atomic.Int64 // output tokens sampled so far
	done      atomic.Bool  // finished, aborted or failed; err is set before
	err       error
	notify    chan struct{} // cap 1; signalled on progress
}

func newSeq(prompt []uint32, plan genPlan, salt, session string, priority int) *seq {
	toks := make([]uint32, len(prompt), len(prompt)+len(plan.tokens))
	copy(toks, prompt)
	return &seq{promptLen: len(prompt), plan: plan, salt: salt, session: session, priority: priority,
		tokens: toks, notify: make(chan struct{}, 1)}
}

func (s *seq) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

type scheduled struct {
	s *seq
	n int
}

// engineConfig is the resolved configuration of one engine.
type engineConfig struct {
	profile  Profile
	speed    float64
	priority bool // priority scheduling instead of FCFS
	clock    Clock
	sink     eventSink
	newRoot  func() uint64 // hash root for a new "process"
	// typedExtra selects main's typed extra keys (event_version 2) for
	// salted blocks, as map-format publishers send them.
	typedExtra bool
	// rank is the data-parallel rank, the data_parallel_rank of batches.
	rank int
	// promptOnly caches only blocks made of prompt tokens.
	promptOnly bool
	// cpuBlocks sizes the CPU offload tier (0: none); cpuStoreOnly keeps
	// its evictions silent.
	cpuBlocks    int
	cpuStoreOnly bool
	logger       *slog.Logger
}

// engine is a continuous-batching scheduler over a kvCache. Run owns the
// step loop; other methods may be called concurrently.
type engine struct {
	cfg  engineConfig
	wake chan struct{} // cap 1; signalled when work arrives

	mu       sync.Mutex // guards everything below
	inbox    []*seq
	waiting  []*seq // sorted by (priority if enabled, order)
	running  []*seq // in admission order
	cache    *kvCache
	gen      uint64 // bumped by restart; a step from an older gen is dropped
	vnow     time.Duration
	orders   uint64
	sched    []scheduled
	stats    Stats
	ttftHist histogram
	// queueHist and prefillHist are vLLM's per-request queue time
	// (arrival → first scheduled) and prefill time (first scheduled →
	// first token).
	queueHist, prefillHist histogram
}

func newEngine(cfg engineConfig) *engine {
	p := cfg.profile
	return &engine{
		cfg:  cfg,
		wake: make(chan struct{}, 1),
		cache: newKVCache(cacheConfig{numBlocks: p.KVBlocks, blockSize: p.BlockSize, root: cfg.newRoot(),
			typedExtra: cfg.typedExtra, promptOnly: cfg.promptOnly, cpuBlocks: cfg.cpuBlocks, cpuStoreOnly: cfg.cpuStoreOnly}),
		ttftHist:    newHistogram(ttftBuckets),
		queueHist:   newHistogram(requestBuckets),
		prefillHist: newHistogram(requestBuckets),
	}
}

// submit queues s; the engine stamps its arrival at the start of its next
// step.
func (e *engine) submit(s *seq) {
	e.mu.Lock()
	e.orders++
	s.order = e.orders
	e.inbox = append(e.inbox, s)
	e.stats.Requests++
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// abort removes s (client gone). A finished s is left alone.
func (e *engine) abort(s *seq) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.done.Load() {
		return
	}
	e.remove(s)
	s.state = seqAborted
	e.stats.Aborted++
	s.done.Store(true)
	s.signal()
}

// remove takes s out of the inbox or queues and releases its blocks.
func (e *engine) remove(s *seq) {
	e.inbox = deleteSeq(e.inbox, s)
	e.waiting = deleteSeq(e.waiting, s)
	e.running = deleteSeq(e.running, s)
	e.cache.release(s)
}

func deleteSeq(list []*seq, s *seq) []*seq {
	for i, x := range list {
		if x == s {
			return append(list[:i], list[i+1:]...)
		}
	}
	return list
}

// restart emulates a process restart: every request fails, the cache is
// emptied silently (no AllBlocksCleared), counters start over and the event
// sequence restarts at 0.
func (e *engine) restart() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.gen++
	for _, list := range [][]*seq{e.inbox, e.waiting, e.running} {
		for _, s := range list {
			s.state = seqAborted
			s.err = errRestarted
			s.done.Store(true)
			s.signal()
		}
	}
	e.inbox, e.waiting, e.running, e.sched = nil, nil, nil, e.sched[:0]
	e.cache.reset(e.cfg.newRoot())
	e.stats = Stats{}
	e.ttftHist = newHistogram(ttftBuckets)
	e.queueHist, e.prefillHist = newHistogram(requestBuckets), newHistogram(requestBuckets)
	if e.cfg.sink != nil {
		e.cfg.sink.Reset()
	}
}

// resetPrefixCache is vLLM's /reset_prefix_cache: cached blocks are
// forgotten and AllBlocksCleared is published at once.
func (e *engine) resetPrefixCache() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cache.resetPrefixCache()
	e.publishLocked()
}

func (e *engine) publishLocked() {
	ev := e.cache.takeEvents()
	if len(ev) == 0 || e.cfg.sink == nil {
		return
	}
	now := e.cfg.clock.Now()
	b := kvevents.Batch{TS: float64(now.UnixNano()) / 1e9, Events: ev, DPRank: new(e.cfg.rank)}
	if err := e.cfg.sink.Publish(b); err != nil {
		e.cfg.logger.Warn("vllmsim: publish KV events", "err", err)
	}
}

// Run is the step loop. It blocks until ctx is done and returns nil then.
// An idle engine waits on a channel; a busy one sleeps each step's
// simulated duration divided by the speed factor, against an absolute
// deadline so that processing overhead does not accumulate.
func (e *engine) Run(ctx context.Context) error {
	clock := e.cfg.clock
	anchorReal := clock.Now()
	e.mu.Lock()
	anchorV := e.vnow
	e.mu.Unlock()
	for {
		e.mu.Lock()
		e.drainInbox()
		d, gen := e.schedule()
		if len(e.sched) == 0 && len(e.waiting) > 0 {
			// Everything was preempted this step; admission runs next step.
			e.mu.Unlock()
			continue
		}
		if len(e.sched) == 0 {
			// Idle: wait for work; simulated time follows real time
			// meanwhile. (A waiting request never waits on an empty engine:
			// with nothing running every block is free.)
			idleSince := clock.Now()
			e.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil
			case <-e.wake:
			}
			now := clock.Now()
			e.mu.Lock()
			e.vnow += time.Duration(float64(now.Sub(idleSince)) * e.cfg.speed)
			anchorReal, anchorV = now, e.vnow
			e.mu.Unlock()
			continue
		}
		e.mu.Unlock()

		target := anchorReal.Add(time.Duration(float64(e.vnowPlus(d)-anchorV) / e.cfg.speed))
		now := clock.Now()
		if lag := now.Sub(target); lag > time.Second {
			// Far behind real time (an overloaded host): stop catching up.
			anchorReal, anchorV = now, e.vnowPlus(0)
			target = now
		}
		if err := clock.Sleep(ctx, target.Sub(now)); err != nil {
			return nil
		}

		e.mu.Lock()
		if gen == e.gen {
			e.vnow += d
			e.apply()
			e.publishLocked()
		}
		e.mu.Unlock()
	}
}

func (e *engine) vnowPlus(d time.Duration) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.vnow + d
}

// drainInbox moves new requests to the waiting queue, stamping arrival.
func (e *engine) drainInbox() {
	for _, s := range e.inbox {
		s.arrival = e.vnow
		s.state = seqWaiting
		e.enqueue(s)
	}
	clear(e.inbox)
	e.inbox = e.inbox[:0]
}

// less orders the waiting queue: by priority (lower first) when priority
// scheduling is on, then by arrival order.
func (e *engine) less(a, b *seq) bool {
	if e.cfg.priority && a.priority != b.priority {
		return a.priority < b.priority
	}
	return a.order < b.order
}

func (e *engine) enqueue(s *seq) {
	i := sort.Search(len(e.waiting), func(i int) bool { return e.less(s, e.waiting[i]) })
	e.waiting = append(e.waiting, nil)
	copy(e.waiting[i+1:], e.waiting[i:])
	e.waiting[i] = s
}

// victim picks the running sequence to preempt: the newest under FCFS, the
// lowest-priority (then newest) under priority scheduling.
func (e *engine) victim() int {
	v := len(e.running) - 1
	if e.cfg.priority {
		for i, s := range e.running {
			if e.less(e.running[v], s) {
				v = i
			}
		}
	}
	return v
}

// preempt frees the blocks of running[i] and puts it back in the waiting
// queue for recomputation (vLLM's recompute preemption). Its sampled tokens
// are kept and recomputed as part of its prompt.
func (e *engine) preempt(i int) *seq {
	s := e.running[i]
	e.running = append(e.running[:i], e.running[i+1:]...)
	e.cache.release(s)
	s.numComputed = 0
	s.state = seqWaiting
	e.enqueue(s)
	e.stats.Preemptions++
	return s
}

// schedule plans one step into e.sched and returns its simulated duration
// and the generation it belongs to. Blocks are allocated and newly full
// blocks cached (BlockStored queued) here, at scheduling time, like vLLM.
func (e *engine) schedule() (time.Duration, uint64) {
	p := &e.cfg.profile
	e.sched = e.sched[:0]
	budget, preempted := e.scheduleRunning(p.MaxNumBatchedTokens)
	loadTokens := 0 // tokens loaded from the CPU tier this step
	if !preempted {
		// As vLLM's scheduler, none are admitted in a step that preempted.
		loadTokens = e.scheduleWaiting(budget)
	}
	prefill, ctxTokens := 0, 0
	for _, sc := range e.sched {
		if sc.n == 1 && len(sc.s.tokens) > sc.s.promptLen {
			ctxTokens += sc.s.numComputed + 1
		} else {
			prefill += sc.n
		}
	}
	e.stats.PrefillTokens += uint64(prefill)
	return p.stepTime(prefill, len(e.sched), ctxTokens, loadTokens), e.gen
}

// scheduleRunning schedules the running sequences' next tokens within
// budget, preempting the lowest-priority ones for blocks when it must. It
// returns the budget left and whether it preempted.
func (e *engine) scheduleRunning(budget int) (left int, preempted bool) {
	c := e.cache
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		n := min(len(s.tokens)-s.numComputed, budget)
		ok := true
		for !c.ensure(s, s.numComputed+n) {
			v := e.victim()
			vs := e.preempt(v)
			preempted = true
			for j, sc := range e.sched {
				if sc.s == vs {
					budget += sc.n
					e.sched = append(e.sched[:j], e.sched[j+1:]...)
					break
				}
			}
			if vs == s {
				ok = false
				break
			}
			if v < i {
				i--
			}
		}
		if !ok {
			// s preempted itself: nothing else can be preempted for it, and,
			// as vLLM's scheduler does, the running loop stops here.
			break
		}
		e.sched = append(e.sched, scheduled{s, n})
		budget -= n
		c.storeFull(s, s.numComputed+n)
	}
	return budget, preempted
}

// scheduleWaiting admits waiting sequences in order while budget, the
// sequence limit and free blocks allow, their prefix-cache hits counted as
// computed. It returns the tokens loaded from the CPU tier.
func (e *engine) scheduleWaiting(budget int) (loadTokens int) {
	p := &e.cfg.profile
	c := e.cache
	for budget > 0 && len(e.running) < p.MaxNumSeqs && len(e.waiting) > 0 {
		s := e.waiting[0]
		if c.blocksFor(len(s.tokens)+1) > len(c.blocks) {
			// Can never fit (the HTTP layer rejects such requests up front).
			e.waiting = append(e.waiting[:0], e.waiting[1:]...)
			s.state, s.err = seqAborted, errTooLarge
			e.stats.Aborted++
			s.done.Store(true)
			s.signal()
			continue
		}
		hit, freeHit := c.lookup(s)
		loaded := c.cpuLookup(s, hit) // continues the GPU hit from the CPU tier
		computed := (hit + loaded) * c.blockSize
		n := min(len(s.tokens)-computed, budget)
		if c.blocksFor(computed+n)-hit > c.nfree-freeHit {
			break // head-of-line: wait for blocks
		}
		e.waiting = append(e.waiting[:0], e.waiting[1:]...)
		c.acquireHits(s, hit)
		c.ensure(s, computed+n)
		c.cpuLoad(s, hit, loaded)
		loadTokens += loaded * c.blockSize
		s.numComputed = computed
		s.state = seqRunning
		if !s.scheduled {
			s.scheduled = true
			s.cachedTokens = computed
			s.cpuCachedTokens = loaded * c.blockSize
			s.queueTime = e.vnow - s.arrival
			e.queueHist.observe(s.queueTime.Seconds())
			e.stats.PromptTokens += uint64(s.promptLen)
			e.stats.CachedTokens += uint64(computed)
			e.stats.CPUCachedTokens += uint64(s.cpuCachedTokens)
		}
		e.running = append(e.running, s)
		e.sched = append(e.sched, scheduled{s, n})
		budget -= n
		c.storeFull(s, computed+n)
	}
	return loadTokens
}

// apply ends a step: computed tokens advance, sequences that computed all
// their tokens sample one, finished ones release their blocks.
func (e *engine) apply() {
	e.stats.Steps++
	finished := false
	for _, sc := range e.sched {
		s := sc.s
		if s.state != seqRunning {
			continue // aborted during the step
		}
		s.numComputed += sc.n
		if s.numComputed < len(s.tokens) {
			continue // chunked prefill goes on
		}
		g := s.generated.Load()
		s.tokens = append(s.tokens, s.plan.tokens[g])
		e.stats.GeneratedTokens++
		if g == 0 {
			s.ttft = e.vnow - s.arrival
			e.ttftHist.observe(s.ttft.Seconds())
			e.prefillHist.observe((s.ttft - s.queueTime).Seconds())
		}
		if int(g+1) == len(s.plan.tokens) {
			s.state = seqFinished
			s.e2e = e.vnow - s.arrival
			e.cache.release(s)
			e.stats.Finished++
			finished = true
			s.generated.Store(g + 1)
			s.done.Store(true)
		} else {
			s.generated.Store(g + 1)
		}
		s.signal()
	}
	if finished {
		kept := e.running[:0]
		for _, s := range e.running {
			if s.state == seqRunning {
				kept = append(kept, s)
			}
		}
		clear(e.running[len(kept):])
		e.running = kept
	}
	e.sched = e.sched[:0]
}
