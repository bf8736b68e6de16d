package session

import (
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/warmpath/warmpath/scoring"
)

// The rules of a binding's life, shared by the gateway and the offline
// analyzer (bench.Analyze): pure functions of the binding, the plan and
// the time they are given, with no Redis and no clock.

// Live reports whether b is still in force at now: a binding expires ttl
// after its last write (Updated).
func (b Binding) Live(now time.Time, ttl time.Duration) bool {
	return now.Sub(b.Updated) <= ttl
}

// After returns the binding in force after a turn routed by plan, given
// the binding the turn looked up (zero when none) and the block keys of
// the turn's prompt (full blocks only, as the prefix index keys them);
// false when the plan leaves none to write (a scored turn of a session
// the policy does not bind). A sticky turn keeps the looked-up binding's
// tip and fingerprint with the plan's routing part; a scored turn starts
// a new binding whose tip is the prompt's deepest full block. Updated is
// left for the writer: the store stamps it when it writes.
func After(plan *scoring.Plan, prev Binding, keys []uint64) (Binding, bool) {
	if plan.Reason == scoring.ReasonSticky {
		prev.Binding = plan.Binding
		return prev, true
	}
	if plan.Bind == scoring.BindKeep {
		return Binding{}, false
	}
	nb := Binding{Binding: plan.Binding}
	nb.SetTip(keys)
	return nb, true
}

// SetTip records the deepest of a prompt's block keys (full blocks only)
// as the binding's tip, at the depth of their count; no keys leave the tip
// as it is.
func (b *Binding) SetTip(keys []uint64) {
	if len(keys) > 0 {
		b.TipKey, b.TipDepth = keys[len(keys)-1], len(keys)
	}
}

// Fingerprint records text as the conversation the binding was made for
// (TextLen and TextHash), for Continues.
func (b *Binding) Fingerprint(text []byte) {
	b.TextLen, b.TextHash = len(text), xxhash.Sum64(text)
}

// Continues reports whether text continues the conversation the binding
// fingerprinted: it starts with the same TextLen bytes. Bindings without
// a fingerprint continue anything.
func (b Binding) Continues(text []byte) bool {
	if b.TextLen == 0 {
		return true
	}
	return len(text) >= b.TextLen && xxhash.Sum64(text[:b.TextLen]) == b.TextHash
}

// StillHeld reports whether the bound replica still holds the session's
// prefix, given holds, which tells whether it holds the block with a key:
// a binding without a tip is trusted (nothing to check).
func (b Binding) StillHeld(holds func(key uint64) bool) bool {
	return b.TipDepth == 0 || holds(b.TipKey)
}

// Completed records what replica holds of the session once a turn of
// promptTokens and completionTokens completed there: the prompt, and the
// output but for its last token (whose KV is never computed). It reports
// false, changing nothing, when the binding names another replica (the
// session was rebound meanwhile).
func (b *Binding) Completed(replica string, promptTokens, completionTokens int) bool {
	if b.Replica != replica {
		return false
	}
	generated := max(0, completionTokens-1)
	b.CachedTokens, b.GeneratedTokens = promptTokens+generated, generated
	return true
}
