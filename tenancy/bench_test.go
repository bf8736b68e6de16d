package tenancy

import (
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// BenchmarkAuthenticateCachedKey is the hot path's added latency: an API
// key whose key and tenant records are in the process cache.
func BenchmarkAuthenticateCachedKey(b *testing.B) {
	e := newEnv(b)
	mustTenant(b, e.store, Tenant{ID: "acme", Isolated: true, Models: []string{"qwen3-*"}})
	_, full := mustKey(b, e.store, "acme", KeySpec{})
	e.auth.now, e.store.now = time.Now, time.Now
	h := bearer(full)
	if _, err := e.auth.Authenticate(b.Context(), h); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.auth.Authenticate(b.Context(), h); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAuthenticateJWT authenticates a JWT seen before (remembered by
// its hash, the steady state of a client reusing its token); the tenant
// record is cached. BenchmarkVerifyJWT is the first sight of a token.
func BenchmarkAuthenticateJWT(b *testing.B) {
	base := newEnv(b)
	e := envOn(b, base.rdb, base.r.Prefix, jwtConfig(b))
	mustTenant(b, e.store, Tenant{ID: "acme"})
	e.auth.now, e.store.now = time.Now, time.Now
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
			if _, err := e.auth.Authenticate(b.Context(), h); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.auth.Authenticate(b.Context(), h); err != nil {
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
