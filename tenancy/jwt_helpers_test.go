package tenancy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

const (
	testIssuer   = "https://issuer.test"
	testAudience = "warmpath"
	testHS       = "hs-secret-0123456789-0123456789-0123456789"
)

// jwtKeys are one RSA and one EC key pair for the whole test binary.
type jwtKeys struct {
	rsa *rsa.PrivateKey
	ec  *ecdsa.PrivateKey
	// rsaPEM and ecPEM are the public keys as PKIX PEM.
	rsaPEM, ecPEM string
}

var testKeys = sync.OnceValue(func() jwtKeys {
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return jwtKeys{rsa: rk, ec: ek, rsaPEM: pemOf(&rk.PublicKey), ecPEM: pemOf(&ek.PublicKey)}
})

func pemOf(pub any) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		panic(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// jwtConfig is a keys+jwt configuration with an HS256 ("hs"), an RS256
// ("rs") and an ES256 ("es") key.
func jwtConfig(t testing.TB) Config {
	t.Helper()
	k := testKeys()
	cfg, err := Config{Mode: ModeKeysJWT, SaltSecret: testSalt, AdminKey: testAdmin, JWT: JWTConfig{
		Issuer: testIssuer, Audience: testAudience,
		Keys: []JWTKeyConfig{
			{KID: "hs", Alg: AlgHS256, Secret: testHS},
			{KID: "rs", Alg: AlgRS256, PublicKey: k.rsaPEM},
			{KID: "es", Alg: AlgES256, PublicKey: k.ecPEM},
		},
	}}.Validate()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// claims returns valid claims for tenant, expiring in an hour from now.
func claims(tenant string, now time.Time) jwt.MapClaims {
	return jwt.MapClaims{
		"iss": testIssuer, "aud": testAudience, "sub": "svc-1", "tenant": tenant,
		"exp": now.Add(time.Hour).Unix(), "iat": now.Unix(),
	}
}

func sign(t testing.TB, m jwt.SigningMethod, key any, kid string, c jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// jwksOf returns a JWKS document holding the RSA key under kid.
func jwksOf(kid string, pub *rsa.PublicKey) []byte {
	b64 := base64.RawURLEncoding.EncodeToString
	doc := map[string]any{"keys": []map[string]string{{
		"kty": "RSA", "kid": kid, "use": "sig", "alg": AlgRS256,
		"n": b64(pub.N.Bytes()), "e": b64(big.NewInt(int64(pub.E)).Bytes()),
	}}}
	b, _ := json.Marshal(doc)
	return b
}
