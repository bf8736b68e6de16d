package tenancy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warmpath/warmpath/internal/apierror"

	"github.com/warmpath/warmpath/internal/redistest"
)

// TestRequestPath composes the pieces as the gateway will: Middleware →
// Allows → Limiter.Admit → (upstream) → Lease.Done → Usage.Record, over real
// HTTP and Redis, and checks what clients see.
func TestRequestPath(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e := newEnv(t, tp)
		lim := NewLimiter(e.r, testConfig(t), nil)
		use := NewUsage(e.r, testConfig(t), nil, nil)
		mustTenant(t, e.store, Tenant{ID: "acme", Isolated: true, Models: []string{"qwen3-*"}, Limits: Limits{RequestsPerMinute: 2}})
		_, full := mustKey(t, e.store, "acme", KeySpec{})
		inference := func(w http.ResponseWriter, r *http.Request) error {
			p, _ := FromContext(r.Context())
			model := r.URL.Query().Get("model")
			if err := p.Allows(model); err != nil {
				return err
			}
			le, err := lim.Admit(r.Context(), p, model, 50)
			if err != nil {
				return err
			}
			for k, v := range le.Header() {
				w.Header()[k] = v
			}
			_, _ = w.Write([]byte(p.CacheSalt("client")))
			le.Done(40)
			use.Record(p, Counts{Requests: 1, PromptTokens: 30, CompletionTokens: 10})
			return nil
		}
		srv := httptest.NewServer(e.auth.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := inference(w, r); err != nil {
				apierror.Write(w, err)
			}
		})))
		defer srv.Close()
		get := func(model string) (*http.Response, map[string]map[string]any) {
			req, _ := http.NewRequestWithContext(t.Context(), "GET", srv.URL+"/?model="+model, nil)
			req.Header.Set("Authorization", "Bearer "+full)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var env map[string]map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&env)
			return resp, env
		}
		resp, env := get("llama")
		if resp.StatusCode != 403 || env["error"]["code"] != "model_not_allowed" || env["error"]["type"] != apierror.TypePermission {
			t.Fatalf("model outside the allow-list: %d %v", resp.StatusCode, env)
		}
		for range 2 {
			if resp, _ := get("qwen3-32b"); resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Limit-Requests") != "2" {
				t.Fatalf("allowed request: %d %v", resp.StatusCode, resp.Header)
			}
		}
		resp, env = get("qwen3-32b")
		if resp.StatusCode != 429 || env["error"]["code"] != "rate_limit_exceeded" || env["error"]["type"] != "requests" ||
			resp.Header.Get("Retry-After") == "" || resp.Header.Get("X-Ratelimit-Remaining-Requests") != "" && resp.Header.Get("X-Ratelimit-Remaining-Requests") != "0" {
			t.Fatalf("third request in a minute: %d %v %v", resp.StatusCode, env, resp.Header)
		}
		if !strings.Contains(env["error"]["message"].(string), "qwen3-32b") {
			t.Errorf("429 message %q does not name the model", env["error"]["message"])
		}
		if err := use.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}
