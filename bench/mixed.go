package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/warmpath/warmpath/gateway"
	"github.com/warmpath/warmpath/gateway/admission"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/tenancy/fairq"
	"github.com/warmpath/warmpath/vllmsim"
)

// The parts of a mixed-tenants run, in the order run. The three policies
// are the gateway's: fifo has no gateway queue (the engines see arrival
// order), strict and fair are the queue's policies.
const (
	partNoBurst = "no-burst"
	partFIFO    = "fifo"
	partStrict  = "strict"
	partFair    = "fair"
	partShares  = "shares"
)

// mixedParts are the part names, for Config.Parts.
var mixedParts = []string{partNoBurst, partFIFO, partStrict, partFair, partShares}

// idleKVUsage is the KV use below which a replica with an empty queue
// and a batch below MaxNumSeqs counts as having idle capacity: it could
// start another turn of the workload at once.
const idleKVUsage = 0.9

// MixedReport is a mixed-tenants run: the policies side by side, each
// interactive p99 against the no-burst run's, and the weighted shares.
// Its JSON form is the issue's:
//
//	{"workload": "mixed-tenants", "no_burst_interactive_ttft_p99_ms": f,
//	 "results": [{"policy": "fifo|strict|fair", "interactive_ttft_p50_ms": f,
//	 "interactive_ttft_p99_ms": f, "background_turns": n,
//	 "background_output_tokens_per_s": f, "output_tokens_per_s": f,
//	 "errors": n, …}], …}
//
// with the further fields below.
type MixedReport struct {
	Workload string `json:"workload"`
	// NoBurst is A alone, on the same fleet and seed.
	NoBurstInteractiveTTFTP50Ms float64 `json:"no_burst_interactive_ttft_p50_ms"`
	NoBurstInteractiveTTFTP99Ms float64 `json:"no_burst_interactive_ttft_p99_ms"`
	// NoBurstEngineTTFTP99Ms and NoBurstOverheadP99Ms are the no-burst
	// run's as MixedResult's InteractiveEngineTTFTP99Ms and
	// InteractiveOverheadP99Ms.
	NoBurstEngineTTFTP99Ms float64       `json:"no_burst_interactive_engine_ttft_p99_ms"`
	NoBurstOverheadP99Ms   float64       `json:"no_burst_interactive_overhead_p99_ms"`
	NoBurstGatewayP99Ms    float64       `json:"no_burst_interactive_gateway_p99_ms"`
	NoBurstPhases          PhasesP99     `json:"no_burst_interactive_gateway_phases"`
	Results                []MixedResult `json:"results"`
	// Shares is the shares part: each tenant's share of the contested
	// dispatches (made while every tenant had a request waiting) against
	// its weight's share.
	Shares []TenantShare `json:"shares,omitempty"`
	// Gateways is how many gateways shared the run (and its counters).
	Gateways int     `json:"gateways"`
	Config   []Param `json:"config"`
	Params   []Param `json:"params"`
	Wall     float64 `json:"wall_s"`
}

// MixedResult is one policy's figures; times in simulated milliseconds,
// rates per simulated second, output tokens counted full-size.
type MixedResult struct {
	Policy               string  `json:"policy"`
	InteractiveTTFTP50Ms float64 `json:"interactive_ttft_p50_ms"`
	InteractiveTTFTP99Ms float64 `json:"interactive_ttft_p99_ms"`
	// BackgroundTurns is the background turns completed.
	BackgroundTurns int `json:"background_turns"`
	// BackgroundOutputTokensPerS divides the background output by the
	// span from the first background send to the last background
	// completion; OutputTokensPerS all output by the whole run's.
	BackgroundOutputTokensPerS float64 `json:"background_output_tokens_per_s"`
	OutputTokensPerS           float64 `json:"output_tokens_per_s"`
	Errors                     int     `json:"errors"`
	// InteractiveP99VsNoBurst is InteractiveTTFTP99Ms ÷ the no-burst
	// run's.
	InteractiveP99VsNoBurst float64 `json:"interactive_ttft_p99_vs_no_burst"`
	// LongestIdleWaitMs is the longest stretch during which a request
	// waited in the gateway's queue while, without a break, some replica
	// had idle capacity (an empty engine queue, a batch below
	// max_num_seqs, KV use below 0.9), from engine samples every 100
	// simulated ms.
	LongestIdleWaitMs float64 `json:"longest_idle_wait_ms"`
	// LongestOwnIdleWaitMs is the same counting only the replica each
	// request was then routed to (the queue's own rule: it dispatches a
	// request when the replica its routing chooses has room).
	LongestOwnIdleWaitMs float64 `json:"longest_idle_wait_own_replica_ms"`
	// InteractiveRequests counts the interactive turns completed;
	// Queued the requests that waited in the gateway's queue.
	InteractiveRequests int `json:"interactive_requests"`
	Queued              int `json:"queued_requests"`
	// InteractiveQueueP99Ms is the p99 of the interactive turns' wait in
	// the gateway's queue, and InteractiveEngineTTFTP99Ms of their TTFT
	// as the engines measured it (from when the engine saw the request):
	// where the interactive p99 comes from.
	InteractiveQueueP99Ms      float64 `json:"interactive_queue_wait_p99_ms"`
	InteractiveEngineTTFTP99Ms float64 `json:"interactive_engine_ttft_p99_ms"`
	// InteractiveOverheadP99Ms is the p99 of the rest of each interactive
	// turn's TTFT (TTFT − queue wait − engine TTFT): the gateway's own
	// work (parse, routing, its Redis calls), the HTTP legs and the
	// host's scheduling of the load generator, gateway and simulator.
	InteractiveOverheadP99Ms float64 `json:"interactive_overhead_p99_ms"`
	// InteractiveGatewayP99Ms is the p99 of the gateway's own part of it
	// (Server-Timing's prepare and route: routing's work before and after
	// admission, queue wait excluded); the rest of the overhead is the
	// HTTP legs and the host.
	InteractiveGatewayP99Ms float64 `json:"interactive_gateway_p99_ms"`
	// InteractivePhases is the p99 of each of the gateway's phases before
	// the send (Server-Timing), apart: which of them the gateway's part is.
	InteractivePhases PhasesP99 `json:"interactive_gateway_phases"`
}

// PhasesP99 is the p99 of each of the gateway's phases before it sends a
// request (Server-Timing), simulated ms: prepare (the session lookup, the
// tokenizer call, the prefix match), admission (the Server-Timing queue
// phase: the queue's wait and its own work, its locks and the dispatches
// it runs on arrival) and route (the decision and its Redis write).
// PrepareStickyMs and PrepareScoredMs are prepare's p99 over the turns
// routed sticky (no tokenizer call; a session lookup unless the local
// binding is trusted) and over the rest (first turns and rebinds: the
// tokenizer call to a replica and the prefix match).
type PhasesP99 struct {
	PrepareMs       float64 `json:"prepare_p99_ms"`
	AdmissionMs     float64 `json:"admission_p99_ms"`
	RouteMs         float64 `json:"route_p99_ms"`
	PrepareStickyMs float64 `json:"prepare_sticky_p99_ms"`
	PrepareScoredMs float64 `json:"prepare_scored_p99_ms"`
}

// TenantShare is one tenant's share of contested dispatches.
type TenantShare struct {
	Tenant        string  `json:"tenant"`
	Weight        int     `json:"weight"`
	WeightShare   float64 `json:"weight_share"`
	DispatchShare float64 `json:"dispatch_share"`
	Dispatches    int     `json:"contested_dispatches"`
}

// mixedPart is one part of the run: which sessions, which queue.
type mixedPart struct {
	name     string
	chatOnly bool
	queue    admission.Config
}

// runMixed runs mixed-tenants: its four parts and the shares part, each
// on a fresh fleet, Redis and gateways, with the engines under priority
// scheduling throughout (fifo sends no priority, so they serve it first
// come, first served).
func runMixed(ctx context.Context, cfg Config, mt *MixedTenants, env Env, profile vllmsim.Profile, rep *Report) error {
	policy := scoring.PolicyWarmpath
	if len(cfg.Policies) == 1 {
		policy = cfg.Policies[0]
	}
	fair := admission.Config{Policy: fairq.PolicyFair, VLLMPriority: true}
	strict := admission.Config{Policy: fairq.PolicyStrict, VLLMPriority: true}
	parts := []mixedPart{
		{name: partNoBurst, chatOnly: true, queue: fair},
		{name: partFIFO, queue: admission.Config{Disabled: true}},
		{name: partStrict, queue: strict},
		{name: partFair, queue: fair},
	}
	mr := &MixedReport{Workload: mt.Name(), Gateways: cfg.Gateways, Config: rep.Config, Params: rep.Params}
	total := len(parts)
	if len(cfg.Parts) == 0 || slices.Contains(cfg.Parts, partShares) {
		total++
	}
	if len(cfg.Parts) > 0 {
		parts = slices.DeleteFunc(parts, func(p mixedPart) bool { return !slices.Contains(cfg.Parts, p.name) })
	}
	for i, p := range parts {
		plan, err := mt.Plan(env)
		if err != nil {
			return err
		}
		if p.chatOnly {
			plan.Sessions = slices.DeleteFunc(plan.Sessions, func(s Session) bool { return s.Tenant != tenantChat })
		}
		res, err := runPart(ctx, cfg, p, policy, profile, plan, i, total)
		if err != nil {
			return err
		}
		rep.Results = append(rep.Results, *res)
		r := mixedResult(res, profile.MaxNumSeqs, cfg.Scale)
		if p.name == partNoBurst {
			mr.NoBurstInteractiveTTFTP50Ms, mr.NoBurstInteractiveTTFTP99Ms = r.InteractiveTTFTP50Ms, r.InteractiveTTFTP99Ms
			mr.NoBurstEngineTTFTP99Ms, mr.NoBurstOverheadP99Ms = r.InteractiveEngineTTFTP99Ms, r.InteractiveOverheadP99Ms
			mr.NoBurstGatewayP99Ms, mr.NoBurstPhases = r.InteractiveGatewayP99Ms, r.InteractivePhases
			continue
		}
		if mr.NoBurstInteractiveTTFTP99Ms > 0 {
			r.InteractiveP99VsNoBurst = r.InteractiveTTFTP99Ms / mr.NoBurstInteractiveTTFTP99Ms
		}
		mr.Results = append(mr.Results, r)
	}
	if len(cfg.Parts) > 0 && !slices.Contains(cfg.Parts, partShares) {
		rep.Mixed = mr
		return nil
	}
	plan := mt.SharesPlan(env)
	mr.Params = append(mr.Params, plan.Params...)
	res, err := runPart(ctx, cfg, mixedPart{name: partShares, queue: fair}, policy, profile, plan, len(parts), total)
	if err != nil {
		return err
	}
	rep.Results = append(rep.Results, *res)
	mr.Shares = contestedShares(res.samples, plan.Tenants)
	rep.Mixed = mr
	return nil
}

// runPart runs one part on a fresh simulated fleet.
func runPart(ctx context.Context, cfg Config, p mixedPart, policy string, profile vllmsim.Profile, plan *Plan, i, total int) (*Result, error) {
	pcfg := cfg
	pcfg.scheduling = "priority"
	pcfg.loadEvery = 100 * time.Millisecond
	speed, scale := cfg.Speed, cfg.Scale
	wall := func(d time.Duration) time.Duration { return max(5*time.Millisecond, time.Duration(float64(d)/speed)) }
	pcfg.tweak = func(gc *gateway.Config) {
		q := p.queue
		// The gateway runs on wall-clock time: its queue's periods at
		// their defaults ÷ speed, and the age credit (tokens per second
		// waited) in wall seconds and scaled tokens.
		q.Timeout = wall(fairq.DefaultTimeout)
		q.SyncInterval = wall(fairq.DefaultSyncInterval)
		q.RecheckInterval = wall(fairq.DefaultRecheckInterval)
		q.Saturation.ReserveIdle = wall(admission.DefaultReserveIdle)
		q.AgeCredit = fairq.DefaultAgeCredit * scale * speed
		gc.Queue = q
		if cfg.tweak != nil {
			cfg.tweak(gc)
		}
	}
	pr := &progress{w: cfg.Progress, policy: p.name, index: i, total: total, planned: plan.Sessions[len(plan.Sessions)-1].Start}
	res, err := runSimulated(ctx, pcfg, policy, profile, plan, pr)
	pr.finish()
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", p.name, err)
	}
	res.Policy = p.name
	for i := range res.samples {
		res.samples[i].messages, res.samples[i].tools = nil, nil // no ceiling here
	}
	return res, nil
}

// mixedResult computes a part's figures from its samples.
func mixedResult(res *Result, maxSeqs int, scale float64) MixedResult {
	r := MixedResult{Policy: res.Policy, OutputTokensPerS: res.OutputTokensPerS, Errors: res.Errors}
	var ttft, qwait, eng, over, gw, prep, adm, route, prepSticky, prepScored []float64
	var bgTokens int64
	var bgFirst, bgLast time.Duration = -1, 0
	for i := range res.samples {
		s := &res.samples[i]
		if s.queueWait > 0 {
			r.Queued++
		}
		if !s.ok() || s.warmup {
			continue
		}
		switch s.class {
		case classInteractive:
			ttft = append(ttft, msOf(s.ttft))
			qwait = append(qwait, msOf(s.queueWait))
			if s.engineTTFT >= 0 {
				eng = append(eng, msOf(s.engineTTFT))
				over = append(over, msOf(s.ttft-s.queueWait-s.engineTTFT))
			}
			if s.gatewayWork >= 0 {
				gw = append(gw, msOf(s.gatewayWork))
			}
			if t := s.timing; t != nil {
				prep, adm, route = append(prep, msOf(t.prepare)), append(adm, msOf(t.queue)), append(route, msOf(t.route))
				if s.reason == "sticky" {
					prepSticky = append(prepSticky, msOf(t.prepare))
				} else {
					prepScored = append(prepScored, msOf(t.prepare))
				}
			}
		case classBackground:
			r.BackgroundTurns++
			bgTokens += int64(s.outputTokens)
			if bgFirst < 0 || s.start < bgFirst {
				bgFirst = s.start
			}
			bgLast = max(bgLast, s.end)
		}
	}
	for _, v := range [][]float64{ttft, qwait, eng, over, gw, prep, adm, route, prepSticky, prepScored} {
		slices.Sort(v)
	}
	r.InteractivePhases = PhasesP99{finiteOr0(percentile(prep, 99)), finiteOr0(percentile(adm, 99)), finiteOr0(percentile(route, 99)),
		finiteOr0(percentile(prepSticky, 99)), finiteOr0(percentile(prepScored, 99))}
	r.InteractiveQueueP99Ms, r.InteractiveEngineTTFTP99Ms = finiteOr0(percentile(qwait, 99)), finiteOr0(percentile(eng, 99))
	r.InteractiveOverheadP99Ms, r.InteractiveGatewayP99Ms = finiteOr0(percentile(over, 99)), finiteOr0(percentile(gw, 99))
	r.InteractiveRequests = len(ttft)
	r.InteractiveTTFTP50Ms, r.InteractiveTTFTP99Ms = finiteOr0(percentile(ttft, 50)), finiteOr0(percentile(ttft, 99))
	if bgFirst >= 0 && bgLast > bgFirst {
		r.BackgroundOutputTokensPerS = float64(bgTokens) / scale / (bgLast - bgFirst).Seconds()
	}
	r.LongestIdleWaitMs = msOf(longestIdleWait(res.samples, res.Load, res.loadNames, maxSeqs, admission.DefaultReserveIdle, false))
	r.LongestOwnIdleWaitMs = msOf(longestIdleWait(res.samples, res.Load, res.loadNames, maxSeqs, admission.DefaultReserveIdle, true))
	return r
}

// longestIdleWait returns the longest stretch of time during which a
// request waited in the gateway's queue while some replica had idle
// capacity for its class without a break, by the engine samples (a
// sample's state holds until the next one); names are the replicas'
// names in the samples' order. Each stretch is bounded by how fast the
// gateway notices room: a scrape, a finished request or a recheck. With
// own, only the replica the request was then routed to counts: the queue
// dispatches a request when the replica its routing chooses has room, so
// a wait beside another idle replica is one the routing decision chose
// (staying on its replica beat moving), and one beside its own is room
// the queue missed.
//
// Idle capacity is what the gateway could have used and did not: an
// idle engine (idleReplica) with no request on its way to it (dispatched
// from the queue, not yet seen by the engine: being routed), and, for a
// background request, not one the gateway keeps for interactive turns
// (reserveSpans).
func longestIdleWait(samples []sample, load []LoadSample, names []string, maxSeqs int, reserveIdle time.Duration, own bool) time.Duration {
	index := make(map[string]int, len(names))
	for i, n := range names {
		index[n] = i
	}
	transit := make([][]span, len(names))
	for i := range samples {
		s := &samples[i]
		j, ok := index[s.replica]
		if !ok || !s.ok() || s.engineTTFT < 0 {
			continue
		}
		from, to := (s.start + s.queueWait).Seconds(), (s.start + s.ttft - s.engineTTFT).Seconds()
		if to > from {
			transit[j] = append(transit[j], span{from, to})
		}
	}
	reserved := reserveSpans(samples, index, reserveIdle)
	// stretches are the maximal idle stretches for class c (0 interactive,
	// 1 background) of any replica (only < 0) or of replica only, in order.
	cache := map[[2]int][]span{}
	stretches := func(c, only int) []span {
		if sp, ok := cache[[2]int{c, only}]; ok {
			return sp
		}
		var out []span
		for i := 0; i+1 < len(load); i++ {
			l := &load[i]
			free := func(j int) bool {
				if only >= 0 && j != only {
					return false
				}
				return j >= len(names) || !covers(transit[j], l.T) && (c == 0 || !covers(reserved[j], l.T))
			}
			if !idleReplica(*l, maxSeqs, free) {
				continue
			}
			if n := len(out); n > 0 && out[n-1].to == l.T {
				out[n-1].to = load[i+1].T
			} else {
				out = append(out, span{l.T, load[i+1].T})
			}
		}
		cache[[2]int{c, only}] = out
		return out
	}
	var longest float64
	for i := range samples {
		s := &samples[i]
		if s.queueWait <= 0 {
			continue
		}
		c, only := 0, -1
		if s.class == classBackground {
			c = 1
		}
		if own {
			j, ok := index[s.replica]
			if !ok {
				continue
			}
			only = j
		}
		sp := stretches(c, only)
		from, to := s.start.Seconds(), (s.start + s.queueWait).Seconds()
		k := sort.Search(len(sp), func(k int) bool { return sp[k].to > from })
		for ; k < len(sp) && sp[k].from < to; k++ {
			longest = max(longest, min(to, sp[k].to)-max(from, sp[k].from))
		}
	}
	return time.Duration(longest * float64(time.Second))
}

// span is an interval of simulated seconds.
type span struct{ from, to float64 }

// covers reports whether one of spans holds t.
func covers(spans []span, t float64) bool {
	for _, sp := range spans {
		if sp.from <= t && t < sp.to {
			return true
		}
	}
	return false
}

// reserveSpans mirrors the gateway's interactive reserve
// (queue.saturation.interactive_reserve at its default, reserve_idle
// reserveIdle in simulated time): per replica, when it was kept from
// background requests. A replica joins when an interactive request is
// dispatched to it while fewer are reserved (never all), and leaves
// reserveIdle after the last one.
func reserveSpans(samples []sample, index map[string]int, reserveIdle time.Duration) [][]span {
	out := make([][]span, len(index))
	limit := min(admission.DefaultInteractiveReserve, len(index)-1)
	var inter []*sample
	for i := range samples {
		if s := &samples[i]; s.class == classInteractive && s.ok() {
			if _, ok := index[s.replica]; ok {
				inter = append(inter, s)
			}
		}
	}
	sort.Slice(inter, func(a, b int) bool { return inter[a].start+inter[a].queueWait < inter[b].start+inter[b].queueWait })
	idle := reserveIdle.Seconds()
	last := map[int]float64{} // members: replica → last interactive dispatch
	for _, s := range inter {
		at, j := (s.start + s.queueWait).Seconds(), index[s.replica]
		for m, t := range last {
			if at-t >= idle {
				out[m][len(out[m])-1].to = t + idle
				delete(last, m)
			}
		}
		if _, ok := last[j]; !ok {
			if len(last) >= limit {
				continue
			}
			out[j] = append(out[j], span{from: at})
		}
		last[j] = at
	}
	for m, t := range last {
		out[m][len(out[m])-1].to = t + idle
	}
	return out
}

// idleReplica reports whether some replica of the sample that free
// allows could start a request at once.
func idleReplica(l LoadSample, maxSeqs int, free func(int) bool) bool {
	for i := range l.Waiting {
		if l.Waiting[i] == 0 && l.Running[i] < maxSeqs && l.KVUsage[i] < idleKVUsage && free(i) {
			return true
		}
	}
	return false
}

// contestedShares returns each tenant's share of the contested
// dispatches: requests that left the gateway's queue while every other
// tenant had a request waiting in it (so the queue chose between them).
func contestedShares(samples []sample, tenants []Tenant) []TenantShare {
	type span struct{ from, to time.Duration }
	waits := map[string][]span{}
	for i := range samples {
		s := &samples[i]
		if s.queueWait > 0 {
			waits[s.tenant] = append(waits[s.tenant], span{s.start, s.start + s.queueWait})
		}
	}
	waiting := func(tenant string, at time.Duration) bool {
		for _, w := range waits[tenant] {
			if w.from < at && at < w.to {
				return true
			}
		}
		return false
	}
	count := map[string]int{}
	all := 0
	var weights int
	for _, t := range tenants {
		weights += t.Weight
	}
	for _, t := range tenants {
		for _, w := range waits[t.ID] {
			contested := true
			for _, o := range tenants {
				if o.ID != t.ID && !waiting(o.ID, w.to) {
					contested = false
					break
				}
			}
			if contested {
				count[t.ID]++
				all++
			}
		}
	}
	out := make([]TenantShare, len(tenants))
	for i, t := range tenants {
		out[i] = TenantShare{Tenant: t.ID, Weight: t.Weight, WeightShare: float64(t.Weight) / float64(max(1, weights)), Dispatches: count[t.ID]}
		if all > 0 {
			out[i].DispatchShare = float64(count[t.ID]) / float64(all)
		}
	}
	return out
}

// writeTable writes the mixed-tenants table.
func (mr *MixedReport) writeTable(w io.Writer) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "workload %s", mr.Workload)
	for _, p := range mr.Config {
		switch p.Name {
		case "scale", "seed":
			fmt.Fprintf(&b, " · %s %s", p.Name, p.Value)
		case "speed":
			fmt.Fprintf(&b, " · speed %s", strings.Fields(p.Value)[0])
		}
	}
	fmt.Fprintf(&b, " · %d gateway(s) · wall %v\n", mr.Gateways, (time.Duration(mr.Wall * float64(time.Second))).Round(time.Second))
	fmt.Fprintf(&b, "no-burst (tenant a alone): interactive TTFT p50 %s, p99 %s (engine p99 %s, overhead p99 %s, of it gateway p99 %s)\n", fmtMs(mr.NoBurstInteractiveTTFTP50Ms), fmtMs(mr.NoBurstInteractiveTTFTP99Ms),
		fmtMsOrZero(mr.NoBurstEngineTTFTP99Ms), fmtMsOrZero(mr.NoBurstOverheadP99Ms), fmtMsOrZero(mr.NoBurstGatewayP99Ms))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tinteractive TTFT p50\tp99\tp99 vs no-burst\t(queue p99\tengine p99\toverhead p99\tof it gateway p99)\tbg turns\tbg out tok/s\tout tok/s\tqueued\tlongest idle wait\t(own replica)\terrors\t")
	for _, r := range mr.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f×\t%s\t%s\t%s\t%s\t%d\t%.0f\t%.0f\t%d\t%s\t%s\t%d\t\n", r.Policy, fmtMs(r.InteractiveTTFTP50Ms), fmtMs(r.InteractiveTTFTP99Ms),
			r.InteractiveP99VsNoBurst, fmtMsOrZero(r.InteractiveQueueP99Ms), fmtMsOrZero(r.InteractiveEngineTTFTP99Ms), fmtMsOrZero(r.InteractiveOverheadP99Ms), fmtMsOrZero(r.InteractiveGatewayP99Ms), r.BackgroundTurns, r.BackgroundOutputTokensPerS,
			r.OutputTokensPerS, r.Queued, fmtMsOrZero(r.LongestIdleWaitMs), fmtMsOrZero(r.LongestOwnIdleWaitMs), r.Errors)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if mr.NoBurstInteractiveTTFTP99Ms > 0 || len(mr.Results) > 0 {
		fmt.Fprintf(&b, "interactive gateway phases p99 (prepare / admission / route): no-burst %s", mr.NoBurstPhases)
		for _, r := range mr.Results {
			fmt.Fprintf(&b, "; %s %s", r.Policy, r.InteractivePhases)
		}
		b.WriteByte('\n')
	}
	if i := slices.IndexFunc(mr.Results, func(r MixedResult) bool { return r.Policy == partFIFO }); i >= 0 {
		f := mr.Results[i]
		for _, r := range mr.Results {
			if r.Policy != partFIFO && f.BackgroundOutputTokensPerS > 0 {
				fmt.Fprintf(&b, "%s: background output %.0f %% of fifo's\n", r.Policy, 100*r.BackgroundOutputTokensPerS/f.BackgroundOutputTokensPerS)
			}
		}
	}
	if len(mr.Shares) > 0 {
		fmt.Fprintf(&b, "shares (fair, %d gateway(s), two equal background bursts):", mr.Gateways)
		for _, s := range mr.Shares {
			fmt.Fprintf(&b, "  %s weight %d: %.1f %% of %d contested dispatches (weight share %.1f %%)", s.Tenant, s.Weight,
				100*s.DispatchShare, sharesTotal(mr.Shares), 100*s.WeightShare)
		}
		b.WriteByte('\n')
	}
	_, err := w.Write(b.Bytes())
	return err
}

// String renders the p99s as "prepare (sticky, scored) / admission /
// route".
func (p PhasesP99) String() string {
	return fmt.Sprintf("%s (sticky %s, scored %s) / %s / %s", fmtMsOrZero(p.PrepareMs), fmtMsOrZero(p.PrepareStickyMs),
		fmtMsOrZero(p.PrepareScoredMs), fmtMsOrZero(p.AdmissionMs), fmtMsOrZero(p.RouteMs))
}

func sharesTotal(ss []TenantShare) int {
	n := 0
	for _, s := range ss {
		n += s.Dispatches
	}
	return n
}

// fmtMsOrZero is fmtMs, but shows a zero as "0 ms".
func fmtMsOrZero(ms float64) string {
	if ms <= 0 || math.IsNaN(ms) {
		return "0 ms"
	}
	return fmtMs(ms)
}

// writeJSON writes the mixed-tenants document.
func (mr *MixedReport) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(mr)
}
