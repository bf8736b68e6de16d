package gateway

import (
	"errors"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
	"github.com/warmpath/warmpath/misses"
	"github.com/warmpath/warmpath/tenancy"
)

// PrefixBreaks is the answer of GET /admin/tenants/{tenant}/prefix-breaks:
// a tenant's recent prefix breaks, as this gateway process saw them, and
// what they have in common.
type PrefixBreaks struct {
	Tenant string `json:"tenant"`
	// Turns is how many of the tenant's turns were compared with a
	// previous turn since this process started.
	Turns uint64 `json:"turns"`
	// Hints group the kept breaks, the most frequent first.
	Hints []BreakHint `json:"hints"`
	// Examples are the kept breaks, newest first.
	Examples []BreakExample `json:"examples"`
}

// BreakHint is one group of breaks in plain language (misses.Hint).
type BreakHint struct {
	Text   string  `json:"text"`
	Part   string  `json:"part"`
	Change string  `json:"change"`
	Role   string  `json:"role,omitempty"`
	Token  int     `json:"token"`
	Index  int     `json:"index"`
	Breaks int     `json:"breaks"`
	Turns  int     `json:"turns"`
	Share  float64 `json:"share"`
}

// BreakExample is one kept break (misses.Diff): where the turn's prompt
// first differs from its previous turn's. Excerpt is set only for tenants
// that opted in (break_excerpts).
type BreakExample struct {
	Time     time.Time `json:"time"`
	Turn     uint64    `json:"turn"`
	Part     string    `json:"part"`
	Change   string    `json:"change"`
	Index    int       `json:"index"`
	Role     string    `json:"role,omitempty"`
	Offset   int       `json:"offset"`
	Token    int       `json:"token"`
	Block    int       `json:"block"`
	Exact    bool      `json:"exact"`
	Matched  int       `json:"matched_tokens"`
	Previous int       `json:"previous_tokens"`
	PrevHash string    `json:"prev_hash,omitempty"`
	CurHash  string    `json:"cur_hash,omitempty"`
	Excerpt  string    `json:"excerpt,omitempty"`
}

// prefixBreaks returns tenant's diagnostics; excerpts only when allowed.
func (t *missTracker) prefixBreaks(tenant string, excerpts bool) PrefixBreaks {
	ex, turns := t.hints.Examples(tenant)
	out := PrefixBreaks{Tenant: tenant, Turns: turns, Hints: []BreakHint{}, Examples: make([]BreakExample, 0, len(ex))}
	for _, h := range t.hints.Hints(tenant) {
		out.Hints = append(out.Hints, BreakHint{Text: h.Text, Part: h.Part.String(), Change: h.Change.String(), Role: h.Role,
			Token: h.Token, Index: h.Index, Breaks: h.Breaks, Turns: h.Turns, Share: h.Share})
	}
	for i := len(ex) - 1; i >= 0; i-- {
		d := ex[i].Diff
		e := BreakExample{Time: ex[i].At, Turn: ex[i].Turn, Part: d.Part.String(), Change: d.Change.String(), Index: d.Index,
			Role: d.Role, Offset: d.Offset, Token: d.Token, Block: d.Block, Exact: d.Exact, Matched: d.Matched,
			Previous: d.Previous, PrevHash: d.PrevHash, CurHash: d.CurHash}
		if excerpts {
			e.Excerpt = d.Excerpt
		}
		out.Examples = append(out.Examples, e)
	}
	return out
}

// prefixBreaksHandler answers GET /admin/tenants/{tenant}/prefix-breaks
// (admin key). Excerpts are shown only while the tenant's record opts in:
// one that opted out since hides those kept before.
func (g *Gateway) prefixBreaksHandler(w http.ResponseWriter, r *http.Request) error {
	if err := g.adminOnly(r); err != nil {
		return err
	}
	id := chi.URLParam(r, "tenant")
	excerpts := false
	if g.tenants.store != nil {
		t, err := g.tenants.store.GetTenant(r.Context(), id)
		switch {
		case errors.Is(err, tenancy.ErrNotFound):
			return apierror.NotFound("not_found", "No such tenant.")
		case err != nil:
			return err
		}
		excerpts = t.BreakExcerpts
	}
	return chatapi.WriteJSON(w, http.StatusOK, g.miss.prefixBreaks(id, excerpts))
}

// missStatus is the status page's miss section: uncached tokens by cause
// since start (by metric tenant label) and each tenant's hints.
func (g *Gateway) missStatus() map[string]any {
	hints := map[string][]BreakHint{}
	for _, tenant := range g.miss.hints.Tenants() {
		if pb := g.miss.prefixBreaks(tenant, false); len(pb.Hints) > 0 {
			hints[tenant] = pb.Hints
		}
	}
	return map[string]any{"uncached_by_tenant": g.miss.byTenant(), "hints_by_tenant": hints, "causes": causeNames()}
}

// causeNames lists the causes in misses.Cause order.
func causeNames() []string {
	out := make([]string, misses.NumCauses)
	for c := range misses.NumCauses {
		out[c] = misses.Cause(c).String()
	}
	return out
}
