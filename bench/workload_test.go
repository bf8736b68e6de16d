package bench

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/vllmsim"
)

func TestRegistry(t *testing.T) {
	want := []string{"shared-prefix", "agentic", "agentic-harness", "trace", "mixed-tenants"}
	if got := Workloads(); !slices.Equal(got, want) {
		t.Fatalf("Workloads() = %v; want %v", got, want)
	}
	for _, name := range want {
		w, err := NewWorkload(name)
		if err != nil || w.Name() != name {
			t.Errorf("NewWorkload(%q) = %v, %v", name, w, err)
		}
	}
	if _, err := NewWorkload("nope"); err == nil || !strings.Contains(err.Error(), "shared-prefix") {
		t.Errorf("NewWorkload(nope) error = %v; want one listing the workloads", err)
	}
}

// firstTurns plays each session's first turn.
func firstTurns(t *testing.T, p *Plan) []Turn {
	t.Helper()
	out := make([]Turn, len(p.Sessions))
	for i, s := range p.Sessions {
		tn, ok := s.Script.Next(nil)
		if !ok {
			t.Fatalf("session %d has no first turn", i)
		}
		out[i] = tn
	}
	return out
}

func tokens(s string) int { return len(vllmsim.Tokenize(s)) }

func TestSharedPrefixShape(t *testing.T) {
	env := Env{Seed: 7, Scale: 0.1, Replicas: 8, StageScale: 0.1, KVTokens: 30733}
	p, err := (&SharedPrefix{}).Plan(env)
	if err != nil {
		t.Fatal(err)
	}
	turns := firstTurns(t, p)
	contexts := map[string]string{} // group → context
	users := map[string]bool{}
	warm, ladder := 0, 0
	for i, tn := range turns {
		s := p.Sessions[i]
		if i > 0 && s.Start < p.Sessions[i-1].Start {
			t.Fatalf("sessions not sorted at %d", i)
		}
		if len(tn.Messages) != 2 || tn.Messages[0].Role != "system" || tn.Messages[1].Role != "user" {
			t.Fatalf("turn %d messages = %+v", i, tn.Messages)
		}
		if got := tokens(tn.Messages[0].Content); got != 600 {
			t.Errorf("context tokens = %d; want 600", got)
		}
		if got := tokens(tn.Messages[1].Content); got != 120 {
			t.Errorf("question tokens = %d; want 120", got)
		}
		if tn.MaxTokens != 100 || !tn.IgnoreEOS {
			t.Errorf("max_tokens %d ignore_eos %v; want 100 true", tn.MaxTokens, tn.IgnoreEOS)
		}
		g, _, _ := strings.Cut(tn.PromptKey, "/")
		if c, ok := contexts[g]; ok && c != tn.Messages[0].Content {
			t.Errorf("group %s has two contexts", g)
		}
		contexts[g] = tn.Messages[0].Content
		users[tn.PromptKey] = true
		if s.Warmup {
			warm++
			if s.Start >= 5*time.Second {
				t.Errorf("warm-up request at %v, after the 5 s warm-up", s.Start)
			}
		} else {
			ladder++
		}
	}
	// 150 groups × 5 users; with ~1,800 requests nearly all are seen.
	if len(contexts) < 140 || len(contexts) > 150 || len(users) > 750 || len(users) < 600 {
		t.Errorf("%d groups and %d users seen; want ≤ 150 and ≤ 750, nearly all", len(contexts), len(users))
	}
	// Warm-up 15/s × 5 s = 75; ladder Σ rates (562/s) × 3 s = 1,686.
	if warm < 45 || warm > 110 {
		t.Errorf("%d warm-up requests; want about 75", warm)
	}
	if ladder < 1550 || ladder > 1820 {
		t.Errorf("%d ladder requests; want about 1,686", ladder)
	}

	// Deterministic under a seed; another seed differs.
	again, _ := (&SharedPrefix{}).Plan(env)
	if !reflect.DeepEqual(startsAndKeys(p), startsAndKeys(again)) || !reflect.DeepEqual(turns[:50], firstTurns(t, again)[:50]) {
		t.Error("same seed planned different workloads")
	}
	env.Seed = 8
	other, _ := (&SharedPrefix{}).Plan(env)
	if reflect.DeepEqual(startsAndKeys(p), startsAndKeys(other)) {
		t.Error("different seeds planned the same workload")
	}
}

func startsAndKeys(p *Plan) []string {
	var out []string
	for _, s := range p.Sessions {
		tn, _ := s.Script.Next(nil)
		out = append(out, s.Start.String()+" "+tn.PromptKey)
	}
	return out
}

func TestSharedPrefixScalesWithReplicas(t *testing.T) {
	p, err := (&SharedPrefix{}).Plan(Env{Seed: 1, Scale: 0.02, Replicas: 4, StageScale: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]bool{}
	for _, tn := range firstTurns(t, p) {
		g, _, _ := strings.Cut(tn.PromptKey, "/")
		groups[g] = true
	}
	if len(groups) > 75 || len(groups) < 70 {
		t.Errorf("%d groups on 4 replicas; want 75 (150 × 4/8)", len(groups))
	}
	// Half the rates: about half of the 8-replica request count.
	if n := len(p.Sessions); n < 800 || n > 1000 {
		t.Errorf("%d requests on 4 replicas; want about 880", n)
	}
}

func TestCutSessions(t *testing.T) {
	p, _ := (&SharedPrefix{}).Plan(Env{Seed: 1, Scale: 0.02, Replicas: 8, StageScale: 0.1, Duration: 10 * time.Second})
	if last := p.Sessions[len(p.Sessions)-1].Start; last > 10*time.Second {
		t.Errorf("last session at %v after a 10 s duration", last)
	}
	p, _ = (&SharedPrefix{}).Plan(Env{Seed: 1, Scale: 0.02, Replicas: 8, StageScale: 0.1, Limit: 17})
	if len(p.Sessions) != 17 {
		t.Errorf("%d sessions with limit 17", len(p.Sessions))
	}
}

func TestAgenticShape(t *testing.T) {
	env := Env{Seed: 3, Scale: 0.1, Replicas: 8, KVTokens: 30733}
	p, err := (&Agentic{}).Plan(env)
	if err != nil {
		t.Fatal(err)
	}
	// 78 active runs over a 200 s run length, arriving for 300 s: ~117.
	if n := len(p.Sessions); n < 80 || n > 160 {
		t.Errorf("%d runs; want about 117", n)
	}
	seen := map[string]bool{}
	for i, s := range p.Sessions[:5] {
		turns := playAgent(t, s.Script)
		if n := len(turns); n < 20 || n > 40 {
			t.Errorf("run %d: %d turns; want 20–40", i, n)
		}
		first := turns[0]
		if got := len(vllmsim.TokenizeChat(first.Messages, first.Tools, true)); got != 1500 {
			t.Errorf("run %d: opening renders %d tokens; want 1,500", i, got)
		}
		if first.Delay != 0 || len(first.Tools) == 0 || !first.WantReply || first.ToolChoice != "none" {
			t.Errorf("run %d: first turn %+v", i, first)
		}
		if seen[first.Messages[0].Content] {
			t.Errorf("run %d shares its system prompt with another run", i)
		}
		seen[first.Messages[0].Content] = true
		for k := 1; k < len(turns); k++ {
			prev, cur := turns[k-1], turns[k]
			if len(cur.Messages) != len(prev.Messages)+2 || !reflect.DeepEqual(cur.Messages[:len(prev.Messages)], prev.Messages) {
				t.Fatalf("run %d turn %d does not extend the previous turn", i, k)
			}
			reply, tool := cur.Messages[len(cur.Messages)-2], cur.Messages[len(cur.Messages)-1]
			if reply.Role != "assistant" || reply.Content != replyFor(k-1) || tool.Role != "user" {
				t.Fatalf("run %d turn %d appended %+v", i, k, cur.Messages[len(prev.Messages):])
			}
			if n := tokens(tool.Content); n < 20 || n > 60 {
				t.Errorf("tool result of %d tokens; want 20–60", n)
			}
			if cur.Delay <= 0 || cur.MaxTokens < 10 || cur.MaxTokens > 30 || !cur.IgnoreEOS {
				t.Errorf("turn %d: delay %v max_tokens %d", k, cur.Delay, cur.MaxTokens)
			}
		}
	}
	// Deterministic: two plans from one seed play the same runs.
	again, _ := (&Agentic{}).Plan(env)
	if !reflect.DeepEqual(startsOf(p), startsOf(again)) || !reflect.DeepEqual(playAgent(t, p.Sessions[7].Script), playAgent(t, again.Sessions[7].Script)) {
		t.Error("same seed planned different runs")
	}
}

func startsOf(p *Plan) []time.Duration {
	var out []time.Duration
	for _, s := range p.Sessions {
		out = append(out, s.Start)
	}
	return out
}

// replyFor is the fake reply the tests feed back after turn k.
func replyFor(k int) string { return "reply " + strings.Repeat("ba ", k%5) + "end" }

// playAgent plays a run to its end with fake replies.
func playAgent(t *testing.T, sc Script) []Turn {
	t.Helper()
	var out []Turn
	var prev *Outcome
	for k := 0; k < 100; k++ {
		tn, ok := sc.Next(prev)
		if !ok {
			return out
		}
		out = append(out, tn)
		prev = &Outcome{Reply: replyFor(k)}
	}
	t.Fatal("run never ended")
	return nil
}

func TestAgenticSizing(t *testing.T) {
	a := Agentic{}.withDefaults()
	s := a.sizing(8, 307328)
	if s.meanContext != 23700 || s.active != 78 {
		t.Errorf("mean context %v, active %d; want 23,700 and 78", s.meanContext, s.active)
	}
	if s.runLength < 150*time.Second || s.runLength > 250*time.Second {
		t.Errorf("nominal run length %v; want about 200 s", s.runLength)
	}
}

func TestMooncakeMessages(t *testing.T) {
	a := mooncakeMessages([]int64{0, 1, 2, 3}, 1800, 2, 0.1) // 52-token blocks, 180 tokens
	b := mooncakeMessages([]int64{0, 1, 2, 9, 10}, 2400, 2, 0.1)
	c := mooncakeMessages([]int64{0, 5}, 600, 2, 0.1)
	if len(a) != 3 || a[0].Role != "system" || a[1].Role != "user" || a[2].Role != "user" {
		t.Fatalf("messages = %+v", a)
	}
	if n := tokens(a[0].Content) + tokens(a[1].Content) + tokens(a[2].Content); n != 180 {
		t.Errorf("%d content tokens; want 180", n)
	}
	if tokens(a[0].Content) != 52 || tokens(a[1].Content) != 52 {
		t.Errorf("blocks of %d and %d tokens; want 52", tokens(a[0].Content), tokens(a[1].Content))
	}
	// Equal ids mean equal tokens: a and b share blocks 0–2 exactly.
	if a[0].Content != b[0].Content || a[1].Content != b[1].Content {
		t.Error("equal leading hash ids rendered differently")
	}
	ta, tb := vllmsim.Tokenize(a[2].Content), vllmsim.Tokenize(b[2].Content)
	if !slices.Equal(ta[:52], tb[:52]) || slices.Equal(ta[52:60], tb[52:60]) {
		t.Error("block 2 should match and block 3 differ")
	}
	// Same opening (block 0 and 1) ⇒ same session; c differs at block 1.
	if c[0].Content != a[0].Content || c[1].Content == a[1].Content || len(c) != 2 {
		t.Errorf("c = %+v", c)
	}
	// A prompt shorter than a block is a truncated block 0.
	d := mooncakeMessages([]int64{0}, 200, 2, 0.1)
	if len(d) != 1 || tokens(d[0].Content) != 20 || !strings.HasPrefix(a[0].Content, d[0].Content) {
		t.Errorf("short prompt = %+v", d)
	}
}

func TestReplayPlan(t *testing.T) {
	env := Env{Seed: 1, Scale: 0.1, Replicas: 8, TracePath: "testdata/mooncake_head400.jsonl", TimeScale: 0.5, Limit: 50}
	p, err := (&Replay{}).Plan(env)
	if err != nil {
		t.Fatal(err)
	}
	tr, _ := ReadTraceFile(env.TracePath)
	if len(p.Sessions) != 50 {
		t.Fatalf("%d sessions; want 50", len(p.Sessions))
	}
	for i, s := range p.Sessions {
		r := tr.Requests[i]
		if want := r.Arrival / 2; s.Start != want {
			t.Errorf("session %d starts at %v; want %v", i, s.Start, want)
		}
		tn, _ := s.Script.Next(nil)
		n := 0
		for _, m := range tn.Messages {
			n += tokens(m.Content)
		}
		if want := int(float64(r.InputTokens)*0.1 + 0.5); n != want {
			t.Errorf("session %d: %d content tokens; want %d", i, n, want)
		}
		if tn.MaxTokens < 1 || !tn.IgnoreEOS {
			t.Errorf("session %d: max_tokens %d", i, tn.MaxTokens)
		}
		if _, ok := s.Script.Next(&Outcome{}); ok {
			t.Errorf("session %d has a second turn", i)
		}
	}
	if _, err := (&Replay{}).Plan(Env{Scale: 1}); err == nil {
		t.Error("trace without a file planned")
	}
}
