package tenancy

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/warmpath/warmpath/internal/apierror"
)

// FuzzCredential fuzzes the credential headers through the whole
// Authenticator (keys+jwt, with no Redis behind it): whatever arrives, the
// answer is a principal or an apierror with 401 or 503, never a panic, and
// a 401 is always the same body.
func FuzzCredential(f *testing.F) {
	now := time.Now()
	seeds := []string{
		"Bearer wp-0123456789abcdef-" + strings.Repeat("ab", 32),
		"bearer sk-compose-dev", "Bearer ", "Basic abc", "Bearer a.b.c", "Bearer " + strings.Repeat("x", 9000),
		"Bearer " + sign(f, jwt.SigningMethodHS256, []byte(testHS), "hs", claims("acme", now)),
		"Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.", "Bearer wp--", "Bearer wp-0123456789abcdef-",
	}
	for _, s := range seeds {
		f.Add(s, "")
		f.Add("", strings.TrimPrefix(s, "Bearer "))
	}
	cfg := jwtConfig(f)
	st := NewStore(Redis{Client: deadClient(), Prefix: "fuzz:", Timeout: time.Millisecond}, cfg, nil)
	jv, err := NewJWTVerifier(cfg, nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	a, err := NewAuthenticator(cfg, st, jv, nil)
	if err != nil {
		f.Fatal(err)
	}
	want := errUnauthorized(nil).(*apierror.Error).Marshal()
	f.Fuzz(func(t *testing.T, authz, apiKey string) {
		h := http.Header{}
		if authz != "" {
			h.Set("Authorization", authz)
		}
		if apiKey != "" {
			h.Set("X-Api-Key", apiKey)
		}
		tok, _ := credential(h)
		if id, secret, ok := parseKey(tok); ok && keyPrefix+id+"-"+secret != tok {
			t.Fatalf("parseKey(%q) = %q, %q", tok, id, secret)
		}
		p, err := a.Authenticate(t.Context(), h)
		if err == nil {
			t.Fatalf("authenticated %v with no tenant in Redis", p)
		}
		he, ok := errors.AsType[*apierror.Error](err)
		if !ok || (he.Status != 401 && he.Status != 503) {
			t.Fatalf("error %v", err)
		}
		if he.Status == 401 && he != errNoKey && !bytes.Equal(he.Marshal(), want) {
			t.Fatalf("401 body %s differs from %s", he.Marshal(), want)
		}
	})
}

// FuzzAdminBodies fuzzes the admin API's JSON decoding and validation.
func FuzzAdminBodies(f *testing.F) {
	for _, s := range []string{
		`{"id":"acme","name":"Acme","isolated":true,"limits":{"requests_per_minute":60,"tokens_per_minute":1,"concurrent":2},"weight":3,"default_class":"background","class_ceiling":"interactive","models":["qwen3-*"]}`,
		`{"weight":5,"models":null}`, `{"models":[]}`, `{"name":"ci","expires_in":"24h","limits":{"concurrent":2}}`,
		`{"grace":"1h"}`, `{"expires":"2030-01-01T00:00:00Z"}`, `{`, `[]`, `null`, `{"id":"x"} {}`, `{"limits":{"concurrent":-1}}`,
	} {
		f.Add([]byte(s))
	}
	now := time.Now()
	f.Fuzz(func(t *testing.T, b []byte) {
		var tb tenantBody
		if decodeBody(bytes.NewReader(b), &tb, false) == nil {
			tn := tb.tenant()
			if tn.normalize() == nil && (!idPattern.MatchString(tn.ID) || !validClass(tn.ClassCeiling) || tn.Weight < 1 ||
				classRank(tn.DefaultClass) > classRank(tn.ClassCeiling)) {
				t.Fatalf("normalize accepted %+v", tn)
			}
		}
		var p TenantPatch
		if decodeBody(bytes.NewReader(b), &p, false) == nil {
			tn := Tenant{ID: "x"}
			p.Apply(&tn)
			_ = tn.normalize()
		}
		var ib issueBody
		if decodeBody(bytes.NewReader(b), &ib, true) == nil {
			_ = ib.validate(now)
		}
		var rb rotateBody
		_ = decodeBody(bytes.NewReader(b), &rb, true)
	})
}

// FuzzJWKS fuzzes the JWKS file parser.
func FuzzJWKS(f *testing.F) {
	f.Add(jwksOf("r", &testKeys().rsa.PublicKey))
	f.Add([]byte(`{"keys":[{"kty":"oct","kid":"a","k":"` + strings.Repeat("A", 43) + `"}]}`))
	f.Add([]byte(`{"keys":[{"kty":"EC","kid":"e","crv":"P-256","x":"` + strings.Repeat("A", 43) + `","y":"` + strings.Repeat("A", 43) + `"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		set, err := parseJWKS(b)
		if err != nil {
			return
		}
		for kid, k := range set {
			if kid == "" || (k.alg != AlgHS256 && k.alg != AlgRS256 && k.alg != AlgES256) {
				t.Fatalf("key %q pinned to %q", kid, k.alg)
			}
		}
	})
}
