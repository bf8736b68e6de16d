package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMixedTenantsPlan(t *testing.T) {
	env := Env{Seed: 3, Scale: 0.1, Replicas: 4, KVTokens: 30733}
	mt := &MixedTenants{}
	p, err := mt.Plan(env)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Tenants) != 2 || p.Tenants[1].DefaultClass != classBackground {
		t.Fatalf("tenants %+v", p.Tenants)
	}
	m := mt.withDefaults()
	var chat, runs int
	for i, s := range p.Sessions {
		if i > 0 && s.Start < p.Sessions[i-1].Start {
			t.Fatalf("sessions not sorted at %d", i)
		}
		key := ""
		for _, tn := range p.Tenants {
			if tn.ID == s.Tenant {
				key = "Bearer " + tn.Key()
			}
		}
		if key == "" || s.Header.Get("Authorization") != key {
			t.Fatalf("session %d of tenant %q sends %q", i, s.Tenant, s.Header.Get("Authorization"))
		}
		switch s.Class {
		case classInteractive:
			chat++
			if s.Start >= m.ChatWindow {
				t.Errorf("chat session at %v, after the window", s.Start)
			}
		case classBackground:
			runs++
			if s.Start < m.BurstAt || s.Start > m.BurstAt+m.BurstSpread {
				t.Errorf("burst run at %v, outside [%v, %v]", s.Start, m.BurstAt, m.BurstAt+m.BurstSpread)
			}
		}
	}
	if want := m.BurstRuns / 2; runs != want {
		t.Errorf("%d runs; want %d (per 8 replicas × 4/8)", runs, want)
	}
	if chat < 20 {
		t.Errorf("%d chat sessions", chat)
	}
	// Runs share their opening prefix and differ in their task; a turn
	// carries the previous reply.
	first := firstTurns(t, p)
	var a, b *Turn
	for i := range first {
		if p.Sessions[i].Class == classBackground {
			if a == nil {
				a = &first[i]
			} else if b == nil {
				b = &first[i]
			}
		}
	}
	if a.Messages[0].Content != b.Messages[0].Content || a.Messages[1].Content == b.Messages[1].Content || len(a.Tools) == 0 {
		t.Error("runs do not share the system prompt and tools, or share their task")
	}
	p2, _ := mt.Plan(env)
	second := firstTurns(t, p2)
	for i := range first {
		if first[i].Messages[len(first[i].Messages)-1].Content != second[i].Messages[len(second[i].Messages)-1].Content {
			t.Fatalf("plan not deterministic at session %d", i)
		}
	}
	s := p.Sessions[0].Script
	t0, _ := s.Next(nil)
	t1, ok := s.Next(&Outcome{Reply: "the reply"})
	if !ok || len(t1.Messages) != len(t0.Messages)+2 || t1.Messages[len(t0.Messages)].Content != "the reply" || t1.Delay <= 0 {
		t.Errorf("second turn %+v does not continue the first", t1.Messages)
	}
}

func TestMixedTenantsSharesPlan(t *testing.T) {
	env := Env{Seed: 3, Scale: 0.1, Replicas: 4, KVTokens: 30733}
	p := (&MixedTenants{}).SharesPlan(env)
	n := map[string]int{}
	for _, s := range p.Sessions {
		n[s.Tenant]++
	}
	if len(p.Tenants) != 2 || p.Tenants[0].Weight != 1 || p.Tenants[1].Weight != 3 || n["light"] != n["heavy"] || n["light"] < 10 {
		t.Fatalf("tenants %+v, runs %v", p.Tenants, n)
	}
}

func TestLongestIdleWait(t *testing.T) {
	busy := func(at float64) LoadSample {
		return LoadSample{T: at, Waiting: []int{3, 2}, Running: []int{10, 10}, KVUsage: []float64{0.95, 0.99}}
	}
	idle := func(at float64) LoadSample {
		return LoadSample{T: at, Waiting: []int{3, 0}, Running: []int{10, 4}, KVUsage: []float64{0.95, 0.5}}
	}
	// Replica b is idle from 2 s to 3 s and from 5 s to 5.5 s.
	load := []LoadSample{busy(0), busy(1), idle(2), busy(3), busy(4), idle(5), busy(5.5), busy(10)}
	names := []string{"a", "b"}
	sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
	samples := []sample{
		{start: sec(0.5), queueWait: sec(1)},   // 0.5–1.5: never idle
		{start: sec(2.5), queueWait: sec(3)},   // 2.5–5.5: 0.5 and 0.5
		{start: sec(1.5), queueWait: sec(1.2)}, // 1.5–2.7: 0.7
		{start: sec(2), queueWait: 0},          // not queued
	}
	const never = time.Hour
	if got := longestIdleWait(samples, load, names, 16, never, false); math.Abs(got.Seconds()-0.7) > 1e-9 {
		t.Errorf("longest idle wait %v; want 700ms", got)
	}
	// A batch at max_num_seqs is not idle capacity.
	if got := longestIdleWait(samples, load, names, 4, never, false); got != 0 {
		t.Errorf("with max_num_seqs 4: %v; want 0", got)
	}
	// A request on its way to b (dispatched at 1.9 s, seen by its engine
	// at 2.1 s, so over the 2 s sample) makes b's first idle stretch
	// taken: only the 0.5 s from 5 s remain.
	transit := append(slices.Clone(samples), sample{start: sec(1.8), queueWait: sec(0.1), ttft: sec(0.5), engineTTFT: sec(0.2), replica: "b"})
	if got := longestIdleWait(transit, load, names, 16, never, false); math.Abs(got.Seconds()-0.5) > 1e-9 {
		t.Errorf("with a request in transit to b: %v; want 500ms", got)
	}
	// b reserved for interactive turns (one sent there at 0 s, kept for
	// 10 s) is not idle capacity for background requests, but is for
	// interactive ones.
	reserve := []sample{{class: classInteractive, replica: "b", start: 0, ttft: sec(0.1)}}
	for _, s := range samples {
		s.class = classBackground
		reserve = append(reserve, s)
	}
	if got := longestIdleWait(reserve, load, names, 16, 10*time.Second, false); got != 0 {
		t.Errorf("background waits beside a reserved idle replica: %v; want 0", got)
	}
	if got := longestIdleWait(reserve, load, names, 16, sec(2.6), false); math.Abs(got.Seconds()-0.5) > 1e-9 {
		t.Errorf("reserve lapsed at 2.6 s: %v; want the 0.5 s from 5 s", got)
	}
	for i := range reserve[1:] {
		reserve[1+i].class = classInteractive
	}
	if got := longestIdleWait(reserve, load, names, 16, 10*time.Second, false); math.Abs(got.Seconds()-0.7) > 1e-9 {
		t.Errorf("interactive waits beside a reserved idle replica: %v; want 700ms", got)
	}
	// Counting only the replica each request went to: waits of requests
	// routed to a (always busy) count nothing; one routed to b counts b's
	// idle stretch within its wait.
	own := slices.Clone(samples)
	for i := range own {
		own[i].replica = "a"
	}
	if got := longestIdleWait(own, load, names, 16, never, true); got != 0 {
		t.Errorf("own replica, all routed to the busy a: %v; want 0", got)
	}
	own[2].replica = "b"
	if got := longestIdleWait(own, load, names, 16, never, true); math.Abs(got.Seconds()-0.7) > 1e-9 {
		t.Errorf("own replica, the 1.5–2.7 s wait routed to b: %v; want 700ms", got)
	}
}

func TestContestedShares(t *testing.T) {
	ms := func(v int) time.Duration { return time.Duration(v) * time.Millisecond }
	var samples []sample
	// light waits over [0, 1000) ms; heavy's dispatches at 100..900 are
	// contested, one at 1500 is not.
	samples = append(samples, sample{tenant: "light", start: 0, queueWait: ms(1000)})
	for i := 1; i <= 9; i++ {
		samples = append(samples, sample{tenant: "heavy", start: ms(50), queueWait: ms(100*i - 50)})
	}
	// heavy waits over [900, 1200): light's dispatch at 1000 is contested,
	// this one (light no longer waits) is not.
	samples = append(samples, sample{tenant: "heavy", start: ms(900), queueWait: ms(300)})
	got := contestedShares(samples, sharesTenants)
	if got[0].Dispatches != 1 || got[1].Dispatches != 9 || math.Abs(got[1].DispatchShare-0.9) > 1e-9 || got[1].WeightShare != 0.75 {
		t.Errorf("shares %+v", got)
	}
}

// The interactive TTFT is split into the gateway's queue, the engine and
// the rest (overhead), each with its own p99.
func TestMixedResultBreakdown(t *testing.T) {
	ms := func(v int) time.Duration { return time.Duration(v) * time.Millisecond }
	var samples []sample
	for i := range 100 {
		// TTFT = queue + engine + overhead; one turn has a 90 ms overhead.
		over := 10
		if i == 50 {
			over = 90
		}
		samples = append(samples, sample{class: classInteractive, queueWait: ms(i % 3), engineTTFT: ms(40 + i%7), ttft: ms(i%3 + 40 + i%7 + over), gatewayWork: ms(3)})
		// Two turns' routes take 80 ms: the route phase's p99, apart from
		// prepare's and admission's.
		route := 1
		if i == 50 || i == 51 {
			route = 80
		}
		samples[i].timing = &gatewayTiming{prepare: ms(2), queue: ms(i % 3), route: ms(route)}
		if i%10 == 0 { // first turns: the tokenizer's 20 ms
			samples[i].timing.prepare = ms(20)
		} else {
			samples[i].reason = "sticky"
		}
	}
	samples = append(samples, sample{class: classInteractive, ttft: ms(500), engineTTFT: -1}) // no engine figure: no overhead
	r := mixedResult(&Result{Policy: partFair, samples: samples}, 64, 1)
	if r.InteractiveOverheadP99Ms < 10 || r.InteractiveOverheadP99Ms > 90 || r.InteractiveEngineTTFTP99Ms != 46 || r.InteractiveGatewayP99Ms != 3 {
		t.Errorf("overhead p99 %v, engine p99 %v, gateway p99 %v; want within [10, 90], 46 and 3", r.InteractiveOverheadP99Ms, r.InteractiveEngineTTFTP99Ms, r.InteractiveGatewayP99Ms)
	}
	if want := (PhasesP99{PrepareMs: 20, AdmissionMs: 2, RouteMs: 80, PrepareStickyMs: 2, PrepareScoredMs: 20}); r.InteractivePhases != want {
		t.Errorf("phases p99 %+v; want %+v", r.InteractivePhases, want)
	}
	samples[50].ttft = samples[50].queueWait + samples[50].engineTTFT + ms(10)
	if r := mixedResult(&Result{Policy: partFair, samples: samples}, 64, 1); r.InteractiveOverheadP99Ms != 10 {
		t.Errorf("overhead p99 %v with every overhead 10 ms", r.InteractiveOverheadP99Ms)
	}
}

func TestMixedReportJSON(t *testing.T) {
	mr := &MixedReport{Workload: "mixed-tenants", NoBurstInteractiveTTFTP99Ms: 200,
		Results: []MixedResult{{Policy: "fifo", InteractiveTTFTP99Ms: 5000, BackgroundTurns: 10}}}
	var b bytes.Buffer
	if err := (&Report{Mixed: mr}).WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc["workload"] != "mixed-tenants" || doc["no_burst_interactive_ttft_p99_ms"] != 200.0 {
		t.Errorf("document %v", doc)
	}
	r := doc["results"].([]any)[0].(map[string]any)
	for _, k := range []string{"policy", "interactive_ttft_p50_ms", "interactive_ttft_p99_ms", "background_turns",
		"background_output_tokens_per_s", "output_tokens_per_s", "errors"} {
		if _, ok := r[k]; !ok {
			t.Errorf("result lacks %q: %v", k, r)
		}
	}
}

// TestMixedSmoke runs a tiny mixed-tenants benchmark end to end: tenants
// created with their keys, the class reaching the gateway, the queue
// engaged, and the JSON document.
func TestMixedSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("a live benchmark")
	}
	t.Parallel()
	// Speed 10, not 20: the queue's timeout is 60 s ÷ speed of wall time,
	// and under -race on a loaded machine 3 s turned waits into 429s.
	cfg := Config{Workload: "mixed-tenants", Replicas: 2, Scale: 0.05, Speed: 10, Limit: 12, Duration: 45 * time.Second,
		Parts: []string{partNoBurst, partFair}}
	rep, table := runLogged(t, cfg)
	mr := rep.Mixed
	if mr == nil || len(mr.Results) != 1 || mr.Results[0].Policy != partFair || mr.NoBurstInteractiveTTFTP99Ms <= 0 {
		t.Fatalf("report %+v", mr)
	}
	r := mr.Results[0]
	if r.Errors != 0 || r.BackgroundTurns == 0 || r.InteractiveRequests == 0 || r.InteractiveTTFTP99Ms < r.InteractiveTTFTP50Ms {
		t.Errorf("fair: %+v", r)
	}
	if !strings.Contains(table, "no-burst (tenant a alone)") {
		t.Errorf("table lacks the no-burst line:\n%s", table)
	}
}
