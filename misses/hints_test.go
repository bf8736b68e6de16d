package misses

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 6, 21, 0, 0, 0, time.UTC)

func systemBreak(token int) Diff {
	return Diff{Kind: KindBreak, Change: ChangeEdited, Part: PartSystem, Role: "system", Token: token}
}

func TestHintsText(t *testing.T) {
	h := NewHints(HintsConfig{Examples: 100})
	h.Observe("acme", t0, Diff{Kind: KindExtends, Part: PartTail})
	for i := range 24 {
		h.Observe("acme", t0.Add(time.Duration(i)*time.Second), systemBreak(37))
	}
	got := h.Hints("acme")
	if len(got) != 1 {
		t.Fatalf("got %d hints; want 1: %+v", len(got), got)
	}
	// The extends came before the oldest break: 24 breaks in 24 turns.
	if want := "the system prompt differs at token 37 on 100 % of turns: a timestamp or id early in the prompt?"; got[0].Text != want {
		t.Errorf("got %q; want %q", got[0].Text, want)
	}
	h.Observe("acme", t0, Diff{Kind: KindExtends, Part: PartTail})
	got = h.Hints("acme")
	if want := "the system prompt differs at token 37 on 96 % of turns: a timestamp or id early in the prompt?"; got[0].Text != want {
		t.Errorf("got %q; want %q", got[0].Text, want)
	}
	if got[0].Breaks != 24 || got[0].Turns != 25 {
		t.Errorf("got %d breaks in %d turns; want 24 in 25", got[0].Breaks, got[0].Turns)
	}
}

func TestHintsGroups(t *testing.T) {
	h := NewHints(HintsConfig{})
	for range 3 {
		h.Observe("t", t0, Diff{Kind: KindBreak, Change: ChangeToolsReordered, Part: PartTools, Index: 0})
	}
	h.Observe("t", t0, Diff{Kind: KindBreak, Change: ChangeRewritten, Part: PartMessage, Index: 3, Role: "assistant", Token: 900})
	h.Observe("t", t0, systemBreak(2000))
	got := h.Hints("t")
	want := []string{
		"tool definitions reordered on 60 % of turns: send them in a fixed order (sorted by name)",
		"the system prompt differs at token 2000 on 20 % of turns: a date, counter or retrieved context inside it?",
		"an earlier assistant message is rewritten on 20 % of turns (typically message 3, token 900): the client edits, truncates or summarises its history?",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d hints %+v; want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i].Text != want[i] {
			t.Errorf("hint %d: got %q; want %q", i, got[i].Text, want[i])
		}
	}
}

func TestHintsBounded(t *testing.T) {
	h := NewHints(HintsConfig{Examples: 4, Tenants: 2})
	for i := range 10 {
		h.Observe("a", t0, systemBreak(i))
	}
	ex, compared := h.Examples("a")
	if len(ex) != 4 || compared != 10 {
		t.Fatalf("got %d examples of %d turns; want 4 of 10", len(ex), compared)
	}
	for i, e := range ex {
		if e.Diff.Token != 6+i || e.Turn != uint64(7+i) {
			t.Errorf("example %d: got token %d turn %d; want %d, %d (oldest first)", i, e.Diff.Token, e.Turn, 6+i, 7+i)
		}
	}
	h.Observe("b", t0, systemBreak(1))
	h.Observe("a", t0, systemBreak(1))
	h.Observe("c", t0, systemBreak(1)) // drops b, the least recently observed
	if ex, _ := h.Examples("b"); ex != nil {
		t.Errorf("got %d examples for b; want it dropped", len(ex))
	}
	if ex, _ := h.Examples("a"); len(ex) != 4 {
		t.Errorf("got %d examples for a; want it kept", len(ex))
	}
	if got := h.Tenants(); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("Tenants() = %q; want [a c]", got)
	}
}

func TestHintsTenantIsolation(t *testing.T) {
	h := NewHints(HintsConfig{})
	h.Observe("a", t0, systemBreak(5))
	h.Observe("b", t0, Diff{Kind: KindExtends})
	h.Observe("c", t0, Diff{Kind: KindFirst})
	if got := h.Hints("b"); got != nil {
		t.Errorf("got hints %+v for b; want none", got)
	}
	if got, n := h.Examples("c"); got != nil || n != 0 {
		t.Errorf("got %v, %d for c; want nothing (first turns are not compared)", got, n)
	}
}

func TestHintsConcurrent(t *testing.T) {
	h := NewHints(HintsConfig{Examples: 8, Tenants: 4})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 500 {
				tenant := fmt.Sprint("t", r.IntN(6))
				h.Observe(tenant, t0, systemBreak(i))
				if i%50 == 0 {
					for _, hint := range h.Hints(tenant) {
						if hint.Share <= 0 || hint.Share > 1 {
							t.Errorf("share %v out of (0, 1]", hint.Share)
						}
					}
				}
			}
		})
	}
	wg.Wait()
}

// TestClientsDiagnosed drives Locate and Hints with four clients over a
// conversation of several turns: one stamps the time into its system
// prompt, one shuffles its tools, one rewrites an earlier message, one
// only appends.
func TestClientsDiagnosed(t *testing.T) {
	clients := map[string]struct {
		turn func(n int) []byte
		want string // a hint's prefix; "" for no hints
	}{
		"timestamp": {func(n int) []byte {
			return chatBody(t, weatherTools, conversation(n, fmt.Sprintf("Current date and time: 2026-12-06 21:%02d:%02d. %s", n, 7*n%60, sysPrompt), false)...)
		}, "the system prompt differs at token"},
		"shuffler": {func(n int) []byte {
			r := rand.New(rand.NewPCG(uint64(n), 9))
			tools := append([]string(nil), weatherTools...)
			for tools[0] == weatherTools[0] {
				r.Shuffle(len(tools), func(i, j int) { tools[i], tools[j] = tools[j], tools[i] })
			}
			return chatBody(t, tools, conversation(n, sysPrompt, false)...)
		}, "tool definitions reordered on 100 % of turns"},
		"rewriter": {func(n int) []byte {
			return chatBody(t, weatherTools, conversation(n, sysPrompt, true)...)
		}, "an earlier user message is rewritten on 100 % of turns"},
		"appender": {func(n int) []byte {
			return chatBody(t, weatherTools, conversation(n, sysPrompt, false)...)
		}, ""},
	}
	h := NewHints(HintsConfig{})
	for name, c := range clients {
		var prev *Fingerprint
		for n := 1; n <= 6; n++ {
			p := mustPrompt(t, c.turn(n))
			d := Locate(prev, p, Options{})
			h.Observe(name, t0, d)
			prev = p.Fingerprint(Options{})
		}
		got := h.Hints(name)
		switch {
		case c.want == "" && got != nil:
			t.Errorf("%s: got hints %+v; want none", name, got)
		case c.want != "" && (len(got) != 1 || !strings.HasPrefix(got[0].Text, c.want)):
			t.Errorf("%s: got hints %+v; want one starting %q", name, got, c.want)
		}
		if c.want != "" {
			t.Logf("%s: %s", name, got[0].Text)
		}
	}
}

// conversation returns turn n of a coding-agent conversation; rewrite
// makes the client re-word its first question every turn.
func conversation(n int, system string, rewrite bool) []msg {
	first := "Why does the build fail on main?"
	if rewrite && n > 1 {
		first = fmt.Sprintf("Why does the build fail on main? (context trimmed, turn %d)", n)
	}
	ms := []msg{{"system", system}, {"user", first}}
	for i := 1; i < n; i++ {
		ms = append(ms, msg{"assistant", fmt.Sprintf("Step %d: I looked at the Makefile and the linker flags.", i)},
			msg{"user", fmt.Sprintf("Go on with step %d.", i+1)})
	}
	return ms
}
