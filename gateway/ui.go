package gateway

import (
	_ "embed"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/gateway/routing"
	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
	"github.com/warmpath/warmpath/scoring"
)

// The live status page: /ui is a static page (no build step) that polls
// /ui/status.json with the admin key, which the page reads from its URL
// fragment (#key=…, never sent to the server) or asks for.

//go:embed ui.html
var uiPage []byte

// statusWindow is how far back the cached-fraction series goes, in
// statusStep buckets.
const (
	statusStep    = 10 * time.Second
	statusBuckets = 30 // five minutes
	recentCap     = 50 // routing decisions kept for the page
)

// activity keeps what the status page shows that no other component
// keeps: recent routing decisions, and per-tenant cached and prompt
// tokens in statusStep buckets. It is safe for concurrent use.
type activity struct {
	mu      sync.Mutex // guards everything below
	recent  []decision // ring of the last recentCap
	next    int
	buckets map[string]*[statusBuckets][2]float64 // tenant → (cached, prompt) per bucket
	epoch   []int64                               // bucket index → which step it holds
}

type decision struct {
	Time      time.Time `json:"time"`
	RequestID string    `json:"request_id"`
	Tenant    string    `json:"tenant"`
	Replica   string    `json:"replica"`
	Reason    string    `json:"reason"`
	Rebind    string    `json:"rebind,omitempty"`
	Prompt    int       `json:"prompt_tokens"`
	Predicted int       `json:"predicted_cached"`
	Scores    string    `json:"scores,omitempty"`
}

func newActivity() *activity {
	return &activity{buckets: map[string]*[statusBuckets][2]float64{}, epoch: make([]int64, statusBuckets)}
}

func (a *activity) decided(d decision) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.recent) < recentCap {
		a.recent = append(a.recent, d)
		return
	}
	a.recent[a.next] = d
	a.next = (a.next + 1) % recentCap
}

func (a *activity) served(now time.Time, tenant string, u request.Usage) {
	step := now.UnixNano() / int64(statusStep)
	i := int(step % statusBuckets)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.epoch[i] != step { // the bucket held an older step: reuse it
		a.epoch[i] = step
		for _, b := range a.buckets {
			b[i] = [2]float64{}
		}
	}
	b := a.buckets[tenant]
	if b == nil {
		b = new([statusBuckets][2]float64)
		a.buckets[tenant] = b
	}
	b[i][0] += float64(u.CachedTokens)
	b[i][1] += float64(u.PromptTokens)
}

// series returns each tenant's cached-prefix fraction per step, oldest
// first (NaN-free: a step without traffic is -1), and the decisions,
// newest first.
func (a *activity) snapshot(now time.Time) (map[string][]float64, []decision) {
	step := now.UnixNano() / int64(statusStep)
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string][]float64, len(a.buckets))
	for tenant, b := range a.buckets {
		s := make([]float64, statusBuckets)
		for k := range statusBuckets {
			st := step - int64(statusBuckets-1-k)
			i := int(st % statusBuckets)
			s[k] = -1
			if a.epoch[i] == st && b[i][1] > 0 {
				s[k] = b[i][0] / b[i][1]
			}
		}
		out[tenant] = s
	}
	d := make([]decision, 0, len(a.recent))
	for k := range len(a.recent) {
		d = append(d, a.recent[(a.next+len(a.recent)-1-k)%len(a.recent)])
	}
	return out, d
}

// uiReplica is one replica on the status page.
type uiReplica struct {
	Name         string   `json:"name"`
	URL          string   `json:"url"`
	Models       []string `json:"models"`
	Healthy      bool     `json:"healthy"`
	Health       string   `json:"health"`
	Saturated    string   `json:"saturated,omitempty"`
	Waiting      int      `json:"waiting"`
	Running      int      `json:"running"`
	KVUsage      float64  `json:"kv_usage"`
	Inflight     int64    `json:"inflight_requests"`
	IndexEntries int64    `json:"index_entries"`
	EventAgeSec  float64  `json:"event_age_seconds"` // -1: no event yet
}

// status answers /ui/status.json.
func (g *Gateway) status(w http.ResponseWriter, r *http.Request) error {
	if err := g.adminOnly(r); err != nil {
		return err
	}
	return chatapi.WriteJSON(w, http.StatusOK, g.statusReport(time.Now()))
}

// statusReport is the status page's JSON at now.
func (g *Gateway) statusReport(now time.Time) map[string]any {
	stats := g.router.Index().Blocks().Stats()
	var reps []uiReplica
	for _, rep := range g.fleet.Snapshot().Replicas {
		st := rep.State()
		_, why := rep.Saturated(now)
		age := -1.0
		if t := g.router.Index().LastEvent(rep.Spec.Name); !t.IsZero() {
			age = now.Sub(t).Seconds()
		}
		reps = append(reps, uiReplica{Name: rep.Spec.Name, URL: rep.Spec.URL, Models: st.Models, Healthy: st.Healthy,
			Health: st.HealthReason, Saturated: why, Waiting: st.Waiting, Running: st.Running, KVUsage: st.KVUsage,
			Inflight: rep.InflightRequests(), IndexEntries: stats.Replicas[rep.Spec.Name].Entries, EventAgeSec: age})
	}
	frac, recent := g.obs.activity.snapshot(now)
	queue := g.adm.waitingNow()
	return map[string]any{
		"policy": g.router.Policy().Name, "draining": g.edge.draining.Load(), "replicas": reps,
		"cached_fraction": map[string]any{"step_seconds": statusStep.Seconds(), "by_tenant": frac},
		"queue":           queue, "decisions": recent, "time": now, "misses": g.missStatus(),
	}
}

// adminOnly checks the admin key (auth.admin_key), as the admin API does.
func (g *Gateway) adminOnly(r *http.Request) error {
	if g.tenants.admin == nil {
		return &apierror.Error{Status: http.StatusUnauthorized, Type: apierror.TypeAuthentication, Code: "invalid_api_key",
			Msg: "The status page needs the admin key (auth.admin_key)."}
	}
	return g.tenants.admin.Authorize(r.Header)
}

// uiPageHandler serves the page itself, which holds no data.
func uiPageHandler(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
	_, _ = w.Write(uiPage)
}

// scoreSummary renders a plan's scores for the page: each candidate's
// total, best first (nil for sticky turns).
func scoreSummary(eps []scoring.Endpoint, p *scoring.Plan) string {
	d := p.Decision
	if d == nil || d.Totals == nil {
		return ""
	}
	var parts []string
	k := 0
	for _, e := range eps {
		if !e.Available() { // Totals are aligned with the available endpoints
			continue
		}
		parts = append(parts, fmt.Sprintf("%s=%.2f", e.ID, d.Totals[k]))
		k++
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// decided records a routing decision for the status page (the router's
// Deps.Decided).
func (g *Gateway) decided(r *turn, rt *routing.Route) {
	p := &rt.Plan
	g.obs.activity.decided(decision{Time: time.Now(), RequestID: r.ID(), Tenant: r.TenantID(), Replica: rt.Eps[p.Chosen()].ID,
		Reason: p.Reason, Rebind: p.Rebind, Prompt: p.PromptTokens, Predicted: p.Predicted[0], Scores: scoreSummary(rt.Eps, p)})
}
