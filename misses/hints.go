package misses

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// Defaults of HintsConfig.
const (
	DefaultHintExamples = 64
	DefaultHintTenants  = 1024
	DefaultBucketTokens = 64
	DefaultEarlyTokens  = 256
)

// HintsConfig configures Hints. The zero value is valid: every field has
// a default.
type HintsConfig struct {
	// Examples is how many breaks each tenant keeps, the newest; default
	// DefaultHintExamples.
	Examples int
	// Tenants is how many tenants are kept; observing one more drops the
	// least recently observed. Default DefaultHintTenants.
	Tenants int
	// BucketTokens is the width of the token-offset buckets breaks are
	// grouped by; default DefaultBucketTokens.
	BucketTokens int
	// EarlyTokens is the token offset before which a system-prompt break
	// reads as early (a timestamp or id?); default DefaultEarlyTokens.
	EarlyTokens int
}

func (c HintsConfig) withDefaults() HintsConfig {
	if c.Examples <= 0 {
		c.Examples = DefaultHintExamples
	}
	if c.Tenants <= 0 {
		c.Tenants = DefaultHintTenants
	}
	if c.BucketTokens <= 0 {
		c.BucketTokens = DefaultBucketTokens
	}
	if c.EarlyTokens <= 0 {
		c.EarlyTokens = DefaultEarlyTokens
	}
	return c
}

// Example is one kept break.
type Example struct {
	// At is when it was observed (the caller's clock).
	At time.Time
	// Turn numbers the tenant's compared turns: the first is 1.
	Turn uint64
	Diff Diff
}

// Hint is one group of a tenant's breaks in plain language.
type Hint struct {
	Part   Part
	Change Change
	// Role is the role of rewritten messages ("" for other parts).
	Role string
	// Token and Index are the group's median token offset and message or
	// tool index.
	Token, Index int
	// Breaks is how many kept breaks fall in the group, of Turns compared
	// turns since the oldest kept break; Share is their ratio.
	Breaks, Turns int
	Share         float64
	// Text says it in a sentence, with a guess at the reason.
	Text string
}

// Hints keeps each tenant's recent prefix breaks and explains them. The
// zero value is not valid; use NewHints. Its memory is bounded by
// Tenants × Examples examples (each a few hundred bytes, plus its
// excerpt when excerpts are on). A Hints is safe for concurrent use.
type Hints struct {
	cfg HintsConfig

	mu      sync.Mutex // guards tenants and seq
	tenants map[string]*ring
	seq     uint64 // counts observations, to find the least recently observed tenant
}

// ring is one tenant's kept breaks.
type ring struct {
	ex       []Example // a ring once full; next is the oldest
	next     int
	compared uint64 // compared turns observed
	last     uint64 // Hints.seq at the last observation
}

// NewHints returns an empty Hints.
func NewHints(cfg HintsConfig) *Hints {
	return &Hints{cfg: cfg.withDefaults(), tenants: map[string]*ring{}}
}

// Observe records tenant's turn compared by Locate at time at: a break is
// kept as an example, any other compared turn is counted; KindFirst (no
// previous turn) is ignored.
func (h *Hints) Observe(tenant string, at time.Time, d Diff) {
	if d.Kind == KindFirst {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	r := h.tenants[tenant]
	if r == nil {
		if len(h.tenants) >= h.cfg.Tenants {
			h.dropOldest()
		}
		r = &ring{}
		h.tenants[strings.Clone(tenant)] = r // the caller's string may alias a request body
	}
	r.last = h.seq
	r.compared++
	if !d.Broke() {
		return
	}
	e := Example{At: at, Turn: r.compared, Diff: d}
	if len(r.ex) < h.cfg.Examples {
		r.ex = append(r.ex, e)
		return
	}
	r.ex[r.next] = e
	r.next = (r.next + 1) % len(r.ex)
}

// dropOldest forgets the least recently observed tenant.
func (h *Hints) dropOldest() {
	var victim string
	oldest := uint64(math.MaxUint64)
	for t, r := range h.tenants {
		if r.last < oldest {
			victim, oldest = t, r.last
		}
	}
	delete(h.tenants, victim)
}

// Examples returns tenant's kept breaks, oldest first, and how many turns
// it has compared in all.
func (h *Hints) Examples(tenant string) ([]Example, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.tenants[tenant]
	if r == nil {
		return nil, 0
	}
	out := make([]Example, 0, len(r.ex))
	out = append(out, r.ex[r.next:]...)
	return append(out, r.ex[:r.next]...), r.compared
}

// Tenants returns the tenants kept, sorted.
func (h *Hints) Tenants() []string {
	h.mu.Lock()
	out := make([]string, 0, len(h.tenants))
	for t := range h.tenants {
		out = append(out, t)
	}
	h.mu.Unlock()
	slices.Sort(out)
	return out
}

// hintKey groups breaks: by part and change; system-prompt edits also by
// token bucket, tool edits by tool, rewritten messages by role.
type hintKey struct {
	part   Part
	change Change
	role   string
	bucket int
}

func (h *Hints) keyOf(d Diff) hintKey {
	k := hintKey{part: d.Part, change: d.Change}
	switch {
	case d.Part == PartSystem && d.Change == ChangeEdited, d.Change == ChangeTemplate:
		k.bucket = d.Token / h.cfg.BucketTokens
	case d.Part == PartTools && d.Change == ChangeEdited:
		k.bucket = d.Index
	case d.Part == PartMessage && d.Change == ChangeRewritten:
		k.role = d.Role
	}
	return k
}

// Hints returns tenant's breaks grouped and explained, the most frequent
// group first; nil when it has no kept breaks.
func (h *Hints) Hints(tenant string) []Hint {
	ex, compared := h.Examples(tenant)
	if len(ex) == 0 {
		return nil
	}
	turns := int(compared - ex[0].Turn + 1)
	groups := map[hintKey][]Diff{}
	for _, e := range ex {
		k := h.keyOf(e.Diff)
		groups[k] = append(groups[k], e.Diff)
	}
	out := make([]Hint, 0, len(groups))
	for k, ds := range groups {
		hint := Hint{Part: k.part, Change: k.change, Role: k.role, Breaks: len(ds), Turns: turns,
			Share: float64(len(ds)) / float64(turns)}
		hint.Token = median(ds, func(d Diff) int { return d.Token })
		hint.Index = median(ds, func(d Diff) int { return d.Index })
		hint.Text = h.text(hint)
		out = append(out, hint)
	}
	slices.SortFunc(out, func(a, b Hint) int {
		return cmp.Or(cmp.Compare(b.Breaks, a.Breaks), cmp.Compare(a.Part, b.Part), cmp.Compare(a.Change, b.Change),
			cmp.Compare(a.Token, b.Token), cmp.Compare(a.Role, b.Role))
	})
	return out
}

func median(ds []Diff, f func(Diff) int) int {
	v := make([]int, len(ds))
	for i, d := range ds {
		v[i] = f(d)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// text says a hint in a sentence.
func (h *Hints) text(g Hint) string {
	pct := fmt.Sprintf("%d %%", int(math.Round(g.Share*100)))
	switch {
	case g.Part == PartSystem && g.Change == ChangeEdited && g.Token < h.cfg.EarlyTokens:
		return fmt.Sprintf("the system prompt differs at token %d on %s of turns: a timestamp or id early in the prompt?", g.Token, pct)
	case g.Part == PartSystem && g.Change == ChangeEdited:
		return fmt.Sprintf("the system prompt differs at token %d on %s of turns: a date, counter or retrieved context inside it?", g.Token, pct)
	case g.Change == ChangeToolsReordered:
		return fmt.Sprintf("tool definitions reordered on %s of turns: send them in a fixed order (sorted by name)", pct)
	case g.Part == PartTools && g.Change == ChangeEdited:
		return fmt.Sprintf("tool definition %d differs on %s of turns: a description or schema that changes between turns?", g.Index, pct)
	case g.Part == PartMessage && g.Change == ChangeRewritten:
		return fmt.Sprintf("an earlier %s message is rewritten on %s of turns (typically message %d, token %d): the client edits, truncates or summarises its history?",
			g.Role, pct, g.Index, g.Token)
	case g.Change == ChangeTemplate:
		return fmt.Sprintf("the request extends the previous one, but its tokens differ at token %d on %s of turns: the chat template renders an earlier turn differently (reasoning stripped?)", g.Token, pct)
	case g.Change == ChangeInserted:
		return fmt.Sprintf("a %s part appears before the previous turn's end on %s of turns: added system messages, tools or messages?", g.Part, pct)
	case g.Change == ChangeRemoved:
		return fmt.Sprintf("a %s part of the previous turn is gone on %s of turns: dropped system messages, tools or messages?", g.Part, pct)
	}
	return fmt.Sprintf("the %s part changes on %s of turns", g.Part, pct)
}
