package gateway

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/vllmsim"
)

// chromium finds Debian's headless Chromium; the test skips without it,
// except under CI=true, where it fails (.ci/run installs it).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (CI=true: the browser test must run; see .ci/run)")
	}
	t.Skip("chromium is not installed")
	return ""
}

// renderPage loads url in headless Chromium, lets its scripts run, and
// returns the DOM.
func renderPage(t *testing.T, browser, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
		"--user-data-dir="+t.TempDir(), "--virtual-time-budget=4000", "--dump-dom", url)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	return string(out)
}

// The status page, in a real browser: it loads with the admin key, shows
// the simulated fleet's replicas, and shows traffic as it flows (routing
// decisions and a tenant's cached-prefix fraction appear).
func TestStatusPageInChromium(t *testing.T) {
	browser := chromium(t)
	sim := startSim(t, vllmsim.Config{Replicas: 3})
	cfg := tenantConfig(sim)
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	page := gw.URL + "/ui#key=" + testAdminKey

	before := renderPage(t, browser, page)
	for _, rep := range sim.Replicas() {
		if !strings.Contains(before, fmt.Sprintf(`data-replica="%s"`, rep.Info().Name)) {
			t.Errorf("the page does not show replica %s", rep.Info().Name)
		}
	}
	if strings.Contains(before, "<td>sticky") || strings.Contains(before, "<td>scored") {
		t.Error("decisions shown before any traffic")
	}

	key := newTenant(t, gw.URL, "watched", "")
	c := newConversation(words("status page", 200), "hello")
	c.header = bearer(key)
	for i := range 3 {
		if i == 2 { // a careless client: a new system prompt mid-conversation
			c.messages[0].Content = "Turn 2. " + words("status page", 200)
		}
		c.turn(t, gw.URL, "more")
	}
	flushMisses(t, gw) // the miss causes and hints are attributed off the response path
	after := renderPage(t, browser, page)
	if !strings.Contains(after, "<td>scored") || !strings.Contains(after, "<td>sticky") {
		t.Errorf("the page shows no routing decisions after traffic")
	}
	if !strings.Contains(after, `data-tenant="watched"`) {
		t.Errorf("the page shows no cached-prefix fraction for the tenant")
	}
	if !strings.Contains(after, `data-uncached="watched"`) || !strings.Contains(after, `data-hint="watched"`) || !strings.Contains(after, "the system prompt differs") {
		t.Errorf("the page shows no miss causes or prefix-break hint for the tenant")
	}
	// Without the key the page asks for it and shows nothing.
	if locked := renderPage(t, browser, gw.URL+"/ui"); strings.Contains(locked, "data-replica=") || !strings.Contains(locked, `id="login"`) {
		t.Error("the page showed data without the admin key")
	}
	req, _ := http.NewRequest("GET", gw.URL+"/ui/status.json", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("status.json with a tenant key: %v %v; want 401", resp.StatusCode, err)
	}
}

// A plan's totals are aligned with the endpoints that could take the
// request: a replica the decision left out as reserved (the interactive
// reserve, or one with no room when the queue moves a request) has none.
func TestScoreSummarySkipsUnavailable(t *testing.T) {
	eps := []scoring.Endpoint{{ID: "a"}, {ID: "b", Reserved: true}, {ID: "c", Unhealthy: true}, {ID: "d"}}
	p := &scoring.Plan{Decision: &scoring.Decision{Totals: []float64{1.5, 0.25}}}
	if got, want := scoreSummary(eps, p), "a=1.50 d=0.25"; got != want {
		t.Errorf("scoreSummary = %q; want %q", got, want)
	}
}
