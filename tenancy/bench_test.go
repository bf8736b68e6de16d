package tenancy

import (
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// cachedAuth returns an Authenticator for cfg whose Store has tenant acme
// in its cache (and a dead Redis behind it: the cached path needs none,
// which also lets CI's benchmark smoke run without Redis).
func cachedAuth(b *testing.B, cfg Config) (*Authenticator, *Store) {
	b.Helper()
	st := NewStore(Redis{Client: deadClient(), Prefix: "bench:"}, cfg, nil)
	var jv *JWTVerifier
	if cfg.Mode != ModeKeys {
		var err error
		if jv, err = NewJWTVerifier(cfg, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
	a, err := NewAuthenticator(cfg, st, jv, nil)
	if err != nil {
		b.Fatal(err)
	}
	tn := Tenant{ID: "acme", Isolated: true, Models: []string{"qwen3-*"}}
	if err := tn.normalize(); err != nil {
		b.Fatal(err)
	}
	st.cache.Add("t:acme", cached{tenant: &tn, at: time.Now().Add(time.Hour)})
	return a, st
}

// BenchmarkAuthenticateCachedKey is the hot path's added latency: an API
// key whose key and tenant records are in the process cache.
func BenchmarkAuthenticateCachedKey(b *testing.B) {
	a, st := cachedAuth(b, testConfig(b))
	id, secret, full := newKeyMaterial()
	st.cache.Add("k:"+id, cached{key: &Key{ID: id, Tenant: "acme", Hash: hashSecret(secret)}, at: time.Now().Add(time.Hour)})
	h := bearer(full)
	if _, err := a.Authenticate(b.Context(), h); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.Authenticate(b.Context(), h); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAuthenticateJWT authenticates a JWT seen before (remembered by
// its hash, the steady state of a client reusing its token); the tenant
// record is cached. BenchmarkVerifyJWT is the first sight of a token.
func BenchmarkAuthenticateJWT(b *testing.B) {
	a, _ := cachedAuth(b, jwtConfig(b))
	k := testKeys()
	now := time.Now()
	for _, c := range []struct {
		name string
		m    jwt.SigningMethod
		key  any
		kid  string
	}{
		{"HS256", jwt.SigningMethodHS256, []byte(testHS), "hs"},
		{"RS256", jwt.SigningMethodRS256, k.rsa, "rs"},
		{"ES256", jwt.SigningMethodES256, k.ec, "es"},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := bearer(sign(b, c.m, c.key, c.kid, claims("acme", now)))
			if _, err := a.Authenticate(b.Context(), h); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := a.Authenticate(b.Context(), h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkVerifyJWT is a full signature and claims check, what a token
// costs the first time it is seen.
func BenchmarkVerifyJWT(b *testing.B) {
	v, err := NewJWTVerifier(jwtConfig(b), nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	k := testKeys()
	now := time.Now()
	for _, c := range []struct {
		name string
		m    jwt.SigningMethod
		key  any
		kid  string
	}{
		{"HS256", jwt.SigningMethodHS256, []byte(testHS), "hs"},
		{"RS256", jwt.SigningMethodRS256, k.rsa, "rs"},
		{"ES256", jwt.SigningMethodES256, k.ec, "es"},
	} {
		b.Run(c.name, func(b *testing.B) {
			tok := sign(b, c.m, c.key, c.kid, claims("acme", now))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := v.verify(tok); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
