package scoring

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

func nearly(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(a), math.Abs(b)) }

// The estimate follows the documented formula, term by term.
func TestEstimateFormula(t *testing.T) {
	c := DefaultCost()
	e := Endpoint{ID: "a", InflightPrefillTokens: 3000, InflightPrefillRequests: 2, Waiting: 1, Running: 10,
		KVUsage: 0.5, KVTokens: 100000}
	l := c.loadOf(&e, 1000)
	// One engine-waiting request is this gateway's own: nothing foreign.
	if l.queued != 3000 || l.running != 10 || l.context != 50000 {
		t.Fatalf("load = %+v", l)
	}
	got := c.estimate(l, 1500, 500)
	o := DefaultStepBase + 10*DefaultDecodePerSeq + 50000*DefaultDecodePerContextToken
	steps := math.Ceil(4500/float64(DefaultStepTokens-10)) + 0.5
	want := 4500*DefaultPrefillPerToken + steps*o
	if !nearly(got.TTFT, want) || got.QueuedTokens != 3000 || got.UncachedTokens != 1500 || got.CachedTokens != 500 {
		t.Errorf("estimate = %+v; want TTFT %v", got, want)
	}
	if !nearly(got.QueueSeconds, 3000*DefaultPrefillPerToken) || !nearly(got.OwnSeconds, 1500*DefaultPrefillPerToken) || !nearly(got.StepSeconds, steps*o) {
		t.Errorf("parts = %v %v %v", got.QueueSeconds, got.OwnSeconds, got.StepSeconds)
	}
	// The calibration scales multiply their parts.
	c.QueueScale, c.TokenScale, c.StepScale = 2, 3, 0.5
	got = c.estimate(l, 1500, 500)
	if want := 2*got.QueueSeconds + 3*got.OwnSeconds + 0.5*got.StepSeconds; !nearly(got.TTFT, want) {
		t.Errorf("calibrated TTFT = %v; want %v", got.TTFT, want)
	}
	// An idle replica takes one step and no half step in progress.
	d := DefaultCost()
	idle := d.estimate(load{}, 100, 0)
	if !nearly(idle.TTFT, 100*DefaultPrefillPerToken+DefaultStepBase) {
		t.Errorf("idle TTFT = %v", idle.TTFT)
	}
}

// Waiting requests this gateway did not send are priced at the replica's
// measured mean, else the fleet's, else the request's own prompt; the
// head of this gateway's line has progressed while it waited there.
func TestQueuePriceAndHeadProgress(t *testing.T) {
	c := DefaultCost()
	eps := []Endpoint{{Waiting: 3}, {Waiting: 3, RequestTokens: 100}, {RequestTokens: 300}}
	price := queuePrice(eps, 5000)
	if price != 200 {
		t.Fatalf("price = %v; want the measured mean 200", price)
	}
	if q := c.loadOf(&eps[0], price).queued; q != 600 {
		t.Errorf("unmeasured replica queued %v; want 3 × 200", q)
	}
	if q := c.loadOf(&eps[1], price).queued; q != 300 {
		t.Errorf("measured replica queued %v; want 3 × 100", q)
	}
	if p := queuePrice([]Endpoint{{}, {}}, 5000); p != 5000 {
		t.Errorf("fallback price = %v; want the prompt", p)
	}
	head := Endpoint{InflightPrefillTokens: 20000, InflightPrefillRequests: 2, HeadPrefillTokens: 15000, HeadElapsed: 0.5}
	done := 0.5 / c.perToken(load{})
	if q := c.loadOf(&head, 0).queued; !nearly(q, 20000-done) {
		t.Errorf("queued %v; want %v after the head's progress", q, 20000-done)
	}
	head.HeadElapsed = 100
	if q := c.loadOf(&head, 0).queued; q != 5000 {
		t.Errorf("queued %v; progress must stop at the head's own tokens", q)
	}
}

// A queue the engine is not draining is priced by Little's law: when its
// KV cache is full, or prefill takes little of its time, and fewer
// requests were scheduled over the window than are waiting.
func TestAdmitBound(t *testing.T) {
	c := DefaultCost()
	full := Endpoint{Waiting: 10, KVUsage: 0.999, KVTokens: 100000, ArrivalRate: 0.2, RequestTokens: 500}
	l := c.loadOf(&full, 500)
	if !nearly(l.admit, 11/0.2) {
		t.Fatalf("admit = %v; want 55", l.admit)
	}
	e := c.estimate(l, 500, 0)
	if !e.AdmitBound || !nearly(e.AdmitSeconds, 55) || e.TTFT < 55 {
		t.Errorf("estimate %+v; want the admission wait", e)
	}
	// Busy with prefill and room in the cache: the prefill queue prices it.
	busy := full
	busy.KVUsage, busy.UncachedRate = 0.2, 14000
	if l := c.loadOf(&busy, 500); l.admit != 0 {
		t.Errorf("prefill-bound replica admit = %v; want 0", l.admit)
	}
	// A batch-bound replica (little prefill, room in the cache) is not
	// draining either.
	batch := busy
	batch.UncachedRate = 10
	if l := c.loadOf(&batch, 500); l.admit == 0 {
		t.Error("a batch-bound queue was priced at prefill speed")
	}
	// An idle replica a scrape caught with one request waiting (less than
	// one request scheduled over the window) is not batch-bound: a
	// 20-second admission wait there sent a sticky turn away from its
	// cache in TestTwoGatewaysShareSessions.
	idle := batch
	idle.Waiting, idle.ArrivalRate = 1, 0.05
	if l := c.loadOf(&idle, 500); l.admit != 0 {
		t.Errorf("idle replica with a request just arrived: admit = %v; want 0", l.admit)
	}
	// Draining fast enough, or rate unknown: no admission term.
	fast := full
	fast.ArrivalRate = 5
	if l := c.loadOf(&fast, 500); l.admit != 0 {
		t.Errorf("draining replica admit = %v", l.admit)
	}
	unknown := full
	unknown.ArrivalRate = 0
	if l := c.loadOf(&unknown, 500); l.admit != 0 {
		t.Errorf("unknown rate admit = %v", l.admit)
	}
}

// The cache-placement term: the fleet's share and the queue's share of
// the request's prefill, and its conversation's expected re-prefill.
func TestPlacementTerms(t *testing.T) {
	c := DefaultCost()
	l := load{rate: 2, life: math.Inf(1)}
	e := c.estimate(l, 3000, 0)
	pt := c.perToken(l)
	if got, want := c.others(l, e, 0), 3000*pt*(1+2*e.TTFT); !nearly(got, want) {
		t.Errorf("others = %v; want %v", got, want)
	}
	if got := c.others(l, c.estimate(l, 0, 3000), 0); got != 0 {
		t.Errorf("a full hit costs others %v", got)
	}
	st := fourTurns(100)
	if c.future(l, &st, 1, 5000) != 0 {
		t.Error("a cache nothing churns still costs the future")
	}
	l.life = 10 // every gap (100 s) outlasts it
	// Three turns remain and each would find the prefix gone, but the
	// placement ends at the first: one re-prefill.
	if got, want := c.future(l, &st, 1, 5000), 5000*pt; math.Abs(got-want) > 0.01*want {
		t.Errorf("future = %v; want one re-prefill, 5000 tokens × perToken = %v", got, want)
	}
	// Half the gaps outlast the cache: the placement survives three turns
	// with probability 1/8.
	half := fourTurns(1, 100)
	s, r := half.Survival(10), half.Remaining(1)
	if math.Abs(s-0.5) > 0.05 || math.Abs(r-3) > 0.1 {
		t.Fatalf("survival %v, remaining %v; want 0.5 and 3", s, r)
	}
	if got, want := c.future(l, &half, 1, 5000), (1-math.Pow(1-s, r))*5000*pt; math.Abs(got-want) > 0.01*want || got > 0.9*5000*pt {
		t.Errorf("future = %v; want P(an eviction in %v turns) = %v of a re-prefill, %v", got, r, 1-math.Pow(1-s, r), want)
	}
	if got := c.future(l, &st, 4, 5000); got != 0 {
		t.Errorf("future at the last turn seen = %v; want 0", got)
	}
	if c.future(l, nil, 1, 5000) != 0 {
		t.Error("no statistics, yet a future cost")
	}
	// A CPU tier that outlives every gap: the GPU's eviction costs a
	// load, CPUHitCost of the re-prefill. One every gap outlasts as well
	// prices the whole re-prefill again.
	l.cpuLife = 1000
	if got, want := c.future(l, &st, 1, 5000), CPUHitCost*5000*pt; math.Abs(got-want) > 0.01*want {
		t.Errorf("future behind a CPU tier = %v; want a load, %v", got, want)
	}
	l.cpuLife = 50
	if got, want := c.future(l, &st, 1, 5000), 5000*pt; math.Abs(got-want) > 0.01*want {
		t.Errorf("future behind a CPU tier that churns = %v; want a re-prefill, %v", got, want)
	}
}

// loadOf gives a CPU tier's prefixes the GPU's life plus the time its own
// capacity takes to fill at the engine's uncached rate.
func TestLoadCPULife(t *testing.T) {
	c := DefaultCost()
	e := Endpoint{CacheTokens: 10000, KVUsage: 0.5, UncachedRate: 1000}
	if l := c.loadOf(&e, 0); l.life != 5 || l.cpuLife != 5 {
		t.Errorf("no CPU tier: life %v, cpuLife %v; want 5 and 5", l.life, l.cpuLife)
	}
	e.CPUCacheTokens = 40000
	if l := c.loadOf(&e, 0); l.life != 5 || l.cpuLife != 45 {
		t.Errorf("CPU tier: life %v, cpuLife %v; want 5 and 45", l.life, l.cpuLife)
	}
}

// warmpath keeps a request where its prefix is until another replica is
// cheaper by more than the prefix costs the fleet and the request to
// recompute: the sticky rule falls out of the costs.
func TestWarmpathPicksByCost(t *testing.T) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	decide := func(queued int64) string {
		in := &Input{Model: "m", Endpoints: []Endpoint{{ID: "warm", InflightPrefillTokens: queued}, {ID: "cold"}},
			PromptTokens: 10000, Matched: []int{8000, 0}, BlockSize: 16, Rand: rand.New(rand.NewPCG(1, 2))}
		p, err := warm.Decide(in)
		if err != nil {
			t.Fatal(err)
		}
		if p.Estimates == nil || p.Estimates[0].Cost() > p.Estimates[1].Cost() {
			t.Fatalf("plan %+v is not cheapest first", p)
		}
		return in.Endpoints[p.Chosen()].ID
	}
	// Moving saves the queue but recomputes 8,000 tokens, which the
	// request and the fleet each pay: about 2 × 8,000 tokens of queue is
	// where it pays off.
	if got := decide(12000); got != "warm" {
		t.Errorf("queue of 12,000 tokens: chose %s; want warm", got)
	}
	if got := decide(20000); got != "cold" {
		t.Errorf("queue of 20,000 tokens: chose %s; want cold", got)
	}
	// Baselines do not weigh the placement term but report estimates.
	pp, _ := NewPolicy(PolicyPrecisePrefix, nil)
	in := &Input{Model: "m", Endpoints: []Endpoint{{ID: "a"}, {ID: "b"}}, PromptTokens: 100, Matched: []int{50, 0}, BlockSize: 16}
	p, _ := pp.Decide(in)
	if len(p.Estimates) != 2 || p.Estimates[0].Others != 0 || p.Estimates[0].TTFT <= 0 {
		t.Errorf("precise-prefix estimates = %+v", p.Estimates)
	}
}

// Exact cost ties go to the parent's replica.
func TestParentBreaksTies(t *testing.T) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	for seed := range uint64(20) {
		in := &Input{Model: "m", SessionKey: "s", Endpoints: []Endpoint{{ID: "a"}, {ID: "b"}, {ID: "c"}},
			PromptTokens: 100, Matched: []int{0, 0, 0}, Parent: "c", BlockSize: 16, Rand: rand.New(rand.NewPCG(seed, 1))}
		p, err := warm.Decide(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := in.Endpoints[p.Chosen()].ID; got != "c" {
			t.Fatalf("seed %d: chose %s; want the parent's replica c", seed, got)
		}
	}
}

// The calibrator recovers the scales observations follow, keeps the prior
// for parts the observations never exercise, and takes the admission wait
// off KV-bound observations.
func TestCalibratorFits(t *testing.T) {
	c := NewCalibrator(Cost{})
	if got := c.Cost("m"); got != DefaultCost() {
		t.Fatalf("before data: %+v; want the prior", got)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for range 2000 {
		e := Estimate{QueueSeconds: rng.Float64() * 5, OwnSeconds: 0.05 + rng.Float64(), StepSeconds: 0.01 + rng.Float64()*0.05}
		c.Observe("m", e, 0.5*e.QueueSeconds+2*e.OwnSeconds+1.5*e.StepSeconds)
	}
	got := c.Cost("m")
	// The step part, a few percent of each TTFT, is barely identified and
	// stays near its prior.
	if math.Abs(got.QueueScale-0.5) > 0.05 || math.Abs(got.TokenScale-2) > 0.1 || got.StepScale < 0.9 || got.StepScale > 1.6 {
		t.Errorf("fitted scales %v %v %v; want 0.5 2 and the step between its prior and 1.5", got.QueueScale, got.TokenScale, got.StepScale)
	}
	if other := c.Cost("n"); other.TokenScale != 1 {
		t.Errorf("model n borrowed m's fit: %+v", other)
	}
	// No queue ever seen: its scale stays at the prior.
	d := NewCalibrator(Cost{})
	for range 500 {
		own := 0.05 + 2*rng.Float64()
		d.Observe("m", Estimate{OwnSeconds: own, StepSeconds: 0.02 * own}, 3.06*own)
		d.Observe("m", Estimate{AdmitBound: true, AdmitSeconds: 10, QueueSeconds: 99, OwnSeconds: own, StepSeconds: 0.02 * own}, 10+3.06*own)
	}
	if got := d.Cost("m"); got.QueueScale != 1 || math.Abs(got.TokenScale-3) > 0.15 || got.Overhead > 0.05 {
		t.Errorf("scales %+v; want queue 1 (unseen), token ≈ 3, no overhead", got)
	}
	// A constant delay on top of the model is the overhead.
	o := NewCalibrator(Cost{})
	for range 1000 {
		e := Estimate{QueueSeconds: rng.Float64(), OwnSeconds: 0.05 + rng.Float64(), StepSeconds: 0.01 + 0.02*rng.Float64()}
		o.Observe("m", e, e.QueueSeconds+e.OwnSeconds+e.StepSeconds+0.5)
	}
	if got := o.Cost("m"); math.Abs(got.Overhead-0.5) > 0.1 || math.Abs(got.TokenScale-1) > 0.15 {
		t.Errorf("fit %+v; want overhead 0.5 s on unchanged scales", got)
	}
	// Absurd observations are clamped, bad ones ignored.
	for range 500 {
		d.Observe("x", Estimate{OwnSeconds: 1}, 100)
		d.Observe("x", Estimate{OwnSeconds: math.NaN()}, 1)
		d.Observe("x", Estimate{OwnSeconds: 1}, math.Inf(1))
	}
	if got := d.Cost("x").TokenScale; got != maxScale {
		t.Errorf("token scale %v; want clamped to %v", got, maxScale)
	}
}

func TestCalibratorConcurrent(t *testing.T) {
	c := NewCalibrator(Cost{})
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 500 {
				c.Observe("m", Estimate{OwnSeconds: 1}, 1)
				c.ObserveTurn("m", j%5+1, float64(i))
				_ = c.Cost("m")
				_ = c.Sessions("m")
			}
		})
	}
	wg.Wait()
	if n := c.Observations("m"); n <= 0 {
		t.Errorf("observations = %v", n)
	}
}

func TestMeter(t *testing.T) {
	var m Meter
	for range 1000 { // 2 requests of 300 tokens a second, for 1,000 s
		m.Advance(0.5)
		m.Add(1, 300)
	}
	if math.Abs(m.Requests-2) > 0.1 || math.Abs(m.PerRequest()-300) > 1e-6 {
		t.Errorf("meter = %+v, per request %v; want 2/s, 300", m, m.PerRequest())
	}
	m.Advance(MeterWindow)
	if math.Abs(m.Requests-2/math.E) > 0.05 {
		t.Errorf("after one window idle: %v; want 2/e", m.Requests)
	}
	m.Add(-5, -5)
	m.Advance(-1)
	if m.Requests < 0 {
		t.Error("negative counts or time moved the meter")
	}
	var idle Meter
	if idle.PerRequest() != 0 {
		t.Error("idle meter has a per-request size")
	}
}

func TestSessionStats(t *testing.T) {
	var s SessionStats
	if s.Survival(1) != 0 || s.Remaining(1) != 0 {
		t.Fatal("empty statistics are not zero")
	}
	for range 50 {
		s.ObserveGap(1)
		s.ObserveGap(100)
	}
	if got := s.Survival(10); math.Abs(got-0.5) > 0.01 {
		t.Errorf("survival(10 s) = %v; want 0.5", got)
	}
	if s.Survival(1000) != 0 || s.Survival(0.1) < 0.99 {
		t.Errorf("survival(1000) = %v, survival(0.1) = %v", s.Survival(1000), s.Survival(0.1))
	}
	// Half the conversations stop after one turn, half go to three.
	for range 100 {
		s.ObserveTurn(1)
	}
	for range 50 {
		s.ObserveTurn(2)
		s.ObserveTurn(3)
	}
	if got := s.Remaining(1); math.Abs(got-1) > 0.1 {
		t.Errorf("remaining after turn 1 = %v; want 1", got)
	}
	if got := s.Remaining(2); math.Abs(got-1) > 0.1 {
		t.Errorf("remaining after turn 2 = %v; want 1", got)
	}
	s.ObserveGap(math.NaN())
	s.ObserveTurn(0)
}

// The mean gap takes each log-spaced bin's gaps at their log-uniform mean,
// and a conversation's lifetime is its turns to come times that.
func TestSessionLifetime(t *testing.T) {
	var s SessionStats
	if s.MeanGap() != 0 || s.Lifetime() != 0 {
		t.Fatal("empty statistics have a lifetime")
	}
	for range 100 {
		s.ObserveGap(3) // bin [2, 4): mean 2 ÷ ln 2
		s.ObserveTurn(1)
		s.ObserveTurn(2)
		s.ObserveTurn(3)
	}
	if got, want := s.MeanGap(), 2/math.Ln2; !nearly(got, want) {
		t.Errorf("mean gap %v; want %v", got, want)
	}
	if got, want := s.Lifetime(), 2*2/math.Ln2; math.Abs(got-want) > 0.01*want {
		t.Errorf("lifetime %v; want 2 turns × %v", got, 2/math.Ln2)
	}
}

// harnessInput is a new conversation opening with a 12,000-token harness
// that only replica "hot" holds, behind queued tokens of prefill there,
// with three idle replicas that hold nothing; sharers requests shared the
// harness over the horizon.
func harnessInput(queued int64, sharers float64) *Input {
	var st SessionStats
	for range 100 {
		st.ObserveTurn(1)
		st.ObserveTurn(2)
		st.ObserveGap(5)
	}
	return &Input{Model: "m", SessionKey: "s", PromptTokens: 13000, BlockSize: 16, Sessions: &st,
		Endpoints: []Endpoint{{ID: "hot", InflightPrefillTokens: queued, InflightPrefillRequests: 2, Running: 2},
			{ID: "cold-1"}, {ID: "cold-2"}, {ID: "cold-3"}},
		Matched: []int{12000, 0, 0, 0}, Sharers: sharers, Rand: rand.New(rand.NewPCG(1, 2))}
}

// A popular prefix that lives only on a busy replica gets a second copy:
// the copy's prefill (about 1.7 s of TTFT and fleet time) is less than
// the queue it spares the thirty requests that will share the harness.
// Without the replication term the hot replica wins (the copy costs more
// than this request's own wait there).
func TestReplicationCopiesAPopularPrefix(t *testing.T) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	in := harnessInput(3000, 30)
	p, err := warm.Decide(in)
	if err != nil {
		t.Fatal(err)
	}
	if got := in.Endpoints[p.Chosen()].ID; got == "hot" {
		t.Fatalf("chose %s; want a cold replica (estimates %+v)", got, p.Estimates)
	}
	e := p.Estimates[0]
	hot := p.Estimates[slices.Index(p.Order, 0)]
	if hot.Replication != 0 || !(e.Replication > 0) {
		t.Errorf("replication: hot %v, chosen %v; want 0 and positive", hot.Replication, e.Replication)
	}
	// The term is the sharers' saving: the hot replica's cost against the
	// chosen one's were it to hold the harness.
	c := DefaultCost()
	l := c.loadOf(&in.Endpoints[p.Chosen()], float64(in.PromptTokens))
	as := warm.placed(in, &c, l, 13000, 12000)
	if want := 30 * (hot.Cost() - as.Cost()); !nearly(e.Replication, want) {
		t.Errorf("replication %v; want 30 × (%v − %v) = %v", e.Replication, hot.Cost(), as.Cost(), want)
	}
	if !nearly(e.Cost(), e.TTFT+e.Others+e.Future-e.Replication) {
		t.Errorf("cost %v does not subtract the replication term", e.Cost())
	}
	in = harnessInput(3000, 0)
	p, _ = warm.Decide(in)
	if got := in.Endpoints[p.Chosen()].ID; got != "hot" {
		t.Errorf("without demand chose %s; want hot", got)
	}
}

// Low demand, or no queue at the holder, leaves the request where the
// prefix is: a copy for two sharers does not pay, and where the holder is
// as cheap as a copy would be there is nothing to save.
func TestReplicationNeedsDemand(t *testing.T) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	for _, c := range []struct {
		name    string
		queued  int64
		sharers float64
	}{
		{"two sharers", 3000, 2},
		{"idle holder", 0, 1000},
	} {
		in := harnessInput(c.queued, c.sharers)
		if c.queued == 0 {
			in.Endpoints[0].InflightPrefillRequests, in.Endpoints[0].Running = 0, 0
		}
		p, err := warm.Decide(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := in.Endpoints[p.Chosen()].ID; got != "hot" {
			t.Errorf("%s: chose %s; want hot (estimates %+v)", c.name, got, p.Estimates)
		}
	}
	// Baselines never weigh it.
	pp, _ := NewPolicy(PolicyPrecisePrefix, nil)
	p, _ := pp.Decide(harnessInput(3000, 30))
	for _, e := range p.Estimates {
		if e.Replication != 0 {
			t.Errorf("precise-prefix estimate has replication %v", e.Replication)
		}
	}
}

// A backlog in the gateway's admission queue prices a miss at what it
// costs the requests waiting there: a holder whose queue makes a cold
// replica faster for this request alone keeps it once forty requests
// wait (ten per replica), each delayed by a quarter of the recomputed
// prefix. The backlog's share is in Others.
func TestBacklogKeepsHits(t *testing.T) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	in := harnessInput(30000, 0)
	p, err := warm.Decide(in)
	if err != nil {
		t.Fatal(err)
	}
	if got := in.Endpoints[p.Chosen()].ID; got == "hot" {
		t.Fatalf("without a backlog chose %s; want a cold replica (estimates %+v)", got, p.Estimates)
	}
	cold := p.Estimates[0]
	in = harnessInput(30000, 0)
	in.Backlog = 40
	if p, err = warm.Decide(in); err != nil {
		t.Fatal(err)
	}
	if got := in.Endpoints[p.Chosen()].ID; got != "hot" {
		t.Errorf("with 40 waiting chose %s; want hot (estimates %+v)", got, p.Estimates)
	}
	k := slices.IndexFunc(p.Order, func(i int) bool { return in.Endpoints[i].ID == "cold-1" }) // the cold replicas are alike
	c := DefaultCost()
	l := c.loadOf(&Endpoint{ID: "cold-1"}, 13000)
	if got, want := p.Estimates[k].Others, cold.Others+float64(cold.UncachedTokens)*c.perToken(l)*10; !nearly(got, want) {
		t.Errorf("cold-1's Others with the backlog %v; want %v (+ uncached × perToken × 40/4)", got, want)
	}
}

// Requests the gateway's queue holds for room on a replica are ahead of
// a request that would join them: an idle holder behind ten of them
// (60,000 uncached tokens, 4 s of prefill) loses to a cold replica, and
// its estimate queues their tokens like the engine's own queue. Without
// the term the holder's estimate is its idle engine's and it wins.
func TestGatewayQueueAhead(t *testing.T) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	in := harnessInput(0, 0)
	p, err := warm.Decide(in)
	if err != nil {
		t.Fatal(err)
	}
	if got := in.Endpoints[p.Chosen()].ID; got != "hot" {
		t.Fatalf("with nothing queued chose %s; want hot (estimates %+v)", got, p.Estimates)
	}
	idle := p.Estimates[0]
	in = harnessInput(0, 0)
	in.Endpoints[0].GatewayAhead, in.Endpoints[0].GatewayAheadTokens = 10, 60000
	in.Backlog = 10
	if p, err = warm.Decide(in); err != nil {
		t.Fatal(err)
	}
	if got := in.Endpoints[p.Chosen()].ID; got == "hot" {
		t.Errorf("behind ten queued for it chose hot; want a cold replica (estimates %+v)", p.Estimates)
	}
	hot := p.Estimates[slices.Index(p.Order, 0)]
	c := DefaultCost()
	if hot.QueuedTokens != 60000 || !(hot.TTFT-idle.TTFT >= 60000*c.PrefillPerToken) {
		t.Errorf("hot's estimate queues %d tokens, TTFT %v (idle %v); want 60000 and 4 s more",
			hot.QueuedTokens, hot.TTFT, idle.TTFT)
	}
}

// A request the queue holds for a replica after this one waits out this
// one's prefill there: each adds the prefill's replica time to Others,
// and none of them counts again in the fleet-wide backlog share.
func TestGatewayQueueBehind(t *testing.T) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	in := harnessInput(0, 0)
	in.Endpoints[1].GatewayBehind = 5
	in.Backlog = 5
	p, err := warm.Decide(in)
	if err != nil {
		t.Fatal(err)
	}
	est := func(id string) Estimate {
		k := slices.IndexFunc(p.Order, func(i int) bool { return in.Endpoints[i].ID == id })
		return p.Estimates[k]
	}
	c := DefaultCost()
	l := c.loadOf(&Endpoint{ID: "cold-2"}, 13000)
	base := 13000 * c.perToken(l)
	if got := est("cold-2").Others; !nearly(got, base) {
		t.Errorf("cold-2's Others %v; want %v (uncached × perToken, no backlog share)", got, base)
	}
	if got := est("cold-1").Others; !nearly(got, 6*base) {
		t.Errorf("cold-1's Others %v; want %v (× (1 + 5 behind))", got, 6*base)
	}
}

// fourTurns returns the statistics of 100 conversations of four turns
// each, with the given gaps observed once per conversation.
func fourTurns(gaps ...float64) SessionStats {
	var st SessionStats
	for range 100 {
		for turn := 1; turn <= 4; turn++ {
			st.ObserveTurn(turn)
		}
		for _, g := range gaps {
			st.ObserveGap(g)
		}
	}
	return st
}
