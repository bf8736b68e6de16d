package misses

import (
	"fmt"
	"testing"
)

// timestamped is turn n of a conversation whose client stamps the time
// into its system prompt, so that its session key changes every turn.
func timestamped(t testing.TB, conv string, n int) *Prompt {
	sys := fmt.Sprintf("Now: 2026-12-06 21:%02d. %s", n, sysPrompt)
	ms := []msg{{"system", sys}, {"user", "Question about " + conv}}
	for i := 1; i < n; i++ {
		ms = append(ms, msg{"assistant", fmt.Sprintf("Answer %d about %s.", i, conv)}, msg{"user", "And then?"})
	}
	return mustPrompt(t, chatBody(t, weatherTools, ms...))
}

func TestRecentFindsPreviousTurn(t *testing.T) {
	r := NewRecent(RecentConfig{})
	// Two conversations of one tenant interleaved, and a third of
	// another tenant identical to the first.
	for n := 1; n <= 5; n++ {
		for _, c := range []struct{ tenant, conv string }{{"acme", "billing"}, {"acme", "search"}, {"other", "billing"}} {
			p := timestamped(t, c.conv, n)
			prev, d := r.Find(c.tenant, "", p, Options{})
			if n == 1 {
				if prev != nil || d.Kind != KindFirst {
					t.Errorf("%s/%s turn 1: got %v; want no previous turn", c.tenant, c.conv, d.Kind)
				}
			} else if prev == nil || d.Kind != KindBreak || d.Part != PartSystem || d.Change != ChangeEdited {
				t.Errorf("%s/%s turn %d: got %v %v %v; want a system-prompt break", c.tenant, c.conv, n, d.Kind, d.Part, d.Change)
			} else if want := timestamped(t, c.conv, n-1).Fingerprint(Options{}); prev.Parts[len(prev.Parts)-1].Index != want.Parts[len(want.Parts)-1].Index {
				t.Errorf("%s/%s turn %d: found a prompt of %d parts; want the previous turn's %d", c.tenant, c.conv, n, len(prev.Parts), len(want.Parts))
			}
			r.Add(c.tenant, "", p.Fingerprint(Options{}))
		}
	}
}

func TestRecentPrefersExtendingAndFamily(t *testing.T) {
	r := NewRecent(RecentConfig{})
	a := mustPrompt(t, chatBody(t, nil, turn1...))
	b := mustPrompt(t, chatBody(t, nil, append([]msg{{"system", "other"}}, turn1[1:]...)...))
	r.Add("t", "fam-b", b.Fingerprint(Options{}))
	r.Add("t", "fam-a", a.Fingerprint(Options{}))
	cur := mustPrompt(t, chatBody(t, nil, turn2...))
	if _, d := r.Find("t", "fam-b", cur, Options{}); d.Kind != KindExtends {
		t.Errorf("got %v; want the prompt the turn extends, whatever its family", d.Kind)
	}
	c := mustPrompt(t, chatBody(t, nil, append([]msg{{"system", "third"}}, turn1[1:]...)...))
	r.Add("t", "fam-c", c.Fingerprint(Options{}))
	broken := mustPrompt(t, chatBody(t, nil, append([]msg{{"system", "fourth"}}, turn2[1:]...)...))
	for _, fam := range []string{"fam-b", "fam-c"} {
		prev, d := r.Find("t", fam, broken, Options{})
		want := map[string]*Prompt{"fam-b": b, "fam-c": c}[fam].Fingerprint(Options{})
		if d.Kind != KindBreak || prev == nil || prev.Parts[0].Hash != want.Parts[0].Hash {
			t.Errorf("family %s: got %v; want its own prompt on a tie", fam, d.Kind)
		}
	}
}

func TestRecentBounded(t *testing.T) {
	fp := timestamped(t, "x", 3).Fingerprint(Options{})
	r := NewRecent(RecentConfig{MaxBytes: 5 * fp.Size()})
	for i := range 40 {
		r.Add(fmt.Sprint("t", i%3), "", timestamped(t, fmt.Sprint("c", i), 3).Fingerprint(Options{}))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := 0
	for _, l := range r.byAnchor {
		ids += len(l)
	}
	if r.used > 5*fp.Size() || 2*len(r.byID) != ids || r.order.Len() != len(r.byID) {
		t.Errorf("got %d bytes, %d prompts, %d anchors, %d in order; want at most %d bytes, two anchors a prompt",
			r.used, len(r.byID), ids, r.order.Len(), 5*fp.Size())
	}
}

func TestRecentFindsRewriter(t *testing.T) {
	r := NewRecent(RecentConfig{})
	for n := 1; n <= 4; n++ {
		p := mustPrompt(t, chatBody(t, weatherTools, conversation(n, sysPrompt, true)...))
		_, d := r.Find("t", "", p, Options{})
		if n > 2 && (d.Kind != KindBreak || d.Change != ChangeRewritten || d.Index != 1) {
			t.Errorf("turn %d: got %v %v message %d; want message 1 rewritten", n, d.Kind, d.Change, d.Index)
		}
		r.Add("t", "", p.Fingerprint(Options{}))
	}
}
