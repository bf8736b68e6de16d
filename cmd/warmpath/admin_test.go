package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warmpath/warmpath/internal/redistest"
	"github.com/warmpath/warmpath/tenancy"
)

// TestAdminCLI drives a real admin API (real Redis, real HTTP) through the
// CLI.
func TestAdminCLI(t *testing.T) {
	rdb, prefix := redistest.Client(t)
	cfg, err := tenancy.Config{Mode: tenancy.ModeKeys, SaltSecret: "cli-salt-0123456789", AdminKey: "cli-admin-key-0123456789"}.Validate()
	if err != nil {
		t.Fatal(err)
	}
	r := tenancy.Redis{Client: rdb, Prefix: prefix}
	st := tenancy.NewStore(r, cfg, nil)
	srv := httptest.NewServer(tenancy.NewAdmin(cfg, st, tenancy.NewUsage(r, cfg, nil, nil), nil))
	defer srv.Close()
	env := map[string]string{"WARMPATH_URL": srv.URL, "WARMPATH_ADMIN_KEY": cfg.AdminKey}
	run := func(args ...string) map[string]any {
		t.Helper()
		var out bytes.Buffer
		if err := adminMain(t.Context(), args, &out, func(k string) string { return env[k] }); err != nil {
			t.Fatalf("warmpath admin %s: %v", strings.Join(args, " "), err)
		}
		var v map[string]any
		if err := json.Unmarshal(out.Bytes(), &v); err != nil {
			t.Fatalf("output %q: %v", out.String(), err)
		}
		return v
	}
	if c := run("tenants", "create", "--id", "acme", "--isolated", "--rpm", "60", "--models", "qwen3-*", "--break-excerpts"); c["break_excerpts"] != true {
		t.Fatalf("create --break-excerpts = %v", c)
	}
	upd := run("tenants", "update", "--id", "acme", "--tpm", "1000", "--weight", "4")
	lim := upd["limits"].(map[string]any)
	if lim["requests_per_minute"] != 60.0 || lim["tokens_per_minute"] != 1000.0 || upd["weight"] != 4.0 || upd["isolated"] != true {
		t.Fatalf("update kept the wrong fields: %v", upd)
	}
	if ls := run("tenants", "list"); len(ls["data"].([]any)) != 1 {
		t.Fatalf("list = %v", ls)
	}
	k := run("keys", "issue", "--tenant", "acme", "--name", "ci", "--expires-in", "24h")
	if !strings.HasPrefix(k["api_key"].(string), "wp-") {
		t.Fatalf("issue = %v", k)
	}
	rot := run("keys", "rotate", "--tenant", "acme", "--key", k["id"].(string), "--grace", "1h")
	run("keys", "revoke", "--tenant", "acme", "--key", rot["id"].(string))
	if ks := run("keys", "list", "--tenant", "acme"); len(ks["data"].([]any)) != 2 {
		t.Fatalf("keys = %v", ks)
	}
	if u := run("usage", "--tenant", "acme", "--step", "1h"); u["object"] != "usage" {
		t.Fatalf("usage = %v", u)
	}
	var out bytes.Buffer
	err = adminMain(t.Context(), []string{"tenants", "get", "--id", "ghost"}, &out, func(k string) string { return env[k] })
	if err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("get unknown tenant: %v", err)
	}
	env["WARMPATH_ADMIN_KEY"] = k["api_key"].(string)
	if err := adminMain(t.Context(), []string{"tenants", "list"}, &out, func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("a tenant key on the admin API: %v; want 401", err)
	}
}

// TestAdminCLIPrefixBreaks: prefix-breaks asks the gateway's endpoint for
// the tenant (served by the gateway, not the tenancy admin API).
func TestAdminCLIPrefixBreaks(t *testing.T) {
	var path string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path = r.Method + " " + r.URL.Path
		_, _ = w.Write([]byte(`{"tenant":"acme","turns":4,"hints":[],"examples":[]}` + "\n"))
	}))
	defer srv.Close()
	env := map[string]string{"WARMPATH_URL": srv.URL, "WARMPATH_ADMIN_KEY": "k"}
	var out bytes.Buffer
	if err := adminMain(t.Context(), []string{"prefix-breaks", "--tenant", "acme"}, &out, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if path != "GET /admin/tenants/acme/prefix-breaks" || !strings.Contains(out.String(), `"turns": 4`) && !strings.Contains(out.String(), `"turns":4`) {
		t.Errorf("asked %q, printed %q", path, out.String())
	}
}
