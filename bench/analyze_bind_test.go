package bench

import (
	"testing"
	"time"

	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/session"
)

// TestAnalyzeRemember pins the binding each kind of plan leaves behind in
// the analyzer, including where it deliberately differs from the gateway
// (see remember): a sticky turn's cached tokens are its prompt's full
// blocks, counted at the decision, and Updated moves only when the plan
// writes.
func TestAnalyzeRemember(t *testing.T) {
	const bt = 16
	t0, now := time.Unix(100, 0), time.Unix(400, 0)
	keys := []uint64{1, 2, 3, 4} // dense ids 0..3, the last block partial
	prev := binding{Binding: session.Binding{
		Binding: scoring.Binding{Replica: "replica-1", TipDepth: 2, CachedTokens: 40, Turns: 2, Updated: t0},
		TipKey:  2,
	}, done: 50}
	stuck := prev.Binding.Binding
	stuck.Turns = 3
	scored := scoring.Binding{Replica: "replica-2", PromptTokens: 60, Turns: 3}
	tests := []struct {
		name  string
		plan  scoring.Plan
		want  binding
		wrote bool
	}{
		{"sticky, no refresh: cached grows, Updated stays",
			scoring.Plan{Reason: scoring.ReasonSticky, Bind: scoring.BindKeep, Binding: stuck},
			binding{Binding: session.Binding{Binding: with(stuck, func(b *scoring.Binding) { b.CachedTokens = 3 * bt }), TipKey: 2}, done: 90}, true},
		{"sticky refresh: Updated is the decision's time",
			scoring.Plan{Reason: scoring.ReasonSticky, Bind: scoring.BindRefresh, Binding: stuck},
			binding{Binding: session.Binding{Binding: with(stuck, func(b *scoring.Binding) { b.CachedTokens, b.Updated = 3*bt, now }), TipKey: 2}, done: 90}, true},
		{"rebind: tip is the last full block",
			scoring.Plan{Reason: scoring.ReasonScored, Bind: scoring.BindReplace, Binding: scored},
			binding{Binding: session.Binding{Binding: with(scored, func(b *scoring.Binding) { b.TipDepth, b.Updated = 3, now }), TipKey: 3}, done: 90}, true},
		{"scored without a binding to write: nothing",
			scoring.Plan{Reason: scoring.ReasonScored, Bind: scoring.BindKeep, Binding: scored}, prev, false},
	}
	for _, tt := range tests {
		bindings := map[string]binding{"s": prev}
		remember(bindings, "s", &tt.plan, prev, keys, 3, bt, now, 90)
		if got := bindings["s"]; got != tt.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tt.name, got, tt.want)
		}
	}
}

func with(b scoring.Binding, f func(*scoring.Binding)) scoring.Binding {
	f(&b)
	return b
}

func TestAnalyzeLookupExpires(t *testing.T) {
	pol, err := scoring.NewPolicy(scoring.PolicyWarmpath, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(100, 0)
	b := binding{Binding: session.Binding{Binding: scoring.Binding{Replica: "replica-0", Updated: t0}}}
	bindings := map[string]binding{"s": b}
	if _, ok := lookup(bindings, pol, "s", t0.Add(sessionTTL)); !ok {
		t.Error("a binding is live until sessionTTL after its last write")
	}
	if _, ok := lookup(bindings, pol, "", t0); ok {
		t.Error("a request without a session key has no binding")
	}
	if _, ok := lookup(bindings, pol, "s", t0.Add(sessionTTL+time.Millisecond)); ok {
		t.Error("a binding past sessionTTL is still found")
	}
	if _, ok := bindings["s"]; ok {
		t.Error("an expired binding is not dropped")
	}
}
