package tenancy

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"slices"

	"github.com/warmpath/warmpath/internal/apierror"
)

// Principal is who a request is from: the tenant, the credential, and what
// they may do. Authenticator builds it; handlers read it with FromContext.
// A Principal is immutable once in a context.
type Principal struct {
	// TenantID and TenantName identify the tenant.
	TenantID, TenantName string
	// KeyID is the API key's id, or "jwt:<subject>" for a JWT, or "none"
	// in mode none.
	KeyID string
	// Isolated tenants get their own cache salt on every upstream request.
	Isolated bool
	// Models is the effective allow-list (tenant ∩ key); nil allows all.
	Models []string
	// DefaultClass and ClassCeiling are priority classes ("interactive",
	// "background"); DefaultClass never exceeds ClassCeiling.
	DefaultClass, ClassCeiling string
	// Limits are the tenant's limits, shared by all its keys; KeyLimits are
	// this key's (or JWT subject's) own, enforced besides them.
	Limits, KeyLimits Limits
	// Weight is the tenant's fair-share weight, at least 1.
	Weight int
	// BreakExcerpts is the tenant's opt-in to text excerpts around its
	// prefix breaks (Tenant.BreakExcerpts).
	BreakExcerpts bool

	// salt is the tenant cache salt, hex HMAC-SHA256 of the tenant id under
	// the server secret; nil for shared tenants. A pointer, so that fmt and
	// slog print an address, never the salt, even for a Principal value.
	salt *string
}

// tenantSalt is the isolated-tenant cache salt: hex HMAC-SHA256 of the
// tenant id under secret.
func tenantSalt(secret []byte, tenantID string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(tenantID))
	return hex.EncodeToString(m.Sum(nil))
}

// CacheSalt returns the cache_salt to send upstream for this principal's
// request, given the client's own cache_salt ("" when none). A shared
// tenant's requests keep the client's salt unchanged. An isolated tenant's
// always carry the tenant salt; a client salt is combined with it (as a
// second HMAC), so the client's own partitioning survives within the tenant.
func (p *Principal) CacheSalt(clientSalt string) string {
	if !p.Isolated || p.salt == nil {
		return clientSalt
	}
	if clientSalt == "" {
		return *p.salt
	}
	m := hmac.New(sha256.New, []byte(*p.salt))
	m.Write([]byte(clientSalt))
	return hex.EncodeToString(m.Sum(nil))
}

// Allows returns nil when model is on the principal's allow-list, else a
// 403 permission_error with code model_not_allowed and param "model". The
// status and type follow OpenAI's 403s (SDKs raise PermissionDeniedError
// on 403 whatever the type).
func (p *Principal) Allows(model string) error {
	if allowModel(p.Models, model) {
		return nil
	}
	return &apierror.Error{Status: http.StatusForbidden, Type: apierror.TypePermission, Code: "model_not_allowed", Param: "model",
		Msg: fmt.Sprintf("This key is not allowed to use the model '%s'.", truncate(model, 256))}
}

// Class returns the priority class for a request asking for want ("" for
// none): the default class when none, never above the ceiling.
func (p *Principal) Class(want string) string {
	if !validClass(want) {
		want = p.DefaultClass
	}
	return lowerClass(want, p.ClassCeiling)
}

// LogValue logs the principal without its cache salt.
func (p *Principal) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("tenant", p.TenantID), slog.String("key", p.KeyID), slog.Bool("isolated", p.Isolated))
}

// String formats the principal without its cache salt, for fmt's %v.
func (p *Principal) String() string {
	return fmt.Sprintf("tenant %s key %s", p.TenantID, p.KeyID)
}

// GoString keeps %#v from printing the salt.
func (p *Principal) GoString() string { return "tenancy.Principal{" + p.String() + "}" }

// Format makes every fmt verb (%+v included) print String.
func (p *Principal) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		_, _ = f.Write([]byte(p.GoString()))
		return
	}
	_, _ = f.Write([]byte(p.String()))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

type ctxKey struct{}

// NewContext returns ctx carrying p.
func NewContext(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// FromContext returns the principal in ctx, if any.
func FromContext(ctx context.Context) (*Principal, bool) {
	p, ok := ctx.Value(ctxKey{}).(*Principal)
	return p, ok && p != nil
}

// principalFor builds the principal of key k (nil for a JWT) of tenant t,
// without its salt.
func principalFor(t *Tenant, k *Key) *Principal {
	p := &Principal{
		TenantID: t.ID, TenantName: t.Name, Isolated: t.Isolated,
		Models: slices.Clone(t.Models), DefaultClass: t.DefaultClass, ClassCeiling: t.ClassCeiling,
		Limits: t.Limits, Weight: max(t.Weight, 1), BreakExcerpts: t.BreakExcerpts,
	}
	if k != nil {
		p.KeyID = k.ID
		p.Models = intersectModels(p.Models, k.Models)
		p.ClassCeiling = lowerClass(p.ClassCeiling, k.ClassCeiling)
		p.DefaultClass = lowerClass(p.DefaultClass, p.ClassCeiling)
		p.KeyLimits = k.Limits
	}
	return p
}
