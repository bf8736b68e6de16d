package tenancy

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestConfigValidate(t *testing.T) {
	dir := t.TempDir()
	adminFile := filepath.Join(dir, "admin")
	if err := os.WriteFile(adminFile, []byte("  from-a-file-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings of the error; none means valid
	}{
		{"keys", Config{Mode: ModeKeys, SaltSecret: testSalt}, nil},
		{"none needs no salt", Config{Mode: ModeNone}, nil},
		{"no mode", Config{}, []string{"auth.mode: required"}},
		{"bad mode", Config{Mode: "open", SaltSecret: testSalt}, []string{`auth.mode: "open"`}},
		{"no salt", Config{Mode: ModeKeys}, []string{"auth.salt_secret: required"}},
		{"short admin key", Config{Mode: ModeKeys, SaltSecret: testSalt, AdminKey: "x"}, []string{"auth.admin_key:"}},
		{"admin key and file", Config{Mode: ModeKeys, SaltSecret: testSalt, AdminKey: testAdmin, AdminKeyFile: adminFile}, []string{"auth.admin_key_file:"}},
		{"missing admin file", Config{Mode: ModeKeys, SaltSecret: testSalt, AdminKeyFile: filepath.Join(dir, "nope")}, []string{"auth.admin_key_file:"}},
		{"bad failure", Config{Mode: ModeKeys, SaltSecret: testSalt, RedisFailure: FailureConfig{Concurrency: "maybe"}}, []string{"auth.redis_failure.concurrency:"}},
		{"jwt needs iss aud keys", Config{Mode: ModeJWT, SaltSecret: testSalt}, []string{"auth.jwt.issuer: required", "auth.jwt.audience: required", "auth.jwt.keys: required"}},
		{"jwt bad key", Config{Mode: ModeJWT, SaltSecret: testSalt, JWT: JWTConfig{Issuer: "i", Audience: "a",
			Keys: []JWTKeyConfig{{KID: "a", Alg: "none"}, {Alg: AlgHS256, Secret: "short"}}}},
			[]string{`auth.jwt.keys[0]: alg "none"`, "auth.jwt.keys[1].kid: required", "auth.jwt.keys[1]: HS256 needs"}},
		{"tiny lease", Config{Mode: ModeKeys, SaltSecret: testSalt, LeaseTTL: time.Millisecond}, []string{"auth.lease_ttl:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted %+v", tt.cfg)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	c, err := Config{Mode: ModeKeys, SaltSecret: testSalt, AdminKeyFile: adminFile}.Validate()
	if err != nil || c.AdminKey != "from-a-file-0123456789" {
		t.Fatalf("admin key from file = %q, %v", c.AdminKey, err)
	}
	if c.CacheTTL != 10*time.Second || c.LeaseTTL != 30*time.Second || c.MetricsTopN != 20 || c.RedisFailure.RateLimits != FailOpen ||
		c.JWT.TenantClaim != "tenant" || c.Usage.Retention != 7*24*time.Hour {
		t.Errorf("defaults = %+v", c)
	}
}

func TestConfigYAML(t *testing.T) {
	src := `
mode: keys+jwt
admin_key_file: /run/secrets/warmpath-admin
salt_secret_file: /run/secrets/warmpath-salt
cache_ttl: 5s
redis_failure: {rate_limits: open, concurrency: closed}
jwt:
  issuer: https://login.example.com/
  audience: warmpath
  tenant_claim: org
  jwks_file: /etc/warmpath/jwks.json
usage: {retention: 720h}
metrics_top_n: 50
`
	var c Config
	if err := yaml.Unmarshal([]byte(src), &c); err != nil {
		t.Fatal(err)
	}
	if c.Mode != ModeKeysJWT || c.CacheTTL != 5*time.Second || c.RedisFailure.Concurrency != FailClosed ||
		c.JWT.TenantClaim != "org" || c.Usage.Retention != 720*time.Hour || c.MetricsTopN != 50 {
		t.Fatalf("decoded %+v", c)
	}
}

func TestCheckStartup(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	if err := CheckStartup(Config{}, true, log); err == nil || !strings.HasPrefix(err.Error(), "auth.mode:") {
		t.Fatalf("replicas without auth: %v; want an error naming auth.mode", err)
	}
	if err := CheckStartup(Config{}, false, log); err != nil {
		t.Fatalf("embedded setup: %v", err)
	}
	if err := CheckStartup(Config{Mode: ModeNone}, true, log); err != nil || !strings.Contains(buf.String(), "level=WARN") {
		t.Fatalf("mode none: %v, log %q; want a warning", err, buf.String())
	}
}

func TestPrincipalNeverLogsSalt(t *testing.T) {
	a, _ := NewAuthenticator(Config{Mode: ModeKeys, SaltSecret: testSalt}, &Store{}, nil, nil)
	p := principalFor(&Tenant{ID: "acme", Name: "Acme", Isolated: true, Weight: 1, DefaultClass: ClassInteractive, ClassCeiling: ClassInteractive}, nil)
	p.salt = a.salt(&Tenant{ID: "acme", Isolated: true})
	salt := p.CacheSalt("")
	if len(salt) != 64 || salt == tenantSalt([]byte("other-secret-0123456789"), "acme") {
		t.Fatalf("salt %q", salt)
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	log.Info("x", "p", p, "pv", *p)
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "p", p, "pv", *p)
	for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
		fmt.Fprintf(&buf, f+" "+f+"\n", p, *p)
	}
	if strings.Contains(buf.String(), salt) {
		t.Fatalf("salt leaked: %s", buf.String())
	}
}

func TestCacheSalt(t *testing.T) {
	a, _ := NewAuthenticator(Config{Mode: ModeKeys, SaltSecret: testSalt}, &Store{}, nil, nil)
	mk := func(id string, isolated bool) *Principal {
		tn := &Tenant{ID: id, Isolated: isolated}
		p := principalFor(tn, nil)
		p.salt = a.salt(tn)
		return p
	}
	iso1, iso2, shared := mk("a", true), mk("b", true), mk("c", false)
	if shared.CacheSalt("") != "" || shared.CacheSalt("mine") != "mine" {
		t.Error("a shared tenant's salt must be the client's")
	}
	if iso1.CacheSalt("") == iso2.CacheSalt("") || iso1.CacheSalt("") == "a" {
		t.Error("isolated tenants need distinct salts that are not their ids")
	}
	if iso1.CacheSalt("x") == iso1.CacheSalt("") || iso1.CacheSalt("x") == iso2.CacheSalt("x") || iso1.CacheSalt("x") != iso1.CacheSalt("x") {
		t.Error("client salts must combine with, not replace, the tenant's")
	}
}

func TestModels(t *testing.T) {
	tests := []struct {
		tenant, key, want []string
	}{
		{nil, nil, nil},
		{[]string{"a"}, nil, []string{"a"}},
		{nil, []string{"a"}, []string{"a"}},
		{[]string{"qwen3-*"}, []string{"qwen3-32b", "llama"}, []string{"qwen3-32b"}},
		{[]string{"qwen3-*"}, []string{"qwen3-3*"}, []string{"qwen3-3*"}},
		{[]string{"qwen3-32b", "qwen3-8b", "llama"}, []string{"qwen3-*"}, []string{"qwen3-32b", "qwen3-8b"}},
		{[]string{"a"}, []string{"b"}, []string{}},
	}
	for _, tt := range tests {
		got := intersectModels(tt.tenant, tt.key)
		if fmt.Sprint(got) != fmt.Sprint(tt.want) || (got == nil) != (tt.want == nil) {
			t.Errorf("intersect(%v, %v) = %#v; want %#v", tt.tenant, tt.key, got, tt.want)
		}
	}
	p := &Principal{Models: []string{}}
	if p.Allows("anything") == nil {
		t.Error("an empty allow-list allows nothing")
	}
	err := (&Principal{Models: []string{"a"}}).Allows("b")
	if err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("Allows = %v; want 403", err)
	}
}

func TestLabeler(t *testing.T) {
	l := NewLabeler(2)
	l.Observe("a", 1)
	l.Observe("b", 1)
	l.Observe("c", 5)
	if l.Label("a") != "a" || l.Label("b") != "b" || l.Label("c") != Other {
		t.Fatalf("first two seen get labels at once")
	}
	l.Recompute()
	if l.Label("c") != "c" || l.Label("a") != "a" || l.Label("b") != Other {
		t.Fatalf("after recompute the busiest two: a=%s b=%s c=%s", l.Label("a"), l.Label("b"), l.Label("c"))
	}
	if NewLabeler(0).Label("a") != Other {
		t.Error("n=0 labels nothing")
	}
}
