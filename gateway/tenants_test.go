package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/tenancy"
	"github.com/warmpath/warmpath/vllmsim"
)

const (
	testAdminKey = "admin-key-for-tests-0123"
	testJWTKey   = "jwt-secret-for-tests-0123456789-abcdef"
)

// tenantConfig is a production-shaped configuration over sim: API keys and
// HS256 JWTs, an admin key, usage flushed quickly.
func tenantConfig(sim *vllmsim.Fleet) Config {
	cfg := fleetConfig(sim)
	cfg.Debug = true
	cfg.Auth = tenancy.Config{
		Mode: tenancy.ModeKeysJWT, AdminKey: testAdminKey, SaltSecret: "salt-secret-for-tests-0123",
		JWT: tenancy.JWTConfig{Issuer: "https://login.test/", Audience: "warmpath", TenantClaim: "tenant",
			Keys: []tenancy.JWTKeyConfig{{KID: "k1", Alg: tenancy.AlgHS256, Secret: testJWTKey}}},
		Usage: tenancy.UsageConfig{FlushInterval: 50 * time.Millisecond},
	}
	return cfg
}

// admin calls the admin API and decodes its JSON answer into out.
func admin(t *testing.T, url, method, path, body string, out any) int {
	t.Helper()
	req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testAdminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, raw)
		}
	}
	return resp.StatusCode
}

// newTenant creates a tenant with the JSON fields given and returns a key.
func newTenant(t *testing.T, url, id, fields string) string {
	t.Helper()
	body := fmt.Sprintf(`{"id":%q%s}`, id, fields)
	if code := admin(t, url, "POST", "/admin/tenants", body, nil); code != http.StatusCreated {
		t.Fatalf("create tenant %s: %d", id, code)
	}
	var k struct {
		APIKey string `json:"api_key"`
	}
	if code := admin(t, url, "POST", "/admin/tenants/"+id+"/keys", `{"name":"test"}`, &k); code != http.StatusCreated {
		t.Fatalf("issue key for %s: %d", id, code)
	}
	return k.APIKey
}

func bearer(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }

func hs256(t *testing.T, claims jwt.MapClaims, method jwt.SigningMethod, key any) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, claims)
	tok.Header["kid"] = "k1"
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A configuration with replicas and no auth method refuses to start, and
// says which setting to set.
func TestProductionConfigRefusesToRunOpen(t *testing.T) {
	cfg := fleetConfig(startSim(t, vllmsim.Config{Replicas: 1}))
	cfg.Auth = tenancy.Config{}
	_, err := New(cfg, Options{})
	if err == nil || !strings.Contains(err.Error(), "auth.mode") {
		t.Fatalf("New = %v; want an error naming auth.mode", err)
	}
}

// Malformed, unknown and revoked keys, and bad JWTs (wrong algorithm,
// none, expired, wrong audience, wrong issuer, bad signature) all get the
// same 401 through the gateway, byte for byte (expired keys, on a fake
// clock, in tenancy's TestAuthenticateSame401); the admin API refuses
// tenant keys.
func TestEveryBadCredentialGetsTheSame401(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1})
	cfg := tenantConfig(sim)
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	good := newTenant(t, gw.URL, "acme", "")
	revoked := newTenant(t, gw.URL, "gone", "")
	var gk struct {
		Data []tenancy.Key `json:"data"`
	}
	admin(t, gw.URL, "GET", "/admin/tenants/gone/keys", "", &gk)
	admin(t, gw.URL, "POST", "/admin/tenants/gone/keys/"+gk.Data[0].ID+"/revoke", "", nil)
	now := time.Now()
	claims := func(mod func(jwt.MapClaims)) jwt.MapClaims {
		c := jwt.MapClaims{"iss": "https://login.test/", "aud": "warmpath", "tenant": "acme", "sub": "u1", "exp": now.Add(time.Hour).Unix()}
		if mod != nil {
			mod(c)
		}
		return c
	}
	okJWT := hs256(t, claims(nil), jwt.SigningMethodHS256, []byte(testJWTKey))
	body := map[string]any{"model": "qwen3-32b", "max_tokens": 2, "messages": []msg{{"user", "hi"}}}
	for name, key := range map[string]string{"api key": good, "jwt": okJWT} {
		if r := chat(t, gw.URL, body, bearer(key)); r.Status != http.StatusOK {
			t.Fatalf("%s: status %d: %s", name, r.Status, r.Body)
		}
	}
	bad := map[string]string{
		"malformed":       "wp-zz",
		"unknown":         "wp-0123456789abcdef-" + strings.Repeat("ab", 32),
		"wrong secret":    good[:len(good)-4] + "0000",
		"revoked":         revoked,
		"jwt none":        hs256(t, claims(nil), jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType),
		"jwt expired":     hs256(t, claims(func(c jwt.MapClaims) { c["exp"] = now.Add(-time.Hour).Unix() }), jwt.SigningMethodHS256, []byte(testJWTKey)),
		"jwt audience":    hs256(t, claims(func(c jwt.MapClaims) { c["aud"] = "someone-else" }), jwt.SigningMethodHS256, []byte(testJWTKey)),
		"jwt issuer":      hs256(t, claims(func(c jwt.MapClaims) { c["iss"] = "https://evil/" }), jwt.SigningMethodHS256, []byte(testJWTKey)),
		"jwt signature":   hs256(t, claims(nil), jwt.SigningMethodHS256, []byte("another-secret-entirely-012345")),
		"jwt wrong alg":   hs256(t, claims(nil), jwt.SigningMethodHS512, []byte(testJWTKey)),
		"jwt no tenant":   hs256(t, claims(func(c jwt.MapClaims) { delete(c, "tenant") }), jwt.SigningMethodHS256, []byte(testJWTKey)),
		"jwt bad tenant":  hs256(t, claims(func(c jwt.MapClaims) { c["tenant"] = "nobody" }), jwt.SigningMethodHS256, []byte(testJWTKey)),
		"jwt no expiry":   hs256(t, claims(func(c jwt.MapClaims) { delete(c, "exp") }), jwt.SigningMethodHS256, []byte(testJWTKey)),
		"garbage":         "not-a-key-at-all",
		"admin key there": testAdminKey,
	}
	var want []byte
	for name, key := range bad {
		r := chat(t, gw.URL, body, bearer(key))
		if r.Status != http.StatusUnauthorized {
			t.Errorf("%s: status %d; want 401 (%s)", name, r.Status, r.Body)
			continue
		}
		if want == nil {
			want = r.Body
		}
		if !bytes.Equal(r.Body, want) {
			t.Errorf("%s: body %s; want the same as every other: %s", name, r.Body, want)
		}
	}
	if !bytes.Contains(want, []byte(`"code":"invalid_api_key"`)) {
		t.Errorf("401 body %s lacks invalid_api_key", want)
	}
	req, _ := http.NewRequest("GET", gw.URL+"/admin/tenants", nil)
	req.Header.Set("Authorization", "Bearer "+good)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("admin API with a tenant key: %v, %v; want 401", resp.StatusCode, err)
	}
}

// A session id reused by another tenant lands on that tenant's own
// binding: tenants neither steer nor read each other's sessions.
func TestTenantsHaveTheirOwnSessions(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 4})
	cfg := tenantConfig(sim)
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	a := newTenant(t, gw.URL, "tenant-a", "")
	b := newTenant(t, gw.URL, "tenant-b", "")
	hdr := func(key string) map[string]string {
		return map[string]string{"Authorization": "Bearer " + key, "X-Session-ID": "shared-id"}
	}
	body := func(text string) map[string]any {
		return map[string]any{"model": "qwen3-32b", "max_tokens": 2, "messages": []msg{{"user", text}}}
	}
	chat(t, gw.URL, body(words("tenant a's conversation", 300)), hdr(a))
	chat(t, gw.URL, body(words("tenant b's conversation", 300)), hdr(b))
	// One conversation binding per tenant (the session id joined with the
	// conversation's opening), beside each tenant's family record. Each
	// is written after its turn's response.
	var keys []string
	testrun.Eventually(t, 5*time.Second, func() bool {
		keys = keys[:0]
		for _, k := range rdb.Keys(t.Context(), cfg.Redis.KeyPrefix+"sess:*").Val() {
			if strings.Contains(k, "/") {
				keys = append(keys, k)
			}
		}
		return len(keys) >= 2
	}, "both turns' bindings in Redis")
	if len(keys) != 2 {
		t.Fatalf("bindings %v; want one per tenant", keys)
	}
	for _, k := range keys {
		if !strings.Contains(k, "tenant-a") && !strings.Contains(k, "tenant-b") {
			t.Errorf("binding %s is not scoped by tenant", k)
		}
	}
}

// Isolated tenants' upstream requests carry their own salts, so the same
// prompt from another tenant hits nothing cached, while shared tenants
// share common prefixes.
func TestIsolatedTenantsDoNotShareCachedPrefixes(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1})
	cfg := tenantConfig(sim)
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	keys := map[string]string{}
	for id, fields := range map[string]string{"iso-1": `,"isolated":true`, "iso-2": `,"isolated":true`, "shared-1": "", "shared-2": ""} {
		keys[id] = newTenant(t, gw.URL, id, fields)
	}
	prompt := words("the common harness prompt", 600)
	cached := func(tenant, user string) int {
		r := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 2, "messages": []msg{{"system", prompt}, {"user", user}}}, bearer(keys[tenant]))
		if r.Status != http.StatusOK {
			t.Fatalf("%s: %d %s", tenant, r.Status, r.Body)
		}
		return r.Usage.CachedTokens
	}
	cached("shared-1", "one")
	if got := cached("shared-2", "two"); got < 500 {
		t.Errorf("shared tenants: second tenant cached %d tokens of a 600-word shared prefix; want most", got)
	}
	if got := cached("iso-1", "three"); got != 0 {
		t.Errorf("isolated tenant hit %d tokens cached by shared tenants", got)
	}
	if got := cached("iso-2", "four"); got != 0 {
		t.Errorf("isolated tenant hit %d tokens cached by another isolated tenant", got)
	}
	if got := cached("iso-1", "five"); got < 500 {
		t.Errorf("isolated tenant missed its own cached prefix: %d", got)
	}
	if got := counter(t, gw.obs.reg, "warmpath_cached_tokens_total", map[string]string{"tenant": "iso-1"}); got < 500 {
		t.Errorf("per-tenant cached tokens for iso-1 = %v", got)
	}
}

// A tenant's requests-per-minute limit holds across two gateways sharing
// Redis: three times the limit sent, alternating, admits the limit (plus
// what refills meanwhile); refusals carry Retry-After and x-ratelimit-*.
func TestLimitsHoldAcrossTwoGateways(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := tenantConfig(sim)
	rdb := redisFor(t, &cfg)
	g1 := startGateway(t, cfg, rdb)
	g2 := startGateway(t, cfg, rdb)
	key := newTenant(t, g1.URL, "limited", `,"limits":{"requests_per_minute":12}`)
	body := map[string]any{"model": "qwen3-32b", "max_tokens": 2, "messages": []msg{{"user", "hi"}}}
	ok, refused := 0, 0
	for i := range 36 {
		gw := g1
		if i%2 == 1 {
			gw = g2
		}
		r := chat(t, gw.URL, body, bearer(key))
		switch r.Status {
		case http.StatusOK:
			ok++
			if r.Header.Get("X-Ratelimit-Limit-Requests") != "12" {
				t.Errorf("success lacks x-ratelimit-limit-requests: %v", r.Header)
			}
		case http.StatusTooManyRequests:
			refused++
			if r.Header.Get("Retry-After") == "" || r.Header.Get("X-Ratelimit-Remaining-Requests") != "0" || !bytes.Contains(r.Body, []byte("rate_limit_exceeded")) {
				t.Errorf("429 lacks Retry-After, x-ratelimit-* or the code: %v %s", r.Header, r.Body)
			}
		default:
			t.Fatalf("status %d: %s", r.Status, r.Body)
		}
	}
	if ok < 12 || ok > 14 {
		t.Errorf("%d of 36 admitted across two gateways; want the limit, 12 (+ refill)", ok)
	}
	t.Logf("admitted %d, refused %d", ok, refused)
}

// Revoking a key on one gateway stops it on both, well within the stated
// bound (pub/sub; cache_ttl at worst).
func TestRevocationReachesBothGateways(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1})
	cfg := tenantConfig(sim)
	rdb := redisFor(t, &cfg)
	g1 := startGateway(t, cfg, rdb)
	g2 := startGateway(t, cfg, rdb)
	key := newTenant(t, g1.URL, "revokee", "")
	body := map[string]any{"model": "qwen3-32b", "max_tokens": 2, "messages": []msg{{"user", "hi"}}}
	for _, gw := range []*testGateway{g1, g2} {
		if r := chat(t, gw.URL, body, bearer(key)); r.Status != http.StatusOK {
			t.Fatalf("before revocation: %d", r.Status)
		}
	}
	var ks struct {
		Data []tenancy.Key `json:"data"`
	}
	admin(t, g1.URL, "GET", "/admin/tenants/revokee/keys", "", &ks)
	// The turns just served queued the key's last-used write, which may
	// land inside the revocation's transaction: it must still succeed.
	if st := admin(t, g1.URL, "POST", "/admin/tenants/revokee/keys/"+ks.Data[0].ID+"/revoke", "", nil); st != http.StatusOK {
		t.Fatalf("revoke: status %d", st)
	}
	for i, gw := range []*testGateway{g1, g2} {
		last := 0
		testrun.Eventually(t, cfg.Auth.WithDefaults().CacheTTL, func() bool {
			st := chat(t, gw.URL, body, bearer(key)).Status
			if st != last && st != http.StatusUnauthorized {
				t.Logf("g%d answered the revoked key %d", i+1, st)
			}
			last = st
			return st == http.StatusUnauthorized
		}, fmt.Sprintf("g%d (g1 revoked the key) to refuse the revoked key", i+1))
	}
}

// /metrics can live on its own listener, off the API's; the per-tenant
// cached-prefix fraction is there.
func TestMetricsListener(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1})
	cfg := tenantConfig(sim)
	cfg.MetricsListen = "127.0.0.1:0"
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	key := newTenant(t, gw.URL, "metered", "")
	chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 2, "messages": []msg{{"user", "hi"}}}, bearer(key))
	if resp, err := http.Get(gw.URL + "/metrics"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("/metrics on the API listener: %v %v; want 404", resp.StatusCode, err)
	}
	resp, err := http.Get("http://" + gw.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if !bytes.Contains(raw, []byte(`warmpath_cached_prefix_fraction{model="qwen3-32b",policy="warmpath",tenant="metered"}`)) {
		t.Errorf("no per-tenant cached-prefix fraction on the metrics listener")
	}
}
