package scoring

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func eps(ids ...string) []Endpoint {
	out := make([]Endpoint, len(ids))
	for i, id := range ids {
		out[i] = Endpoint{ID: id}
	}
	return out
}

func near(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > 1e-9 {
			return false
		}
	}
	return true
}

func TestScorers(t *testing.T) {
	ctx := context.Background()
	loaded := []Endpoint{
		{ID: "a", Waiting: 0, KVUsage: 0.2, InflightRequests: 1, InflightPrefillTokens: 0},
		{ID: "b", Waiting: 4, KVUsage: 0.9, InflightRequests: 3, InflightPrefillTokens: 2000},
		{ID: "c", Waiting: 2, KVUsage: 0.5, InflightRequests: 5, InflightPrefillTokens: 1000},
	}
	tests := []struct {
		name   string
		scorer Scorer
		req    Request
		eps    []Endpoint
		want   []float64
	}{
		{"prefix fraction", Prefix{}, Request{PromptTokens: 1000, Matched: []int{1000, 500, 0}}, eps("a", "b", "c"), []float64{1, 0.5, 0}},
		{"prefix unknown", Prefix{}, Request{PromptTokens: 1000}, eps("a", "b"), []float64{0, 0}},
		{"prefix empty prompt", Prefix{}, Request{Matched: []int{0, 0}}, eps("a", "b"), []float64{0, 0}},
		{"session bound", Session{}, Request{Bound: "b"}, eps("a", "b", "c"), []float64{0, 1, 0}},
		{"session none", Session{}, Request{}, eps("a", "b"), []float64{0, 0}},
		{"queue minmax", Queue{}, Request{}, loaded, []float64{1, 0, 0.5}},
		{"queue all equal", Queue{}, Request{}, eps("a", "b"), []float64{1, 1}},
		{"inflight minmax", InflightRequests{}, Request{}, loaded, []float64{1, 0.5, 0}},
		{"kv", KVUtil{}, Request{}, loaded, []float64{0.8, 0.1, 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.scorer.Score(ctx, &tt.req, tt.eps)
			if !near(got, tt.want) {
				t.Errorf("got %v; want %v", got, tt.want)
			}
		})
	}
}

func TestRouteWeights(t *testing.T) {
	ctx := context.Background()
	p := &Policy{Name: "t", Scorers: []Weighted{
		{"prefix", 2, Affinity, Prefix{}},
		{"kv", 1, Distribution, KVUtil{}},
	}}
	endpoints := []Endpoint{{ID: "hot", KVUsage: 0.5, Saturated: true}, {ID: "cold", KVUsage: 0.5}}
	r := &Request{PromptTokens: 100, Matched: []int{100, 0}}
	d, err := p.Route(ctx, r, endpoints, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	// Saturation does not enter scores: the holder wins on its prefix.
	if got := endpoints[d.Chosen()].ID; got != "hot" {
		t.Errorf("chose %s; want the holder", got)
	}
	if !near(d.Totals, []float64{2.5, 0.5}) || !near(d.Breakdown["prefix"], []float64{2, 0}) {
		t.Errorf("totals = %v, prefix = %v; want [2.5 0.5], [2 0]", d.Totals, d.Breakdown["prefix"])
	}
	if _, err := p.Route(ctx, r, nil, nil); err != ErrNoEndpoint {
		t.Errorf("no endpoints: err = %v; want ErrNoEndpoint", err)
	}
}

func TestClampAndTieBreak(t *testing.T) {
	p := &Policy{Scorers: []Weighted{{"bad", 1, Distribution, constScorer{math.NaN(), 7, -3}}}}
	d, err := p.Route(context.Background(), &Request{}, eps("a", "b", "c"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !near(d.Totals, []float64{0, 1, 0}) {
		t.Errorf("totals = %v; want clamped [0 1 0]", d.Totals)
	}
	// Exact ties break at random: over many draws both tied endpoints win.
	tie := &Policy{Scorers: []Weighted{{"c", 1, Distribution, constScorer{0.5, 0.5, 0.1}}}}
	seen := map[int]int{}
	rng := rand.New(rand.NewPCG(7, 7))
	for range 200 {
		d, _ := tie.Route(context.Background(), &Request{}, eps("a", "b", "c"), rng)
		seen[d.Chosen()]++
		if last := d.Order[2]; last != 2 {
			t.Fatalf("lowest scorer not last in order %v", d.Order)
		}
	}
	if seen[0] == 0 || seen[1] == 0 || seen[2] != 0 {
		t.Errorf("tie-break counts = %v; want both 0 and 1 chosen, never 2", seen)
	}
}

type constScorer []float64

func (c constScorer) Score(context.Context, *Request, []Endpoint) []float64 { return slices.Clone(c) }

func TestRoundRobin(t *testing.T) {
	p, err := NewPolicy(PolicyRoundRobin, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for range 6 {
		d, _ := p.Route(context.Background(), &Request{}, eps("a", "b", "c"), nil)
		got = append(got, d.Chosen())
		if len(d.Order) != 3 {
			t.Fatalf("order %v lacks fallbacks", d.Order)
		}
	}
	if want := []int{0, 1, 2, 0, 1, 2}; !slices.Equal(got, want) {
		t.Errorf("choices = %v; want %v", got, want)
	}
}

func TestRendezvous(t *testing.T) {
	p, _ := NewPolicy(PolicySessionHash, nil)
	all := eps("r0", "r1", "r2", "r3", "r4")
	pick := func(key string, e []Endpoint) string {
		d, _ := p.Route(context.Background(), &Request{SessionKey: key}, e, nil)
		return e[d.Chosen()].ID
	}
	moved, counts := 0, map[string]int{}
	for i := range 500 {
		key := "session-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		first := pick(key, all)
		if again := pick(key, all); again != first {
			t.Fatalf("session %s moved from %s to %s with no membership change", key, first, again)
		}
		counts[first]++
		without := slices.DeleteFunc(slices.Clone(all), func(e Endpoint) bool { return e.ID == "r2" })
		if after := pick(key, without); after != first {
			moved++
			if first != "r2" {
				t.Fatalf("session %s on %s moved to %s when r2 left", key, first, after)
			}
		}
	}
	keyless := map[string]int{}
	for range 200 {
		keyless[pick("", all)]++
	}
	if len(keyless) < 4 {
		t.Errorf("keyless requests went to %d endpoints; want them spread: %v", len(keyless), keyless)
	}
	if moved != counts["r2"] {
		t.Errorf("moved %d sessions; want exactly r2's %d", moved, counts["r2"])
	}
	for _, e := range all {
		if counts[e.ID] < 50 {
			t.Errorf("endpoint %s got %d of 500 sessions; hashing is lopsided: %v", e.ID, counts[e.ID], counts)
		}
	}
}

func TestNewPolicy(t *testing.T) {
	for _, name := range Policies() {
		p, err := NewPolicy(name, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if p.Name != name {
			t.Errorf("name = %q; want %q", p.Name, name)
		}
		d, err := p.Route(context.Background(), &Request{SessionKey: "s", PromptTokens: 10, Matched: []int{0, 0}}, eps("a", "b"), nil)
		if err != nil || len(d.Order) != 2 {
			t.Errorf("%s: route = %v, %v", name, d.Order, err)
		}
	}
	bad := []struct {
		name string
		w    Weights
	}{
		{"nope", nil},
		{PolicyWarmpath, Weights{"prefix": -1}},
		{PolicyWarmpath, Weights{"prefix": 1}},
		{PolicyPrecisePrefix, Weights{"nonsense": 1}},
		{PolicyRoundRobin, Weights{"kv": 1}},
		{PolicyLeastLoad, Weights{"queue": 0, "kv": 0, "inflight": 0}},
	}
	for _, b := range bad {
		if _, err := NewPolicy(b.name, b.w); err == nil {
			t.Errorf("NewPolicy(%q, %v) succeeded; want error", b.name, b.w)
		}
	}
	p, err := NewPolicy(PolicyPrecisePrefix, Weights{"prefix": 5, "session": 1, "queue": 0})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range p.Scorers {
		names = append(names, s.Name)
		if s.Name == "prefix" && s.Weight != 5 {
			t.Errorf("prefix weight = %v; want 5", s.Weight)
		}
	}
	slices.Sort(names)
	if want := []string{"kv", "prefix", "session"}; !slices.Equal(names, want) {
		t.Errorf("scorers = %v; want %v", names, want)
	}
}

func BenchmarkRoutePrecisePrefix64(b *testing.B) {
	p, _ := NewPolicy(PolicyPrecisePrefix, nil)
	e := make([]Endpoint, 64)
	matched := make([]int, 64)
	for i := range e {
		e[i] = Endpoint{ID: string(rune('A' + i)), Waiting: i % 5, KVUsage: float64(i) / 64, InflightPrefillTokens: int64(i * 100)}
		matched[i] = (i * 997) % 16000
	}
	r := &Request{PromptTokens: 16000, Matched: matched, Bound: "C"}
	rng := rand.New(rand.NewPCG(1, 1))
	b.ReportAllocs()
	for b.Loop() {
		_, _ = p.Route(context.Background(), r, e, rng)
	}
}

// A CPU-tier hit is worth almost a GPU hit (a load, not a prefill): the
// prefix scorer and the TTFT model rank it between a GPU hit and a cold
// endpoint (the model prefills only what neither tier holds and pays
// CPUHitCost for each loaded token), and a scored plan predicts it as cached.
func TestCPUTierHits(t *testing.T) {
	eps := []Endpoint{{ID: "gpu"}, {ID: "cpu"}, {ID: "cold"}}
	r := &Request{PromptTokens: 1000, Matched: []int{800, 200, 0}, MatchedCPU: []int{0, 600, 0}}
	if got := (Prefix{}).Score(context.Background(), r, eps); !(got[0] > got[1] && got[1] > got[2]) {
		t.Errorf("prefix scores %v; want GPU hit > CPU hit > cold", got)
	}
	wp, _ := NewPolicy(PolicyWarmpath, nil)
	win := &Input{Model: "m", Endpoints: eps, PromptTokens: 1000, BlockSize: 16, Matched: r.Matched, MatchedCPU: r.MatchedCPU}
	wplan, err := wp.Decide(win)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]Estimate{}
	for k, i := range wplan.Order {
		byID[eps[i].ID] = wplan.Estimates[k]
	}
	if g, c, z := byID["gpu"].TTFT, byID["cpu"].TTFT, byID["cold"].TTFT; !(g < c && c < z) {
		t.Errorf("estimated TTFT gpu %v, cpu %v, cold %v; want GPU hit < CPU hit < cold", g, c, z)
	}
	if got, want := byID["cpu"].UncachedTokens, int64(1000-200-576); got != want {
		t.Errorf("CPU hit's uncached prefill = %d tokens; want %d (1000 − 200 − 0.96 × 600)", got, want)
	}
	if got := (Prefix{}).Score(context.Background(), r, eps)[1]; math.Abs(got-(200+0.96*600)/1000.) > 1e-9 {
		t.Errorf("prefix score of the CPU hit = %v; want (200 + 0.96×600) ÷ 1000", got)
	}
	pol, _ := NewPolicy(PolicyPrecisePrefix, nil)
	in := &Input{Model: "m", Endpoints: []Endpoint{{ID: "a"}, {ID: "b"}}, PromptTokens: 1000, BlockSize: 16,
		Matched: []int{0, 160}, MatchedCPU: []int{0, 640}, Continues: true, BoundHolds: true}
	p, err := pol.Decide(in)
	if err != nil {
		t.Fatal(err)
	}
	if in.Endpoints[p.Chosen()].ID != "b" || p.Predicted[0] != 800 {
		t.Errorf("plan chose %s predicting %d; want b predicting 800 (160 on GPU, 640 on CPU)", in.Endpoints[p.Chosen()].ID, p.Predicted[0])
	}
}
