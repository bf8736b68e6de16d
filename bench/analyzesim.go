package bench

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/scoring/blockindex"
	"github.com/warmpath/warmpath/session"
)

// binding is a session's binding as the gateway's session store holds it,
// built and checked by the same rules (session.After, Live, StillHeld,
// Completed). Its block keys are the analyzer's: a block's dense id plus
// one (simInput.approxKeys), so TipKey-1 is the tip's dense id. The
// analyzer fingerprints no text (TextLen stays 0): every turn of a
// session continues it (Input.Continues stays true).
type binding struct {
	session.Binding
	// done is when the session's last turn finished, simulated seconds:
	// the pause before the next turn is measured from it. The gateway
	// measures it from Updated, which it restamps when a turn completes;
	// the analyzer's Updated is the time of the plan's last write (see
	// remember).
	done float64
}

// epoch anchors the simulated clock for scoring.Input.Now.
var epoch = time.Unix(0, 0)

// simulate replays in through pol on a fresh fleet whose replicas cache
// cacheBlocks blocks each. Each request is routed by the gateway's own
// decision (scoring.Decide), with the simulated replicas as its
// endpoints: gather, decide, match the prefix when asked, decide again.
func simulate(ctx context.Context, pol *scoring.Policy, cacheBlocks int, in *simInput, fl *simFleet, seed int64) (AnalyzeResult, error) {
	s, err := newSimRun(pol, cacheBlocks, in, fl, seed)
	if err != nil {
		return AnalyzeResult{Policy: pol.Name, CacheBlocks: cacheBlocks}, err
	}
	for i := range in.reqs {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return s.res, fmt.Errorf("bench: analyze: %w", err)
			}
		}
		if err := s.step(i); err != nil {
			return s.res, err
		}
	}
	s.summarize()
	return s.res, nil
}

// simRun is the state of one simulated run: one policy on one fleet at
// one cache size, over every request of the trace.
type simRun struct {
	pol    *scoring.Policy
	in     *simInput
	fl     *simFleet
	names  []string // the replicas' endpoint ids, by index
	rng    *rand.Rand
	approx *blockindex.Approx // nil unless pol.UsesApprox
	sat    scoring.Saturation
	cal    *scoring.Calibrator
	// pending holds the estimates whose first token is not due yet.
	pending  observationHeap
	bindings map[string]binding
	// last holds the replica each session's previous request went to.
	last map[string]int
	// eps, matched, matchedCPU and hits are scratch, reused per request.
	eps                 []scoring.Endpoint
	matched, matchedCPU []int
	hits                []blockindex.Hit
	// delays and ttfts hold each request's wait before its prefill and
	// its TTFT, seconds; errs each estimate's relative error.
	delays, ttfts, errs []float64
	// sticky and saturated count requests routed by the sticky fast path
	// and to a saturated replica.
	sticky, saturated int64
	res               AnalyzeResult
}

// newSimRun empties fl, sizes its caches to cacheBlocks and returns a run
// of pol over in, its tie-breaks seeded by seed.
func newSimRun(pol *scoring.Policy, cacheBlocks int, in *simInput, fl *simFleet, seed int64) (*simRun, error) {
	fl.reset(cacheBlocks)
	n := len(fl.reps)
	s := &simRun{
		pol:        pol,
		in:         in,
		fl:         fl,
		names:      make([]string, n),
		rng:        rand.New(rand.NewPCG(uint64(seed), 0x7761726d70617468)), // "warmpath"
		sat:        scoring.Saturation{}.WithDefaults(),
		cal:        scoring.NewCalibrator(analyzeCost(fl.reps[0].rate)),
		bindings:   map[string]binding{},
		last:       map[string]int{},
		eps:        make([]scoring.Endpoint, n),
		matched:    make([]int, n),
		matchedCPU: make([]int, n),
		delays:     make([]float64, len(in.reqs)),
		ttfts:      make([]float64, len(in.reqs)),
		res:        AnalyzeResult{Policy: pol.Name, CacheBlocks: cacheBlocks},
	}
	for j := range s.names {
		s.names[j] = "replica-" + strconv.Itoa(j)
	}
	if pol.UsesApprox {
		a, err := blockindex.NewApprox(blockindex.ApproxConfig{Capacity: cacheBlocks})
		if err != nil {
			return nil, fmt.Errorf("bench: analyze: %w", err)
		}
		s.approx = a
	}
	return s, nil
}

// step routes request i at its arrival and simulates it on the chosen
// replica.
func (s *simRun) step(i int) error {
	now := s.in.arrival[i]
	s.observeDue(now)
	s.gather(now)
	din, b := s.input(i, now)
	plan, err := s.decide(i, &din, now)
	if err != nil {
		return fmt.Errorf("bench: analyze: route request %d: %w", i, err)
	}
	chosen, predicted := plan.Chosen(), plan.Predicted[0]
	s.record(i, &plan, chosen, *b, din.Now, now)
	bound, held := s.boundHeld(i, &plan, b)
	cached := s.serve(i, &plan, chosen, predicted, now)
	if bound >= 0 {
		s.res.addRebindCost(plan.Rebind, bound != chosen, held, cached)
	}
	return nil
}

// boundHeld returns, for a plan that rebinds the session off its bound
// replica, that replica's index and the tokens of request i it still
// holds (both tiers), before the request is served; -1 and 0 otherwise.
func (s *simRun) boundHeld(i int, plan *scoring.Plan, b *binding) (int, int) {
	if plan.Rebind == "" || b.Replica == "" {
		return -1, 0
	}
	j := slices.Index(s.names, b.Replica)
	if j < 0 {
		return -1, 0
	}
	held, _ := s.fl.reps[j].hit(s.in.ids[i], s.in.reqs[i].InputTokens, s.in.blockTokens)
	return j, held
}

// observeDue hands the calibrator every estimate whose first token is due
// by now: the gateway learns a request's TTFT when its first token
// arrives.
func (s *simRun) observeDue(now float64) {
	for len(s.pending) > 0 && s.pending[0].at <= now {
		o := heap.Pop(&s.pending).(observation)
		s.cal.Observe(analyzeModel, o.est, o.ttft)
	}
}

// gather advances every replica to now and describes it as an endpoint.
func (s *simRun) gather(now float64) {
	for j, rp := range s.fl.reps {
		rp.advance(now)
		s.eps[j] = rp.endpoint(s.names[j], s.sat, now, s.in.blockTokens)
	}
}

// input returns request i's decision input at now and its session's live
// binding (the zero binding when there is none), which the input's
// Binding points into. For policies that estimate, it first records the
// turn and the pause before it in the calibrator's conversation
// statistics.
func (s *simRun) input(i int, now float64) (scoring.Input, *binding) {
	r, key := &s.in.reqs[i], s.in.sessions[i]
	din := scoring.Input{
		Now: epoch.Add(time.Duration(now * float64(time.Second))), Model: analyzeModel, SessionKey: key,
		Endpoints: s.eps, PromptTokens: r.InputTokens, BlockSize: s.in.blockTokens, RefreshAfter: sessionTTL / 8,
		Continues: true, BoundHolds: true, Rand: s.rng, Cost: s.cal.Cost(analyzeModel),
	}
	b := new(binding)
	var bound bool
	*b, bound = lookup(s.bindings, s.pol, key, din.Now)
	if bound {
		din.Binding = &b.Binding.Binding
		// The simulated index is perfectly synchronised: every
		// replica's evictions are seen, so none is trusted blindly as
		// the gateway trusts a replica that publishes no KV events.
		rp := s.fl.reps[slices.Index(s.names, b.Replica)]
		din.BoundHolds = b.StillHeld(func(tip uint64) bool { return rp.holds(int32(tip - 1)) })
		din.BoundOnCPU = din.BoundHolds && b.TipDepth > 0 && !rp.cache.contains(int32(b.TipKey-1))
	}
	if s.pol.Estimated && key != "" {
		turn := 1
		if bound {
			turn = b.Turns + 1
		}
		s.cal.ObserveTurn(analyzeModel, turn, now-b.done)
		st := s.cal.Sessions(analyzeModel)
		din.Sessions = &st
	}
	return din, b
}

// decide runs the policy on request i's input and, when the plan asks
// for the prefix the replicas hold, answers it and decides again.
func (s *simRun) decide(i int, din *scoring.Input, now float64) (scoring.Plan, error) {
	plan, err := s.pol.Decide(din)
	if err != nil || !plan.NeedsPrefix {
		return plan, err
	}
	din.Matched = matchPrefix(s.pol, s.fl, s.approx, s.in, i, s.names, s.matched, &s.hits)
	din.MatchedCPU = matchCPU(s.pol, s.fl, s.in, i, s.matched, s.matchedCPU)
	if s.pol.Estimated {
		din.Sharers = s.cal.ObservePrefix(analyzeModel, scoring.HeldPrefix(din.Matched, din.MatchedCPU, s.in.approxKeys[i], s.in.blockTokens), scoring.SessionID(din.SessionKey), now)
	}
	return s.pol.Decide(din)
}

// record books the plan for request i, which chose replica chosen at now
// (at on the gateway's clock) with the session's binding b: the
// approximate index learns a scored placement, the binding is rewritten,
// and the sticky, rebind and saturated counts grow.
func (s *simRun) record(i int, plan *scoring.Plan, chosen int, b binding, at time.Time, now float64) {
	r, bt := &s.in.reqs[i], s.in.blockTokens
	if s.approx != nil && plan.Reason == scoring.ReasonScored {
		s.approx.Record(s.names[chosen], s.in.approxKeys[i])
	}
	if plan.Reason == scoring.ReasonSticky {
		s.sticky++
	}
	if plan.Rebind != "" {
		s.res.addRebind(plan.Rebind)
	}
	// s.ttfts[i] is still 0 here (serve computes it next), so the
	// binding's done is the turn's arrival plus its decode time, without
	// its wait and prefill: kept as it was when simulate was split.
	done := now + s.ttfts[i] + float64(r.OutputTokens)*decodeTokenTime.Seconds()
	remember(s.bindings, s.in.sessions[i], plan, b, s.in.approxKeys[i], r.InputTokens/bt, bt, at, done)
	if s.eps[chosen].Saturated {
		s.saturated++
	}
}

// serve simulates request i at now on the chosen replica, which the
// router believed held predicted tokens of it: its cache hit, its wait
// and prefill, and, when the plan carried one, its estimate's error. It
// returns the tokens found cached.
func (s *simRun) serve(i int, plan *scoring.Plan, chosen, predicted int, now float64) (cached int) {
	r, ids, bt := &s.in.reqs[i], s.in.ids[i], s.in.blockTokens
	rp := s.fl.reps[chosen]
	cached, cpu := rp.hit(ids, r.InputTokens, bt)
	rp.touch(ids)
	work := r.InputTokens - cached + loadCost(cpu)
	s.delays[i] = rp.admit(now, ids, work, max(0, r.InputTokens-predicted), (r.OutputTokens+bt-1)/bt, float64(r.OutputTokens)*decodeTokenTime.Seconds())
	s.ttfts[i] = s.delays[i] + float64(work)/rp.rate

	rp.advance(now)
	s.res.CachedTokens += int64(cached)
	s.res.CPUCachedTokens += int64(cpu)
	s.res.PredictedTokens += int64(predicted)
	s.countTurn(s.in.sessions[i], chosen, r.InputTokens, cached)
	if plan.Estimates != nil {
		s.estimated(i, plan, chosen, cached, now)
	}
	return cached
}

// countTurn adds a request of session key, routed to replica chosen,
// with prompt tokens of which cached were cached, to the result's Turns.
func (s *simRun) countTurn(key string, chosen, prompt, cached int) {
	kind := "first"
	if prev, ok := s.last[key]; ok && key != "" {
		kind = "moved"
		if prev == chosen {
			kind = "stayed"
		}
	}
	if key != "" {
		s.last[key] = chosen
	}
	if s.res.Turns == nil {
		s.res.Turns = map[string]TurnStat{}
	}
	t := s.res.Turns[kind]
	t.Requests++
	t.PromptTokens += int64(prompt)
	t.CachedTokens += int64(cached)
	s.res.Turns[kind] = t
}

// estimated queues the plan's estimate for request i for the calibrator,
// due when its first token is, records its error, and keeps it as one of
// the result's sampled predictions when i is evenly spaced.
func (s *simRun) estimated(i int, plan *scoring.Plan, chosen, cached int, now float64) {
	est, ttft := plan.Estimates[0], s.ttfts[i]
	heap.Push(&s.pending, observation{at: now + ttft, est: est, ttft: ttft})
	s.errs = append(s.errs, math.Abs(est.TTFT-ttft)/max(ttft, 1e-3))

	if k := len(s.in.reqs) / predictionSamples; k > 0 && i%k == k/2 && len(s.res.Predictions) < predictionSamples {
		s.res.Predictions = append(s.res.Predictions, Prediction{Request: i, Replica: s.names[chosen], Reason: plan.Reason,
			QueuedTokens: est.QueuedTokens, UncachedTokens: est.UncachedTokens, CachedTokens: cached,
			EstimatedSeconds: est.TTFT, SimulatedSeconds: ttft})
	}
}

// summarize fills the result's fractions, imbalance, waits, TTFTs and
// estimate errors from what the run measured.
func (s *simRun) summarize() {
	res := &s.res
	var prompt int64
	for i := range s.in.reqs {
		prompt += int64(s.in.reqs[i].InputTokens)
	}
	res.CachedFraction = ratio(res.CachedTokens, prompt)
	res.CPUFraction = ratio(res.CPUCachedTokens, prompt)
	res.ReplicaPrefillTokens, res.Imbalance = s.fl.prefillSpread()
	delays := s.delays
	slices.Sort(delays)
	var total float64
	for _, d := range delays {
		total += d
	}
	res.MeanQueueSeconds = total / float64(len(delays))
	res.P99QueueSeconds = delays[int(math.Ceil(0.99*float64(len(delays))))-1]
	res.MaxQueueSeconds = delays[len(delays)-1]
	slices.Sort(s.ttfts)
	res.TTFTP50Seconds, res.TTFTP90Seconds, res.TTFTP99Seconds = percentile(s.ttfts, 50), percentile(s.ttfts, 90), percentile(s.ttfts, 99)
	if len(s.errs) > 0 {
		slices.Sort(s.errs)
		res.Estimated = int64(len(s.errs))
		res.EstimateErrorP50, res.EstimateErrorP90 = percentile(s.errs, 50), percentile(s.errs, 90)
	}
	n := float64(len(s.in.reqs))
	res.SaturatedShare = float64(s.saturated) / n
	res.StickyShare = float64(s.sticky) / n
}

// analyzeCost is the TTFT model of a simulated replica: a FIFO of prefill
// at rate tokens per second, with no step overhead and no decode
// interference.
func analyzeCost(rate float64) scoring.Cost {
	return scoring.Cost{PrefillPerToken: 1 / rate, StepTokens: math.MaxInt32, TokenScale: 1, StepScale: 1}
}

// lookup returns the session's live binding, as the gateway's session
// store would (session.Binding.Live: it expires sessionTTL after its last
// write), for policies that bind the session (scoring.Policy.Binds).
func lookup(bindings map[string]binding, pol *scoring.Policy, key string, now time.Time) (binding, bool) {
	if !pol.Binds(key) {
		return binding{}, false
	}
	b, ok := bindings[key]
	if ok && !b.Live(now, sessionTTL) {
		delete(bindings, key)
		return binding{}, false
	}
	return b, ok
}

// matchPrefix answers the plan's request for prefix information: precise
// policies see the replicas' LRUs exactly (a perfectly synchronised
// KV-event index), approximate ones their approximate index; both capped
// at the prompt's length minus one, as the gateway's indexes are.
func matchPrefix(pol *scoring.Policy, fl *simFleet, approx *blockindex.Approx, in *simInput, i int, names []string, matched []int, hits *[]blockindex.Hit) []int {
	r := &in.reqs[i]
	bt := in.blockTokens
	switch {
	case pol.UsesPrecise:
		for j, rp := range fl.reps {
			matched[j] = min(rp.cache.prefix(in.ids[i])*bt, max(0, r.InputTokens-1))
		}
	case pol.UsesApprox:
		*hits = approx.Match(in.approxKeys[i], names, *hits)
		for j, h := range *hits {
			matched[j] = min(h.Blocks*bt, max(0, r.InputTokens-1))
		}
	}
	return matched
}

// remember writes the binding the plan leaves behind, by the gateway's
// rule (session.After, as its commit step): keys are the turn's block
// keys, of which the first fullBlocks are full. A scored turn's tip is its
// last full block: the gateway's keys cover full blocks only, so a
// partial last block (Mooncake) is not repeated by the conversation's
// next turn.
//
// What the analyzer does differently, on purpose: the gateway records
// what a sticky turn left cached when its response ends
// (rememberCompleted) and stamps Updated then, renewing the TTL; the
// analyzer records it at the decision, counting the prompt's full blocks
// and no output (its simulated replicas cache prompt blocks only), and
// stamps Updated only when the plan writes (BindRefresh, BindNew,
// BindReplace), so a sticky turn that needs no refresh leaves the TTL
// running from the last write.
func remember(bindings map[string]binding, key string, plan *scoring.Plan, b binding, keys []uint64, fullBlocks, bt int, now time.Time, done float64) {
	nb, ok := session.After(plan, b.Binding, keys[:min(len(keys), fullBlocks)])
	if !ok {
		return
	}
	if plan.Reason == scoring.ReasonSticky {
		nb.Completed(nb.Replica, fullBlocks*bt, 0)
	}
	if plan.Bind != scoring.BindKeep {
		nb.Updated = now
	}
	bindings[key] = binding{Binding: nb, done: done}
}

// addRebindCost counts a rebind for reason: whether it moved the session
// off its bound replica, the tokens that replica still held and those
// found cached where the request went.
func (r *AnalyzeResult) addRebindCost(reason string, moved bool, held, cached int) {
	if r.RebindCost == nil {
		r.RebindCost = map[string]RebindStat{}
	}
	c := r.RebindCost[reason]
	c.Rebinds++
	if moved {
		c.Moved++
	}
	c.HeldTokens += int64(held)
	c.CachedTokens += int64(cached)
	r.RebindCost[reason] = c
}

func (r *AnalyzeResult) addRebind(reason string) {
	if r.Rebinds == nil {
		r.Rebinds = map[string]int64{}
	}
	r.Rebinds[reason]++
}
