package scoring

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var t0 = time.Unix(1_000_000, 0)

func stickyInput(bound string, eps []Endpoint) *Input {
	return &Input{
		Now: t0, Model: "m", SessionKey: "s", Endpoints: eps,
		PromptTokens: 1000, TextBytes: 4000, Continues: true, BoundHolds: true,
		Binding:   &Binding{Replica: bound, TipDepth: 10, PromptTokens: 500, PromptBytes: 1000, Turns: 3, Updated: t0},
		BlockSize: 16, RefreshAfter: time.Minute, Rand: rand.New(rand.NewPCG(1, 2)),
	}
}

// The sticky check: a bound session stays while its replica is healthy,
// holds its prefix and staying costs no more than moving, and says why
// when it moves. The saturation flag alone does not move it.
func TestDecideStick(t *testing.T) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	e := []Endpoint{{ID: "a", Saturated: true}, {ID: "b", InflightPrefillTokens: 50000}, {ID: "c"}, {ID: "d", Unhealthy: true}}
	allLoaded := []Endpoint{{ID: "a", InflightPrefillTokens: 50000}, {ID: "b", InflightPrefillTokens: 50000}}
	tests := []struct {
		name      string
		bound     string
		eps       []Endpoint
		holds     bool
		continues bool
		sticky    bool
		rebind    string
	}{
		{"stays", "a", e, true, true, true, ""},
		{"costlier moves", "b", e, true, true, false, RebindSaturated},
		{"evicted moves", "c", e, false, true, false, RebindEvicted},
		{"gone", "zz", e, true, true, false, RebindGone},
		{"unhealthy", "d", e, true, true, false, RebindUnhealthy},
		{"diverged", "a", e, true, false, false, RebindDiverged},
		{"all loaded stays", "a", allLoaded, true, true, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := stickyInput(tt.bound, tt.eps)
			in.BoundHolds, in.Continues = tt.holds, tt.continues
			p, err := warm.Decide(in)
			if err != nil {
				t.Fatal(err)
			}
			if tt.sticky {
				if p.Reason != ReasonSticky || in.Endpoints[p.Chosen()].ID != tt.bound || p.NeedsPrefix {
					t.Fatalf("plan = %+v; want sticky on %s", p, tt.bound)
				}
				return
			}
			if !p.NeedsPrefix {
				t.Fatalf("plan = %+v; want the prefix phase", p)
			}
			in.Matched = make([]int, len(in.Endpoints))
			if p, err = warm.Decide(in); err != nil {
				t.Fatal(err)
			}
			if p.Reason != ReasonScored || p.Rebind != tt.rebind || p.Bind != BindReplace {
				t.Errorf("plan = reason %q rebind %q bind %v; want scored, %q, replace", p.Reason, p.Rebind, p.Bind, tt.rebind)
			}
			for _, i := range p.Order {
				if in.Endpoints[i].Unhealthy {
					t.Errorf("unhealthy endpoint %s is a candidate", in.Endpoints[i].ID)
				}
			}
		})
	}
}

// A bound session whose replica holds its tip only in a CPU tier is, for
// an estimated policy, scored with its prefix known: the plan prices the
// load and predicts GPU and CPU hits alike. A policy without estimates
// keeps it sticky.
func TestDecideBoundOnCPU(t *testing.T) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	eps := []Endpoint{{ID: "a"}, {ID: "b"}}
	in := stickyInput("a", eps)
	in.BoundOnCPU = true
	p, err := warm.Decide(in)
	if err != nil || !p.NeedsPrefix {
		t.Fatalf("plan = %+v, %v; want the prefix phase", p, err)
	}
	in.Matched, in.MatchedCPU = []int{320, 0}, []int{480, 0}
	if p, err = warm.Decide(in); err != nil {
		t.Fatal(err)
	}
	if p.Reason != ReasonScored || in.Endpoints[p.Chosen()].ID != "a" || p.Rebind != "" {
		t.Fatalf("plan = reason %q on %s, rebind %q; want scored on a, not rebound", p.Reason, in.Endpoints[p.Chosen()].ID, p.Rebind)
	}
	if p.Predicted[0] != 800 {
		t.Errorf("predicted %d cached tokens; want GPU 320 + CPU 480", p.Predicted[0])
	}
	// uncached = 1000 − 320 − (1 − CPUHitCost) × 480
	if got, want := p.Estimates[0].UncachedTokens, int64(1000-320-int(math.Round((1-CPUHitCost)*480))); got != want {
		t.Errorf("uncached %d; want %d", got, want)
	}
	plain := &Policy{Sticky: true, Picker: Rendezvous{}}
	in.Matched, in.MatchedCPU = nil, nil
	if p, _ := plain.Decide(in); p.Reason != ReasonSticky || p.NeedsPrefix {
		t.Errorf("sticky policy without estimates: reason %q, needs prefix %v; want sticky", p.Reason, p.NeedsPrefix)
	}
}

// A sticky turn estimates its prompt from the session's tokens per byte,
// predicts what the replica is known to hold, orders the others by
// estimated cost, and refreshes the binding only when it has aged.
func TestDecideStickyPlan(t *testing.T) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	eps := []Endpoint{{ID: "a", InflightPrefillTokens: 9000}, {ID: "b"}, {ID: "c"}, {ID: "d", Unhealthy: true}}
	in := stickyInput("c", eps)
	p, err := warm.Decide(in)
	if err != nil {
		t.Fatal(err)
	}
	// 4,000 bytes at 500 tokens per 1,000 bytes; 10 blocks of 16 known.
	if p.PromptTokens != 2000 || p.Predicted[0] != 160 || p.Reason != ReasonSticky {
		t.Fatalf("plan %+v; want sticky, prompt 2000, predicted 160", p)
	}
	if got := p.Order; !slices.Equal(got, []int{2, 1, 0}) {
		t.Errorf("order = %v; want bound, then cheapest first", got)
	}
	if e := p.Estimates; len(e) != 3 || e[0].UncachedTokens != 1840 || e[1].UncachedTokens != 2000 || e[2].QueuedTokens != 9000 {
		t.Errorf("estimates = %+v", e)
	}
	if p.Bind != BindKeep {
		t.Errorf("fresh binding rewritten: %v", p.Bind)
	}
	// Known cached tokens from the last completed turn win over the tip,
	// and the prompt is at least that plus one.
	in.Binding.CachedTokens = 5000
	in.Now = t0.Add(2 * time.Minute)
	if p, _ = warm.Decide(in); p.PromptTokens != 5001 || p.Predicted[0] != 4992 || p.Bind != BindRefresh || p.Binding.Turns != 4 {
		t.Errorf("plan = %+v; want prompt 5001, predicted 4992, refresh at turn 4", p)
	}
}

// A sticky turn on an engine of known block size predicts whole engine
// blocks, never the block holding the prompt's last token.
func TestDecideStickyEngineBlocks(t *testing.T) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	for _, tt := range []struct {
		engineBS, cached, text, want int
	}{
		{0, 1000, 2400, 992},   // the index's 16-token blocks: 62 blocks
		{64, 1000, 2400, 960},  // 15 blocks of 64
		{64, 1000, 2002, 960},  // prompt 1001: the last token's block is not a hit
		{64, 1100, 2200, 1088}, // prompt 1101 (the cached tokens plus one)
		{16, 1000, 2400, 992},
	} {
		in := stickyInput("a", []Endpoint{{ID: "a", BlockSize: tt.engineBS}, {ID: "b"}})
		in.Binding.CachedTokens, in.TextBytes = tt.cached, tt.text
		p, err := warm.Decide(in)
		if err != nil {
			t.Fatal(err)
		}
		if p.Predicted[0] != tt.want || p.Predicted[0]%max(tt.engineBS, 1) != 0 {
			t.Errorf("engine block %d, %d cached, prompt %d: predicted %d; want %d", tt.engineBS, tt.cached, p.PromptTokens, p.Predicted[0], tt.want)
		}
	}
}

// A sticky turn on an engine that caches prompt blocks only leaves the
// last turn's generated tokens out of its prediction.
func TestDecideStickyPromptBlocksOnly(t *testing.T) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	for _, only := range []bool{false, true} {
		in := stickyInput("a", []Endpoint{{ID: "a", BlockSize: 16, PromptBlocksOnly: only}, {ID: "b"}})
		in.Binding.CachedTokens, in.Binding.GeneratedTokens, in.TextBytes = 1000, 100, 4400
		p, err := warm.Decide(in)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{false: 992, true: 896}[only]; p.Predicted[0] != want {
			t.Errorf("prompt blocks only %v: predicted %d; want %d", only, p.Predicted[0], want)
		}
	}
}

// A first turn is scored and bound only if no other gateway bound it
// first; Follow then moves to the winner.
func TestDecideFirstTurnAndFollow(t *testing.T) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	in := &Input{Model: "m", SessionKey: "s", Endpoints: []Endpoint{{ID: "a"}, {ID: "b"}, {ID: "c"}},
		PromptTokens: 320, TextBytes: 1280, BlockSize: 16, Rand: rand.New(rand.NewPCG(3, 4))}
	if p, _ := warm.Decide(in); !p.NeedsPrefix {
		t.Fatalf("first turn did not ask for prefix information: %+v", p)
	}
	in.Matched = []int{0, 304, 0}
	p, err := warm.Decide(in)
	if err != nil {
		t.Fatal(err)
	}
	if in.Endpoints[p.Chosen()].ID != "b" || p.Predicted[0] != 304 || p.Bind != BindNew || p.Rebind != "" {
		t.Fatalf("plan = %+v; want b with 304 predicted, bind-if-new", p)
	}
	if p.Binding != (Binding{Replica: "b", PromptTokens: 320, PromptBytes: 1280, Turns: 1}) {
		t.Errorf("binding = %+v", p.Binding)
	}
}

// Policies that need no prefix information decide in one phase; a policy
// with a session scorer that lands elsewhere counts as rescored.
func TestDecideOnePhaseAndRescored(t *testing.T) {
	ll, _ := NewPolicy(PolicyLeastLoad, Weights{ScorerSession: 0.1})
	in := &Input{Model: "m", SessionKey: "s", Endpoints: []Endpoint{{ID: "a", Waiting: 9}, {ID: "b"}},
		Binding: &Binding{Replica: "a", Turns: 2}, Continues: true, BoundHolds: true, BlockSize: 16}
	p, err := ll.Decide(in)
	if err != nil || p.NeedsPrefix {
		t.Fatalf("Decide = %+v, %v", p, err)
	}
	if in.Endpoints[p.Chosen()].ID != "b" || p.Rebind != RebindRescored || p.Binding.Turns != 3 {
		t.Errorf("plan = %+v; want b, rescored, turn 3", p)
	}
	rr, _ := NewPolicy(PolicyRoundRobin, nil)
	if p, _ := rr.Decide(in); p.Bind != BindKeep || p.Rebind != "" {
		t.Errorf("round-robin keeps no bindings: %+v", p)
	}
}

func TestDecideNoEndpoint(t *testing.T) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	in := &Input{Model: "m", Endpoints: []Endpoint{{ID: "a", Unhealthy: true}}}
	if _, err := warm.Decide(in); !errors.Is(err, ErrNoEndpoint) {
		t.Errorf("err = %v; want ErrNoEndpoint", err)
	}
}

func TestSaturationJudge(t *testing.T) {
	s := Saturation{}.WithDefaults()
	tests := []struct {
		waiting  int
		kv       float64
		inflight int64
		want     string
	}{
		{0, 0.5, 0, ""},
		{32, 0, 0, SaturatedWaiting},
		{0, 1, 0, SaturatedKV},
		{0, 0, DefaultMaxInflightPrefillTokens, SaturatedInflight},
	}
	for _, tt := range tests {
		if sat, why := s.Judge(tt.waiting, tt.kv, tt.inflight); sat != (tt.want != "") || why != tt.want {
			t.Errorf("Judge(%d, %v, %d) = %v, %q; want %q", tt.waiting, tt.kv, tt.inflight, sat, why, tt.want)
		}
	}
	off := Saturation{MaxWaiting: -1, MaxKVUsage: -1, MaxInflightPrefillTokens: -1}
	if sat, _ := off.Judge(1e6, 1, 1e12); sat {
		t.Error("disabled thresholds judged saturated")
	}
}

func BenchmarkDecideSticky64(b *testing.B) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	eps := make([]Endpoint, 64)
	for i := range eps {
		eps[i] = Endpoint{ID: string(rune('A' + i)), Waiting: i % 5, InflightPrefillTokens: int64(i * 100)}
	}
	in := stickyInput("C", eps)
	b.ReportAllocs()
	for b.Loop() {
		_, _ = warm.Decide(in)
	}
}

func BenchmarkDecideScored64(b *testing.B) {
	warm, _ := NewPolicy(PolicyWarmpath, nil)
	eps := make([]Endpoint, 64)
	matched := make([]int, 64)
	for i := range eps {
		eps[i] = Endpoint{ID: string(rune('A' + i)), Waiting: i % 5, KVUsage: float64(i) / 64, InflightPrefillTokens: int64(i * 100)}
		matched[i] = (i * 997) % 16000
	}
	in := &Input{Model: "m", SessionKey: "s", Endpoints: eps, PromptTokens: 16000, Matched: matched, BlockSize: 16,
		Binding: &Binding{Replica: "C"}, Continues: true, BoundHolds: false, Rand: rand.New(rand.NewPCG(1, 1))}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = warm.Decide(in)
	}
}

func TestPolicyBinds(t *testing.T) {
	tests := []struct {
		policy string
		w      Weights
		key    string
		want   bool
	}{
		{PolicyWarmpath, nil, "o:abc", true},                        // sticky
		{PolicyWarmpath, nil, "", false},                            // no session named
		{PolicyPrecisePrefix, nil, "o:abc", false},                  // no session scorer
		{PolicyLeastLoad, Weights{ScorerSession: 1}, "o:abc", true}, // a session scorer added
		{PolicyRoundRobin, nil, "o:abc", false},
	}
	for _, tt := range tests {
		p, err := NewPolicy(tt.policy, tt.w)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Binds(tt.key); got != tt.want {
			t.Errorf("%s%v.Binds(%q) = %v, want %v", tt.policy, tt.w, tt.key, got, tt.want)
		}
	}
}

// An endpoint is available when it is healthy and not reserved for
// another class.
func TestEndpointAvailable(t *testing.T) {
	for _, c := range []struct {
		unhealthy, reserved, want bool
	}{{false, false, true}, {true, false, false}, {false, true, false}, {true, true, false}} {
		e := Endpoint{ID: "a", Unhealthy: c.unhealthy, Reserved: c.reserved}
		if got := e.Available(); got != c.want {
			t.Errorf("Endpoint{Unhealthy: %v, Reserved: %v}.Available() = %v; want %v", c.unhealthy, c.reserved, got, c.want)
		}
	}
}
