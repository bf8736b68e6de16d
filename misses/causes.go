package misses

import (
	"slices"

	"github.com/warmpath/warmpath/scoring"
)

// Cause is why an uncached prompt token was not served from cache.
type Cause uint8

// The causes, in the order of Causes.
const (
	CauseNew         Cause = iota // beyond anything the session or any replica held: unavoidable
	CauseClientBreak              // the session's previous prompt covered it, but the client changed the prefix
	CauseEvicted                  // the session's prefix was gone from its replica: capacity
	CauseRoutedAway               // another replica held it, or the session was moved off its replica
	CauseStaleIndex               // the index predicted it cached on the chosen replica, but it was not
	CauseColdReplica              // the replica joined or restarted, or the session's replica was lost
	NumCauses                     // the number of causes
)

var causeNames = [NumCauses]string{"new", "client_prefix_break", "evicted", "routed_away", "stale_index", "cold_replica"}

// String returns the cause's name, the value of the metric's cause label.
func (c Cause) String() string {
	if c < NumCauses {
		return causeNames[c]
	}
	return "unknown"
}

// Causes holds a request's uncached prompt tokens by cause, indexed by
// Cause.
type Causes [NumCauses]int

// Total returns the sum over causes: the request's uncached tokens.
func (c Causes) Total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// Route says how the routing decision treated the session's replica.
type Route uint8

// The routes of a Turn.
const (
	RouteStayed Route = iota // the session stayed on its replica, or had none
	RouteAway                // the session was moved off its replica that was still there: load, a reserve, a rescoring
	RouteLost                // the session's replica is gone or down
)

// RouteOf maps a routing plan's rebind reason (scoring.Plan.Rebind) to a
// Route. Leaving a replica because it no longer held the prefix
// (evicted) or because the turn diverged is RouteStayed: the routing did
// not cost the session its cache.
func RouteOf(rebind string) Route {
	switch rebind {
	case scoring.RebindGone, scoring.RebindUnhealthy:
		return RouteLost
	case scoring.RebindReserved, scoring.RebindSaturated, scoring.RebindRescored:
		return RouteAway
	}
	return RouteStayed
}

// Turn is what Split needs to know about one answered request. All
// counts are prompt tokens from the prompt's start.
type Turn struct {
	// Prompt and Cached are the usage the replica reported.
	Prompt, Cached int
	// Previous is the length of the session's previous prompt, and
	// Matched how many of this prompt's leading tokens still equal it
	// (Diff.Previous and Diff.Matched); both 0 without a previous turn.
	Previous, Matched int
	// Predicted is the prefix the index predicted cached on the chosen
	// replica; BestOther the longest prefix the index knew cached on any
	// other replica.
	Predicted, BestOther int
	// Fresh reports that the chosen replica joined or restarted after
	// the session's previous turn.
	Fresh bool
	// Route is how routing treated the session's replica.
	Route Route
	// BlockTokens is the engine's KV block size in tokens; 0 counts in
	// tokens. Engines cache whole blocks only, so Split rounds Previous
	// and Matched down to whole blocks: the tokens of a partial block
	// could not have been cached.
	BlockTokens int
}

// Split divides t's uncached prompt tokens among causes by the rules of
// the package doc. Its result sums to max(0, Prompt) − Cached, with
// Cached clamped to [0, max(0, Prompt)].
func Split(t Turn) Causes {
	if b := t.BlockTokens; b > 0 {
		t.Previous, t.Matched = t.Previous/b*b, t.Matched/b*b
	}
	p := max(0, t.Prompt)
	c := min(max(0, t.Cached), p)
	clamp := func(v int) int { return min(max(v, c), p) }
	cuts := [...]int{c, clamp(t.Predicted), clamp(t.BestOther), clamp(t.Matched), clamp(t.Previous), p}
	slices.Sort(cuts[:])
	var out Causes
	for i := 1; i < len(cuts); i++ {
		if cuts[i] > cuts[i-1] {
			out[causeAt(t, cuts[i-1])] += cuts[i] - cuts[i-1]
		}
	}
	return out
}

// causeAt is the cause of the uncached token at position pos: the first
// rule of the package doc that holds. It is constant between Split's
// cuts, since each rule compares pos with one of them.
func causeAt(t Turn, pos int) Cause {
	switch {
	case pos < t.Predicted && t.Fresh:
		return CauseColdReplica
	case pos < t.Predicted:
		return CauseStaleIndex
	case pos < t.BestOther:
		return CauseRoutedAway
	case pos < t.Matched && (t.Fresh || t.Route == RouteLost):
		return CauseColdReplica
	case pos < t.Matched && t.Route == RouteAway:
		return CauseRoutedAway
	case pos < t.Matched:
		return CauseEvicted
	case pos < t.Previous:
		return CauseClientBreak
	}
	return CauseNew
}
