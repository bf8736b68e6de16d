package tenancy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/warmpath/warmpath/internal/apierror"
)

// msgBadKey is the one message of every credential failure, so a client
// cannot tell which part was wrong.
const msgBadKey = "Incorrect API key provided."

// errUnauthorized is the 401 of every bad credential; cause goes to the log
// only.
func errUnauthorized(cause error) error {
	return &apierror.Error{Status: http.StatusUnauthorized, Type: apierror.TypeInvalidRequest, Code: "invalid_api_key",
		Msg: msgBadKey, Err: cause}
}

// errNoKey is the 401 of a request without any credential header.
var errNoKey = &apierror.Error{Status: http.StatusUnauthorized, Type: apierror.TypeInvalidRequest, Code: "invalid_api_key",
	Msg: "You didn't provide an API key. Provide it in the Authorization header as Bearer <key> (or in x-api-key)."}

// Authenticator turns a request's credential into a Principal. It is safe
// for concurrent use and runs no goroutines (its Store and JWTVerifier have
// their own Run).
type Authenticator struct {
	mode   string
	store  *Store
	jwt    *JWTVerifier
	secret []byte
	log    *slog.Logger
	now    func() time.Time
	salts  sync.Map // tenant id → *string, the tenant's cache salt
}

// NewAuthenticator builds an Authenticator for cfg (after Validate). The
// keys modes need st; the jwt modes need st (for tenant records) and jv.
// log may be nil.
func NewAuthenticator(cfg Config, st *Store, jv *JWTVerifier, log *slog.Logger) (*Authenticator, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Authenticator{mode: cfg.Mode, store: st, jwt: jv, secret: []byte(cfg.SaltSecret), log: log, now: time.Now}
	switch {
	case cfg.Mode == ModeNone:
	case cfg.Mode != ModeKeys && cfg.Mode != ModeJWT && cfg.Mode != ModeKeysJWT:
		return nil, fmt.Errorf("tenancy: auth.mode %q is not keys, jwt, keys+jwt or none", cfg.Mode)
	case st == nil:
		return nil, errors.New("tenancy: a Store is required unless auth.mode is none")
	case a.jwtOn() && jv == nil:
		return nil, errors.New("tenancy: a JWTVerifier is required in the jwt modes")
	}
	return a, nil
}

func (a *Authenticator) keysOn() bool { return a.mode == ModeKeys || a.mode == ModeKeysJWT }
func (a *Authenticator) jwtOn() bool  { return a.mode == ModeJWT || a.mode == ModeKeysJWT }

// anonymous is everyone in mode none: one shared tenant without limits.
func anonymous() *Principal {
	return &Principal{TenantID: "anonymous", TenantName: "anonymous", KeyID: ModeNone,
		DefaultClass: ClassInteractive, ClassCeiling: ClassInteractive, Weight: 1}
}

// Authenticate returns the principal of the credential in h. Every bad
// credential is the same 401 invalid_api_key; a key that cannot be checked
// because Redis is unreachable and it is not cached is a 503, since the key
// may well be valid and clients retry a 503 but give up on a 401.
func (a *Authenticator) Authenticate(ctx context.Context, h http.Header) (*Principal, error) {
	if a.mode == ModeNone {
		return anonymous(), nil
	}
	tok, present := credential(h)
	switch {
	case !present:
		return nil, errNoKey
	case tok == "":
		return nil, errUnauthorized(errors.New("malformed credential header"))
	}
	if id, secret, ok := parseKey(tok); ok {
		if !a.keysOn() {
			return nil, errUnauthorized(errors.New("API keys are off"))
		}
		return a.byKey(ctx, id, secret)
	}
	if looksLikeJWT(tok) && a.jwtOn() {
		return a.byJWT(ctx, tok)
	}
	if a.keysOn() && len(tok) >= 8 && !strings.HasPrefix(tok, keyPrefix) {
		return a.byImported(ctx, tok)
	}
	return nil, errUnauthorized(errors.New("not a key or JWT"))
}

func (a *Authenticator) byKey(ctx context.Context, id, secret string) (*Principal, error) {
	now := a.now()
	k, err := a.store.lookupKey(ctx, id, now)
	if err != nil {
		return nil, a.lookupErr(err)
	}
	if !secretMatches(secret, k.Hash) || k.Imported {
		return nil, errUnauthorized(errors.New("wrong secret"))
	}
	return a.forKey(ctx, k, now)
}

func (a *Authenticator) byImported(ctx context.Context, tok string) (*Principal, error) {
	now := a.now()
	k, err := a.store.lookupHash(ctx, hashSecret(tok), now)
	if err != nil {
		return nil, a.lookupErr(err)
	}
	if !k.Imported || !secretMatches(tok, k.Hash) {
		return nil, errUnauthorized(errors.New("hash index mismatch"))
	}
	return a.forKey(ctx, k, now)
}

// forKey checks the key's state and its tenant's, and builds the principal.
func (a *Authenticator) forKey(ctx context.Context, k *Key, now time.Time) (*Principal, error) {
	if !k.active(now) {
		return nil, errUnauthorized(errors.New("key revoked or expired"))
	}
	t, err := a.store.lookupTenant(ctx, k.Tenant, now)
	if err != nil {
		return nil, a.lookupErr(err)
	}
	if t.Disabled {
		return nil, errUnauthorized(errors.New("tenant disabled"))
	}
	a.store.noteUse(k.ID, now)
	p := principalFor(t, k)
	p.salt = a.salt(t)
	return p, nil
}

func (a *Authenticator) byJWT(ctx context.Context, tok string) (*Principal, error) {
	id, err := a.jwt.Verify(tok)
	if err != nil {
		return nil, errUnauthorized(err)
	}
	t, err := a.store.lookupTenant(ctx, id.tenant, a.now())
	if err != nil {
		return nil, a.lookupErr(err)
	}
	if t.Disabled {
		return nil, errUnauthorized(errors.New("tenant disabled"))
	}
	p := principalFor(t, nil)
	p.salt = a.salt(t)
	p.KeyID = "jwt:" + id.subject
	p.ClassCeiling = lowerClass(p.ClassCeiling, id.class)
	p.DefaultClass = lowerClass(p.DefaultClass, p.ClassCeiling)
	p.KeyLimits = capLimits(id.limits, t.Limits)
	return p, nil
}

// ForTenant returns the principal a tenant's own background work runs as
// (a background Responses turn, run after its creating request is gone):
// the tenant's limits, weight, classes and cache salt, no key's. In mode
// none it is the anonymous principal whatever the id.
func (a *Authenticator) ForTenant(ctx context.Context, tenantID string) (*Principal, error) {
	if a.mode == ModeNone {
		return anonymous(), nil
	}
	t, err := a.store.lookupTenant(ctx, tenantID, a.now())
	if err != nil {
		return nil, a.lookupErr(err)
	}
	if t.Disabled {
		return nil, errUnauthorized(errors.New("tenant disabled"))
	}
	p := principalFor(t, nil)
	p.salt = a.salt(t)
	p.KeyID = "tenant"
	return p, nil
}

// capLimits keeps the limits a claim sets, each no higher than the
// tenant's: a claim lowers, never raises.
func capLimits(claim, tenant Limits) Limits {
	c := func(v, t int) int {
		if v == 0 {
			return 0
		}
		return lowerLimit(v, t)
	}
	return Limits{
		RequestsPerMinute: c(claim.RequestsPerMinute, tenant.RequestsPerMinute),
		TokensPerMinute:   c(claim.TokensPerMinute, tenant.TokensPerMinute),
		Concurrent:        c(claim.Concurrent, tenant.Concurrent),
	}
}

func (a *Authenticator) lookupErr(err error) error {
	if errors.Is(err, ErrNotFound) {
		return errUnauthorized(err)
	}
	if errors.Is(err, errUnavailable) {
		return apierror.Unavailable(err, "Authentication is temporarily unavailable; retry shortly.")
	}
	return errUnauthorized(err)
}

// salt returns the tenant's cache salt (nil for shared tenants), computed
// once per tenant.
func (a *Authenticator) salt(t *Tenant) *string {
	if !t.Isolated {
		return nil
	}
	if s, ok := a.salts.Load(t.ID); ok {
		return s.(*string)
	}
	s := tenantSalt(a.secret, t.ID)
	a.salts.Store(t.ID, &s)
	return &s
}

// Middleware authenticates every request and passes it on with its
// Principal in the context (see FromContext), after removing the
// credential headers so they never reach an upstream. Failures are written
// in the OpenAI envelope.
func (a *Authenticator) Middleware(next http.Handler) http.Handler {
	return a.MiddlewareWith(a.Authenticate)(next)
}

// MiddlewareWith is Middleware authenticating each request with
// authenticate, which wraps Authenticate (the gateway's tracing times it).
func (a *Authenticator) MiddlewareWith(authenticate func(context.Context, http.Header) (*Principal, error)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler { return a.middleware(authenticate, next) }
}

func (a *Authenticator) middleware(authenticate func(context.Context, http.Header) (*Principal, error), next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := authenticate(r.Context(), r.Header)
		if err != nil {
			he := apierror.Write(w, err)
			a.log.Debug("tenancy: authentication failed", "status", he.Status, "err", he.Err)
			return
		}
		r.Header.Del("Authorization")
		r.Header.Del("X-Api-Key")
		next.ServeHTTP(w, r.WithContext(NewContext(r.Context(), p)))
	})
}
