package tenancy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/warmpath/warmpath/internal/periodic"
)

// Supported JWT algorithms. Each verification key is pinned to one.
const (
	AlgHS256 = "HS256"
	AlgRS256 = "RS256"
	AlgES256 = "ES256"
)

// verificationKey is a key pinned to its algorithm.
type verificationKey struct {
	alg string
	key any // []byte, *rsa.PublicKey or *ecdsa.PublicKey, matching alg
}

// keySet maps kid to key; "" is the key of tokens without a kid (only when
// the set has exactly one key).
type keySet map[string]verificationKey

// parse turns a configured key into a pinned verification key.
func (k JWTKeyConfig) parse() (verificationKey, error) {
	switch k.Alg {
	case AlgHS256:
		if len(k.Secret) < 32 {
			return verificationKey{}, errors.New("HS256 needs a secret of at least 32 bytes")
		}
		return verificationKey{alg: AlgHS256, key: []byte(k.Secret)}, nil
	case AlgRS256, AlgES256:
		pub, err := parsePublicPEM(k.PublicKey)
		if err != nil {
			return verificationKey{}, err
		}
		return pinPublic(k.Alg, pub)
	}
	return verificationKey{}, fmt.Errorf("alg %q is not HS256, RS256 or ES256", k.Alg)
}

func parsePublicPEM(s string) (any, error) {
	b, _ := pem.Decode([]byte(s))
	if b == nil {
		return nil, errors.New("public_key: no PEM block")
	}
	switch b.Type {
	case "PUBLIC KEY":
		return x509.ParsePKIXPublicKey(b.Bytes)
	case "RSA PUBLIC KEY":
		return x509.ParsePKCS1PublicKey(b.Bytes)
	}
	return nil, fmt.Errorf("public_key: PEM block %q is not a PUBLIC KEY", b.Type)
}

// pinPublic checks that pub is of alg's kind.
func pinPublic(alg string, pub any) (verificationKey, error) {
	switch p := pub.(type) {
	case *rsa.PublicKey:
		if alg != AlgRS256 {
			return verificationKey{}, fmt.Errorf("an RSA key cannot verify %s", alg)
		}
		if p.N.BitLen() < 2048 {
			return verificationKey{}, errors.New("RSA keys must have at least 2048 bits")
		}
		return verificationKey{alg: alg, key: p}, nil
	case *ecdsa.PublicKey:
		if alg != AlgES256 || p.Curve != elliptic.P256() {
			return verificationKey{}, fmt.Errorf("an EC key on %s cannot verify %s", p.Curve.Params().Name, alg)
		}
		return verificationKey{alg: alg, key: p}, nil
	}
	return verificationKey{}, fmt.Errorf("unsupported public key type %T", pub)
}

// jwk is one JSON Web Key, the members warmpath reads.
type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
	K   string `json:"k"`
}

// parseJWKS decodes a JWKS document. Every usable signing key must have a
// kid; keys for encryption are skipped; a key whose alg is missing is pinned
// by its type (RSA → RS256, EC P-256 → ES256, oct → HS256).
func parseJWKS(b []byte) (keySet, error) {
	var doc struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	set := keySet{}
	for i, k := range doc.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		if k.Kid == "" {
			return nil, fmt.Errorf("jwks: keys[%d]: kid required", i)
		}
		vk, err := k.parse()
		if err != nil {
			return nil, fmt.Errorf("jwks: keys[%d] (kid %q): %w", i, k.Kid, err)
		}
		if _, dup := set[k.Kid]; dup {
			return nil, fmt.Errorf("jwks: kid %q appears twice", k.Kid)
		}
		set[k.Kid] = vk
	}
	return set, nil
}

func (k jwk) parse() (verificationKey, error) {
	b64 := func(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }
	alg := k.Alg
	switch k.Kty {
	case "RSA":
		if alg == "" {
			alg = AlgRS256
		}
		n, err1 := b64(k.N)
		e, err2 := b64(k.E)
		if err := errors.Join(err1, err2); err != nil || len(e) == 0 || len(e) > 4 {
			return verificationKey{}, errors.New("bad RSA n or e")
		}
		pub := &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
		return pinPublic(alg, pub)
	case "EC":
		if alg == "" {
			alg = AlgES256
		}
		x, err1 := b64(k.X)
		y, err2 := b64(k.Y)
		if err := errors.Join(err1, err2); err != nil || k.Crv != "P-256" || len(x) != 32 || len(y) != 32 {
			return verificationKey{}, errors.New("bad EC key (only P-256 with 32-byte x and y)")
		}
		pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, x...), y...))
		if err != nil {
			return verificationKey{}, err
		}
		return pinPublic(alg, pub)
	case "oct":
		if alg == "" {
			alg = AlgHS256
		}
		secret, err := b64(k.K)
		if err != nil || alg != AlgHS256 || len(secret) < 32 {
			return verificationKey{}, errors.New("oct keys are HS256 with at least 32 bytes")
		}
		return verificationKey{alg: alg, key: secret}, nil
	}
	return verificationKey{}, fmt.Errorf("kty %q is not RSA, EC or oct", k.Kty)
}

// JWTVerifier verifies bearer JWTs against configured keys and a JWKS file.
// It is safe for concurrent use; Run reloads the file when it changes.
type JWTVerifier struct {
	cfg    JWTConfig
	ttl    time.Duration // how long a verified token is remembered
	now    func() time.Time
	tokens *lru.Cache[[sha256.Size]byte, verifiedToken]
	static keySet
	file   atomic.Pointer[keySet] // from cfg.JWKSFile; never nil after New
	parser *jwt.Parser
	log    *slog.Logger

	reloadMu sync.Mutex // serializes Reload; guards seen
	seen     fileStamp
}

type fileStamp struct {
	mod  time.Time
	size int64
	sum  [sha256.Size]byte
}

// verifiedToken is a token that verified, remembered until until.
type verifiedToken struct {
	id    jwtIdentity
	until time.Time
}

// NewJWTVerifier builds a verifier from c's JWT section (after
// Config.Validate) and loads the JWKS file, if any, once. Verified tokens
// are remembered (by SHA-256) for at most c.CacheTTL and never past their
// exp, so a repeated token costs a hash, not a signature check; a JWKS
// reload forgets them all. It starts nothing; call Run to follow the file.
// now may be nil (time.Now).
func NewJWTVerifier(c Config, now func() time.Time, log *slog.Logger) (*JWTVerifier, error) {
	c = c.WithDefaults()
	cfg := c.JWT
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if now == nil {
		now = time.Now
	}
	tokens, _ := lru.New[[sha256.Size]byte, verifiedToken](max(c.CacheSize, 1))
	v := &JWTVerifier{cfg: cfg, ttl: c.CacheTTL, now: now, tokens: tokens, static: keySet{}, log: log}
	for i, kc := range cfg.Keys {
		k, err := kc.parse()
		if err != nil {
			return nil, fmt.Errorf("tenancy: auth.jwt.keys[%d]: %w", i, err)
		}
		v.static[kc.KID] = k
	}
	v.parser = jwt.NewParser(
		jwt.WithValidMethods([]string{AlgHS256, AlgRS256, AlgES256}),
		jwt.WithIssuer(cfg.Issuer), jwt.WithAudience(cfg.Audience),
		jwt.WithExpirationRequired(), jwt.WithLeeway(cfg.Leeway), jwt.WithTimeFunc(now))
	empty := keySet{}
	v.file.Store(&empty)
	if cfg.JWKSFile != "" {
		if err := v.Reload(); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// Reload reads the JWKS file when its mtime or size changed since the last
// read and swaps in its keys when its content changed. A file that fails to
// parse leaves the previous keys in place and returns the error.
func (v *JWTVerifier) Reload() error {
	v.reloadMu.Lock()
	defer v.reloadMu.Unlock()
	fi, err := os.Stat(v.cfg.JWKSFile)
	if err != nil {
		return fmt.Errorf("tenancy: jwks_file: %w", err)
	}
	if fi.ModTime().Equal(v.seen.mod) && fi.Size() == v.seen.size {
		return nil
	}
	b, err := os.ReadFile(v.cfg.JWKSFile)
	if err != nil {
		return fmt.Errorf("tenancy: jwks_file: %w", err)
	}
	stamp := fileStamp{mod: fi.ModTime(), size: fi.Size(), sum: sha256.Sum256(b)}
	if stamp.sum == v.seen.sum {
		v.seen = stamp
		return nil
	}
	set, err := parseJWKS(b)
	if err != nil {
		return fmt.Errorf("tenancy: jwks_file %s: %w", v.cfg.JWKSFile, err)
	}
	v.file.Store(&set)
	v.tokens.Purge()
	v.seen = stamp
	v.log.Info("tenancy: loaded JWKS", "file", v.cfg.JWKSFile, "keys", len(set))
	return nil
}

// Run polls the JWKS file every JWKSPoll until ctx ends; without a file it
// just waits. Reload errors are logged and the previous keys kept.
func (v *JWTVerifier) Run(ctx context.Context) error {
	if v.cfg.JWKSFile == "" {
		<-ctx.Done()
		return nil
	}
	periodic.Every(ctx, v.cfg.JWKSPoll, func() {
		if err := v.Reload(); err != nil {
			v.log.Warn("tenancy: JWKS reload failed; keeping the previous keys", "err", err)
		}
	})
	return nil
}

// keyFor resolves the token's kid and checks its alg against the key's pin.
func (v *JWTVerifier) keyFor(t *jwt.Token) (any, error) {
	kid, _ := t.Header["kid"].(string)
	file := *v.file.Load()
	k, ok := v.static[kid]
	if !ok {
		k, ok = file[kid]
	}
	if !ok {
		// A key configured without a kid is the only key; it verifies
		// tokens whatever kid they name. Otherwise only a token without
		// a kid may use the single key there is.
		if only, single := onlyKey(v.static, file); single {
			_, noKID := v.static[""]
			k, ok = only, noKID || kid == ""
		}
	}
	if !ok {
		return nil, errors.New("unknown kid")
	}
	if t.Method.Alg() != k.alg {
		return nil, fmt.Errorf("alg %s is not the key's %s", t.Method.Alg(), k.alg)
	}
	return k.key, nil
}

// onlyKey returns the single key of the sets, for tokens without a kid;
// with several keys a token must name its kid.
func onlyKey(sets ...keySet) (verificationKey, bool) {
	var (
		only verificationKey
		n    int
	)
	for _, s := range sets {
		for _, k := range s {
			only = k
			n++
		}
	}
	return only, n == 1
}

// jwtIdentity is what a verified token says.
type jwtIdentity struct {
	subject, tenant, class string
	limits                 Limits
}

// Verify checks tok's signature (pinned algorithm), iss, aud and exp (with
// leeway), and returns its subject, tenant and lowering claims. A token
// verified within CacheTTL is answered from memory.
func (v *JWTVerifier) Verify(tok string) (jwtIdentity, error) {
	sum := sha256.Sum256([]byte(tok))
	now := v.now()
	if vt, ok := v.tokens.Get(sum); ok && now.Before(vt.until) {
		return vt.id, nil
	}
	id, exp, err := v.verify(tok)
	if err != nil {
		return jwtIdentity{}, err
	}
	until := now.Add(v.ttl)
	if exp.Before(until) {
		until = exp
	}
	v.tokens.Add(sum, verifiedToken{id: id, until: until})
	return id, nil
}

// verify checks tok in full and returns its identity and expiry.
func (v *JWTVerifier) verify(tok string) (jwtIdentity, time.Time, error) {
	claims := jwt.MapClaims{}
	if _, err := v.parser.ParseWithClaims(tok, claims, v.keyFor); err != nil {
		return jwtIdentity{}, time.Time{}, fmt.Errorf("tenancy: jwt: %w", err)
	}
	exp, err := claims.GetExpirationTime()
	if err != nil || exp == nil {
		return jwtIdentity{}, time.Time{}, errors.New("tenancy: jwt: exp required")
	}
	id := jwtIdentity{}
	id.subject, _ = claims["sub"].(string)
	id.tenant, _ = claims[v.cfg.TenantClaim].(string)
	if id.subject == "" || len(id.subject) > 256 || !idPattern.MatchString(id.tenant) {
		return jwtIdentity{}, time.Time{}, errors.New("tenancy: jwt: sub and a valid tenant claim are required")
	}
	if c, ok := claims[v.cfg.ClassClaim].(string); ok && validClass(c) {
		id.class = c
	}
	if raw, ok := claims[v.cfg.LimitsClaim]; ok {
		b, _ := json.Marshal(raw)
		var l Limits
		if err := json.Unmarshal(b, &l); err != nil || l.validate("") != nil {
			return jwtIdentity{}, time.Time{}, errors.New("tenancy: jwt: malformed limits claim")
		}
		id.limits = l
	}
	return id, exp.Time, nil
}
