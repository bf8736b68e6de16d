package tenancy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func TestJWTAlgorithms(t *testing.T) {
	cfg := jwtConfig(t)
	now := time.Now().Truncate(time.Second)
	v, err := NewJWTVerifier(cfg, func() time.Time { return now }, nil)
	if err != nil {
		t.Fatal(err)
	}
	k := testKeys()
	ok := map[string]string{
		"HS256": sign(t, jwt.SigningMethodHS256, []byte(testHS), "hs", claims("acme", now)),
		"RS256": sign(t, jwt.SigningMethodRS256, k.rsa, "rs", claims("acme", now)),
		"ES256": sign(t, jwt.SigningMethodES256, k.ec, "es", claims("acme", now)),
	}
	for name, tok := range ok {
		id, err := v.Verify(tok)
		if err != nil || id.tenant != "acme" || id.subject != "svc-1" {
			t.Errorf("%s: %+v %v", name, id, err)
		}
	}
	// Leeway: expired 10s ago is still within the 30s leeway; 60s is not.
	for ago, want := range map[time.Duration]bool{10 * time.Second: true, time.Minute: false} {
		c := claims("acme", now)
		c["exp"] = now.Add(-ago).Unix()
		_, err := v.Verify(sign(t, jwt.SigningMethodHS256, []byte(testHS), "hs", c))
		if (err == nil) != want {
			t.Errorf("expired %v ago: err %v; want ok=%v", ago, err, want)
		}
	}
	// The classic confusion: an HS256 token whose "secret" is the RSA
	// public key, naming the RSA key's kid.
	forged := sign(t, jwt.SigningMethodHS256, []byte(k.rsaPEM), "rs", claims("acme", now))
	if _, err := v.Verify(forged); err == nil {
		t.Fatal("HS256 token signed with the RSA public key was accepted")
	}
	// A remembered token still expires: at exp plus leeway, not at the
	// cache's TTL.
	c := claims("acme", now)
	c["exp"] = now.Add(5 * time.Second).Unix()
	short := sign(t, jwt.SigningMethodHS256, []byte(testHS), "hs", c)
	if _, err := v.Verify(short); err != nil {
		t.Fatal(err)
	}
	now = now.Add(5*time.Second + cfg.JWT.Leeway + time.Second)
	if _, err := v.Verify(short); err == nil {
		t.Fatal("a remembered token outlived its exp")
	}
	// PS256 and friends are not on the list at all.
	if _, err := v.Verify(sign(t, jwt.SigningMethodPS256, k.rsa, "rs", claims("acme", now))); err == nil {
		t.Error("PS256 accepted on an RS256 key")
	}
}

func TestJWTSingleKeyWithoutKID(t *testing.T) {
	cfg, err := Config{Mode: ModeJWT, SaltSecret: testSalt, JWT: JWTConfig{Issuer: testIssuer, Audience: testAudience,
		Keys: []JWTKeyConfig{{Alg: AlgHS256, Secret: testHS}}}}.Validate()
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewJWTVerifier(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(sign(t, jwt.SigningMethodHS256, []byte(testHS), "", claims("acme", time.Now()))); err != nil {
		t.Fatalf("single key, no kid: %v", err)
	}
	if _, err := v.Verify(sign(t, jwt.SigningMethodHS256, []byte(testHS), "idp-key-7", claims("acme", time.Now()))); err != nil {
		t.Fatalf("single key configured without kid, token with kid: %v", err)
	}
	if _, err := v.Verify(sign(t, jwt.SigningMethodRS256, testKeys().rsa, "idp-key-7", claims("acme", time.Now()))); err == nil {
		t.Fatal("the single HS256 key verified an RS256 token")
	}
}

// TestJWKSReload: Run picks up a changed JWKS file at its next poll; a
// broken file keeps the previous keys.
func TestJWKSReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		file := filepath.Join(dir, "jwks.json")
		k := testKeys()
		if err := os.WriteFile(file, jwksOf("old", &k.rsa.PublicKey), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := Config{Mode: ModeJWT, SaltSecret: testSalt, JWT: JWTConfig{Issuer: testIssuer, Audience: testAudience,
			JWKSFile: file}}.Validate()
		if err != nil {
			t.Fatal(err)
		}
		v, err := NewJWTVerifier(cfg, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		go func() { _ = v.Run(ctx) }()
		tokNew := sign(t, jwt.SigningMethodRS256, k.rsa, "new", claims("acme", time.Now()))
		if _, err := v.Verify(sign(t, jwt.SigningMethodRS256, k.rsa, "old", claims("acme", time.Now()))); err != nil {
			t.Fatal(err)
		}
		if _, err := v.Verify(tokNew); err == nil {
			t.Fatal("kid new accepted before the file has it")
		}

		replace(t, file, jwksOf("new", &k.rsa.PublicKey), 1)
		time.Sleep(cfg.JWT.JWKSPoll) // fake time: one poll interval
		synctest.Wait()
		if _, err := v.Verify(tokNew); err != nil {
			t.Fatalf("after the poll: %v", err)
		}

		replace(t, file, []byte(`{"keys":[{"kty":"RSA"`), 2)
		time.Sleep(cfg.JWT.JWKSPoll)
		synctest.Wait()
		if _, err := v.Verify(tokNew); err != nil {
			t.Fatalf("a broken file dropped the keys: %v", err)
		}
	})
}

// replace writes b to file with an mtime n seconds later than any real
// write, so the change is seen even within the filesystem's clock tick.
func replace(t *testing.T, file string, b []byte, n int) {
	t.Helper()
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	mt := time.Unix(2e9+int64(n), 0)
	if err := os.Chtimes(file, mt, mt); err != nil {
		t.Fatal(err)
	}
}

func TestJWKSParse(t *testing.T) {
	bad := map[string]string{
		"no kid":         `{"keys":[{"kty":"oct","k":"` + strings.Repeat("A", 43) + `"}]}`,
		"short oct":      `{"keys":[{"kty":"oct","kid":"a","k":"AAAA"}]}`,
		"oct as RS256":   `{"keys":[{"kty":"oct","kid":"a","alg":"RS256","k":"` + strings.Repeat("A", 43) + `"}]}`,
		"RSA as HS256":   `{"keys":[{"kty":"RSA","kid":"a","alg":"HS256","n":"AQAB","e":"AQAB"}]}`,
		"EC wrong curve": `{"keys":[{"kty":"EC","kid":"a","crv":"P-384","x":"AA","y":"AA"}]}`,
		"unknown kty":    `{"keys":[{"kty":"OKP","kid":"a"}]}`,
		"duplicate kid":  `{"keys":[{"kty":"oct","kid":"a","k":"` + strings.Repeat("A", 43) + `"},{"kty":"oct","kid":"a","k":"` + strings.Repeat("B", 43) + `"}]}`,
		"not json":       `{`,
		"small RSA":      `{"keys":[{"kty":"RSA","kid":"a","n":"AQAB","e":"AQAB"}]}`,
		"huge exponent":  `{"keys":[{"kty":"RSA","kid":"a","n":"AQAB","e":"AQABAQAB"}]}`,
	}
	for name, doc := range bad {
		if _, err := parseJWKS([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	set, err := parseJWKS([]byte(`{"keys":[{"kty":"oct","kid":"a","k":"` + strings.Repeat("A", 43) + `"},{"kty":"RSA","use":"enc","kid":"e"}]}`))
	if err != nil || len(set) != 1 || set["a"].alg != AlgHS256 {
		t.Fatalf("set = %v, %v; want a pinned to HS256, the encryption key skipped", set, err)
	}
	set, err = parseJWKS(jwksOf("r", &testKeys().rsa.PublicKey))
	if err != nil || set["r"].alg != AlgRS256 {
		t.Fatalf("RSA JWKS: %v %v", set, err)
	}
}
