package tenancy

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/redistest"
)

type adminClient struct {
	t   *testing.T
	srv *httptest.Server
	key string
}

func newAdmin(t *testing.T, tp *redistest.Topology) (*env, *Usage, *adminClient) {
	t.Helper()
	e := newEnv(t, tp)
	u := NewUsage(e.r, testConfig(t), nil, nil)
	srv := httptest.NewServer(NewAdmin(testConfig(t), e.store, u, nil))
	t.Cleanup(srv.Close)
	return e, u, &adminClient{t: t, srv: srv, key: testAdmin}
}

// call sends a request and decodes the JSON answer into out (when not nil).
func (c *adminClient) call(method, path, body string, out any) (int, string) {
	c.t.Helper()
	req, _ := http.NewRequestWithContext(c.t.Context(), method, c.srv.URL+path, strings.NewReader(body))
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.srv.Client().Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.Header.Get("Content-Type") != "application/json" {
		c.t.Errorf("%s %s: Content-Type %q", method, path, resp.Header.Get("Content-Type"))
	}
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			c.t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

func TestAdminRefusesTenantKeys(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e, _, c := newAdmin(t, tp)
		mustTenant(t, e.store, Tenant{ID: "acme"})
		_, full := mustKey(t, e.store, "acme", KeySpec{})
		for _, key := range []string{full, "", "wrong-admin-key-0123456789", testAdmin + "x"} {
			c.key = key
			if code, body := c.call("GET", "/admin/tenants", "", nil); code != 401 || !strings.Contains(body, "invalid_api_key") {
				t.Errorf("key %q: %d %s; want 401", key, code, body)
			}
		}
		// With no admin key configured, nothing gets in, not even an empty one.
		srv := httptest.NewServer(NewAdmin(Config{}, e.store, nil, nil))
		defer srv.Close()
		c2 := &adminClient{t: t, srv: srv}
		if code, _ := c2.call("GET", "/admin/tenants", "", nil); code != 401 {
			t.Errorf("admin API without an admin key: %d", code)
		}
	})
}

func TestAdminTenantsAndKeys(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e, _, c := newAdmin(t, tp)
		var tn Tenant
		if code, body := c.call("POST", "/admin/tenants", `{"id":"acme","name":"Acme","isolated":true,"limits":{"requests_per_minute":60},"models":["qwen3-*"]}`, &tn); code != 201 {
			t.Fatalf("create: %d %s", code, body)
		}
		if tn.Weight != 1 || tn.DefaultClass != ClassInteractive || tn.Created.IsZero() {
			t.Errorf("defaults not filled: %+v", tn)
		}
		if code, _ := c.call("POST", "/admin/tenants", `{"id":"acme"}`, nil); code != 409 {
			t.Errorf("duplicate create: %d; want 409", code)
		}
		for _, body := range []string{`{"id":"Bad ID"}`, `{"id":"x","weight":-1}`, `{"id":"x","class_ceiling":"gold"}`, `{"id":"x","surprise":1}`, `{"id":"x"} {}`, `[`} {
			if code, resp := c.call("POST", "/admin/tenants", body, nil); code != 400 || !strings.Contains(resp, `"type":"invalid_request_error"`) {
				t.Errorf("create %s: %d %s; want 400", body, code, resp)
			}
		}
		var upd Tenant
		if code, body := c.call("PATCH", "/admin/tenants/acme", `{"weight":5,"models":null}`, &upd); code != 200 || upd.Weight != 5 || upd.Models != nil || !upd.Isolated {
			t.Fatalf("update: %d %s", code, body)
		}
		var ls list[Tenant]
		if c.call("GET", "/admin/tenants", "", &ls); len(ls.Data) != 1 || ls.Object != "list" {
			t.Fatalf("list = %+v", ls)
		}

		var issued keyWithSecret
		if code, body := c.call("POST", "/admin/tenants/acme/keys", `{"name":"ci","expires_in":"24h","limits":{"concurrent":2}}`, &issued); code != 201 || !strings.HasPrefix(issued.APIKey, "wp-"+issued.ID+"-") {
			t.Fatalf("issue: %d %s", code, body)
		}
		if _, err := e.auth.Authenticate(t.Context(), bearer(issued.APIKey)); err != nil {
			t.Fatalf("issued key: %v", err)
		}
		_, body := c.call("GET", "/admin/tenants/acme/keys/"+issued.ID, "", nil)
		if strings.Contains(body, issued.APIKey[len(issued.APIKey)-64:]) || strings.Contains(body, `"hash"`) || strings.Contains(body, "api_key") {
			t.Errorf("key record shows secret material: %s", body)
		}
		var rotated keyWithSecret
		if code, body := c.call("POST", "/admin/tenants/acme/keys/"+issued.ID+"/rotate", `{"grace":"1h"}`, &rotated); code != 201 || rotated.APIKey == "" {
			t.Fatalf("rotate: %d %s", code, body)
		}
		var revoked Key
		if code, body := c.call("POST", "/admin/tenants/acme/keys/"+rotated.ID+"/revoke", "", &revoked); code != 200 || revoked.Revoked.IsZero() {
			t.Fatalf("revoke: %d %s", code, body)
		}
		var keys list[Key]
		c.call("GET", "/admin/tenants/acme/keys", "", &keys)
		byID := map[string]Key{}
		for _, k := range keys.Data {
			byID[k.ID] = k
		}
		if len(keys.Data) != 2 || byID[issued.ID].RotatedTo != rotated.ID || byID[rotated.ID].Revoked.IsZero() {
			t.Fatalf("keys = %+v", keys)
		}
		for _, p := range []string{"/admin/tenants/ghost", "/admin/tenants/ghost/keys", "/admin/tenants/acme/keys/0123456789abcdef", "/admin/nothing"} {
			if code, _ := c.call("GET", p, "", nil); code != 404 {
				t.Errorf("GET %s: %d; want 404", p, code)
			}
		}
	})
}

// TestAdminTenantScope: one tenant's paths never reach another's keys or
// usage.
func TestAdminTenantScope(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e, u, c := newAdmin(t, tp)
		mustTenant(t, e.store, Tenant{ID: "a"})
		mustTenant(t, e.store, Tenant{ID: "b"})
		kb, fullB := mustKey(t, e.store, "b", KeySpec{})
		pb, err := e.auth.Authenticate(t.Context(), bearer(fullB))
		if err != nil {
			t.Fatal(err)
		}
		u.Record(pb, Counts{Requests: 1, PromptTokens: 10})
		if err := u.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
		for _, r := range []struct{ method, path string }{
			{"GET", "/admin/tenants/a/keys/" + kb.ID},
			{"POST", "/admin/tenants/a/keys/" + kb.ID + "/revoke"},
			{"DELETE", "/admin/tenants/a/keys/" + kb.ID},
			{"POST", "/admin/tenants/a/keys/" + kb.ID + "/rotate"},
			{"GET", "/admin/tenants/a/usage?key=" + kb.ID},
		} {
			if code, body := c.call(r.method, r.path, "", nil); code != 404 {
				t.Errorf("%s %s: %d %s; want 404", r.method, r.path, code, body)
			}
		}
		var keys list[Key]
		if c.call("GET", "/admin/tenants/a/keys", "", &keys); len(keys.Data) != 0 {
			t.Errorf("tenant a lists b's keys: %+v", keys.Data)
		}
		var rep usageReport
		if c.call("GET", "/admin/tenants/a/usage", "", &rep); rep.Total != (Counts{}) {
			t.Errorf("tenant a sees usage %+v", rep.Total)
		}
		if c.call("GET", "/admin/tenants/b/usage?key="+kb.ID, "", &rep); rep.Total.PromptTokens != 10 {
			t.Errorf("tenant b's own key usage = %+v", rep.Total)
		}
		if _, err := e.auth.Authenticate(t.Context(), bearer(fullB)); err != nil {
			t.Errorf("b's key was touched through a's paths: %v", err)
		}
	})
}

func TestAdminUsageQuery(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tp *redistest.Topology) {
		e, u, c := newAdmin(t, tp)
		mustTenant(t, e.store, Tenant{ID: "acme"})
		k, full := mustKey(t, e.store, "acme", KeySpec{})
		p, _ := e.auth.Authenticate(t.Context(), bearer(full))
		base := time.Date(2026, 3, 1, 23, 58, 0, 0, time.UTC) // the range crosses midnight
		u.now = func() time.Time { return base }
		e.store.now = func() time.Time { return base.Add(10 * time.Minute) }
		for i := range 4 {
			u.now = func() time.Time { return base.Add(time.Duration(i) * time.Minute) }
			u.Record(p, Counts{Requests: 1, PromptTokens: 100, CachedTokens: 60, CompletionTokens: 5})
		}
		if err := u.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
		var rep usageReport
		code, body := c.call("GET", "/admin/tenants/acme/usage?from=2026-03-01T23:00:00Z&to=2026-03-02T01:00:00Z&step=1h&key="+k.ID, "", &rep)
		if code != 200 {
			t.Fatalf("usage: %d %s", code, body)
		}
		want := Counts{Requests: 4, PromptTokens: 400, CachedTokens: 240, CompletionTokens: 20}
		if rep.Total != want || len(rep.Data) != 2 || rep.Data[0].Requests != 2 || rep.Data[1].Requests != 2 {
			t.Fatalf("usage = %s", body)
		}
		for _, q := range []string{"step=10s", "from=yesterday", "from=2026-03-02T01:00:00Z&to=2026-03-01T23:00:00Z"} {
			if code, _ := c.call("GET", "/admin/tenants/acme/usage?"+q, "", nil); code != 400 {
				t.Errorf("usage?%s: %d; want 400", q, code)
			}
		}
	})
}
