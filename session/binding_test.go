package session

import (
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/warmpath/warmpath/scoring"
)

func TestBindingLive(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ttl := 30 * time.Minute
	tests := []struct {
		name string
		now  time.Time
		want bool
	}{
		{"just written", t0, true},
		{"inside the TTL", t0.Add(ttl - time.Millisecond), true},
		{"exactly the TTL", t0.Add(ttl), true},
		{"past the TTL", t0.Add(ttl + time.Millisecond), false},
		{"clock behind the write", t0.Add(-time.Minute), true},
	}
	for _, tt := range tests {
		b := Binding{Binding: scoring.Binding{Replica: "a", Updated: t0}}
		if got := b.Live(tt.now, ttl); got != tt.want {
			t.Errorf("%s: Live = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestAfter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	prev := Binding{
		Binding: scoring.Binding{Replica: "a", TipDepth: 3, CachedTokens: 300, GeneratedTokens: 20, PromptTokens: 280, Turns: 2, Updated: t0},
		TipKey:  0xabc, TextLen: 12, TextHash: 0x77,
	}
	stickyPlan := scoring.Binding{Replica: "a", TipDepth: 3, CachedTokens: 300, GeneratedTokens: 20, PromptTokens: 280, Turns: 3, Updated: t0}
	scored := scoring.Binding{Replica: "b", PromptTokens: 500, PromptBytes: 2000, Turns: 3}
	keys := []uint64{11, 22, 33, 44}
	tests := []struct {
		name   string
		plan   scoring.Plan
		prev   Binding
		keys   []uint64
		want   Binding
		wantOK bool
	}{
		{"sticky keep: the plan's routing part, the old tip and fingerprint",
			scoring.Plan{Reason: scoring.ReasonSticky, Bind: scoring.BindKeep, Binding: stickyPlan}, prev, keys,
			Binding{Binding: stickyPlan, TipKey: 0xabc, TextLen: 12, TextHash: 0x77}, true},
		{"sticky refresh: the same",
			scoring.Plan{Reason: scoring.ReasonSticky, Bind: scoring.BindRefresh, Binding: stickyPlan}, prev, nil,
			Binding{Binding: stickyPlan, TipKey: 0xabc, TextLen: 12, TextHash: 0x77}, true},
		{"scored, unbound policy: nothing",
			scoring.Plan{Reason: scoring.ReasonScored, Bind: scoring.BindKeep, Binding: scored}, prev, keys,
			Binding{}, false},
		{"first turn: tip is the deepest full block",
			scoring.Plan{Reason: scoring.ReasonScored, Bind: scoring.BindNew, Binding: scored}, Binding{}, keys,
			Binding{Binding: scoring.Binding{Replica: "b", PromptTokens: 500, PromptBytes: 2000, Turns: 3, TipDepth: 4}, TipKey: 44}, true},
		{"rebind: nothing of the old binding survives",
			scoring.Plan{Reason: scoring.ReasonScored, Bind: scoring.BindReplace, Binding: scored}, prev, keys[:2],
			Binding{Binding: scoring.Binding{Replica: "b", PromptTokens: 500, PromptBytes: 2000, Turns: 3, TipDepth: 2}, TipKey: 22}, true},
		{"rebind without keys: no tip",
			scoring.Plan{Reason: scoring.ReasonScored, Bind: scoring.BindReplace, Binding: scored}, prev, nil,
			Binding{Binding: scored}, true},
	}
	for _, tt := range tests {
		got, ok := After(&tt.plan, tt.prev, tt.keys)
		if ok != tt.wantOK || got != tt.want {
			t.Errorf("%s: After = %+v, %v; want %+v, %v", tt.name, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestFingerprintContinues(t *testing.T) {
	var b Binding
	if !b.Continues([]byte("anything")) {
		t.Error("a binding without a fingerprint must continue anything")
	}
	b.Fingerprint([]byte("system:x|user:hi"))
	if b.TextLen != 16 || b.TextHash != xxhash.Sum64String("system:x|user:hi") {
		t.Fatalf("Fingerprint = %d, %x", b.TextLen, b.TextHash)
	}
	tests := []struct {
		text string
		want bool
	}{
		{"system:x|user:hi", true},
		{"system:x|user:hi|assistant:hello|user:more", true},
		{"system:x|user:h", false},                  // shorter
		{"system:y|user:hi|assistant:hello", false}, // another conversation
		{"", false},
	}
	for _, tt := range tests {
		if got := b.Continues([]byte(tt.text)); got != tt.want {
			t.Errorf("Continues(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

func TestStillHeld(t *testing.T) {
	tests := []struct {
		name       string
		b          Binding
		held       bool
		want, asks bool
	}{
		{"no tip: trusted, nothing asked", Binding{}, false, true, false},
		{"tip held", Binding{Binding: scoring.Binding{TipDepth: 2}, TipKey: 9}, true, true, true},
		{"tip evicted", Binding{Binding: scoring.Binding{TipDepth: 2}, TipKey: 9}, false, false, true},
	}
	for _, tt := range tests {
		asked := false
		got := tt.b.StillHeld(func(k uint64) bool {
			asked = true
			if k != tt.b.TipKey {
				t.Errorf("%s: asked about key %d, want the tip %d", tt.name, k, tt.b.TipKey)
			}
			return tt.held
		})
		if got != tt.want || asked != tt.asks {
			t.Errorf("%s: StillHeld = %v (asked %v), want %v (asked %v)", tt.name, got, asked, tt.want, tt.asks)
		}
	}
}

func TestCompleted(t *testing.T) {
	base := Binding{Binding: scoring.Binding{Replica: "a", CachedTokens: 100, GeneratedTokens: 7, Turns: 2}, TipKey: 5}
	tests := []struct {
		name                string
		replica             string
		prompt, completion  int
		wantOK              bool
		wantCached, wantGen int
	}{
		{"prompt and output but its last token", "a", 400, 50, true, 449, 49},
		{"one output token computes no KV", "a", 400, 1, true, 400, 0},
		{"no output", "a", 512, 0, true, 512, 0},
		{"rebound meanwhile", "b", 400, 50, false, 100, 7},
	}
	for _, tt := range tests {
		b := base
		ok := b.Completed(tt.replica, tt.prompt, tt.completion)
		if ok != tt.wantOK || b.CachedTokens != tt.wantCached || b.GeneratedTokens != tt.wantGen {
			t.Errorf("%s: Completed = %v, cached %d generated %d; want %v, %d, %d",
				tt.name, ok, b.CachedTokens, b.GeneratedTokens, tt.wantOK, tt.wantCached, tt.wantGen)
		}
		if b.Replica != "a" || b.TipKey != 5 || b.Turns != 2 {
			t.Errorf("%s: Completed changed other fields: %+v", tt.name, b)
		}
	}
}

func TestSetTip(t *testing.T) {
	tests := []struct {
		keys      []uint64
		wantKey   uint64
		wantDepth int
	}{
		{[]uint64{4, 5, 6}, 6, 3},
		{[]uint64{9}, 9, 1},
		{nil, 0xabc, 7}, // no keys: the tip stays
	}
	for _, tt := range tests {
		b := Binding{Binding: scoring.Binding{TipDepth: 7}, TipKey: 0xabc}
		b.SetTip(tt.keys)
		if b.TipKey != tt.wantKey || b.TipDepth != tt.wantDepth {
			t.Errorf("SetTip(%v) = %x at %d, want %x at %d", tt.keys, b.TipKey, b.TipDepth, tt.wantKey, tt.wantDepth)
		}
	}
}
