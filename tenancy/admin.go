package tenancy

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/apierror"
)

// maxAdminBody bounds admin request bodies.
const maxAdminBody = 64 << 10

// Admin is the admin API, an http.Handler for /admin/…, authenticated by
// the configured admin key only (a tenant key gets 401). Mount it at
// "/admin/" on the gateway's router.
type Admin struct {
	adminSum [sha256.Size]byte
	enabled  bool
	store    *Store
	usage    *Usage
	log      *slog.Logger
	mux      *http.ServeMux
}

// NewAdmin returns the admin API over st and u for cfg (after Validate).
// With no admin key configured every request gets 401. log may be nil.
func NewAdmin(cfg Config, st *Store, u *Usage, log *slog.Logger) *Admin {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Admin{adminSum: sha256.Sum256([]byte(cfg.AdminKey)), enabled: cfg.AdminKey != "", store: st, usage: u, log: log,
		mux: http.NewServeMux()}
	routes := map[string]func(http.ResponseWriter, *http.Request) error{
		"POST /admin/tenants":                            a.createTenant,
		"GET /admin/tenants":                             a.listTenants,
		"GET /admin/tenants/{tenant}":                    a.getTenant,
		"PATCH /admin/tenants/{tenant}":                  a.updateTenant,
		"POST /admin/tenants/{tenant}/keys":              a.issueKey,
		"GET /admin/tenants/{tenant}/keys":               a.listKeys,
		"GET /admin/tenants/{tenant}/keys/{key}":         a.getKey,
		"POST /admin/tenants/{tenant}/keys/{key}/revoke": a.revokeKey,
		"DELETE /admin/tenants/{tenant}/keys/{key}":      a.revokeKey,
		"POST /admin/tenants/{tenant}/keys/{key}/rotate": a.rotateKey,
		"GET /admin/tenants/{tenant}/usage":              a.getUsage,
		"/admin/":                                        a.unknown,
	}
	for pattern, h := range routes {
		a.mux.Handle(pattern, a.handle(h))
	}
	return a
}

// ServeHTTP authenticates the admin key and serves the API.
func (a *Admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := a.Authorize(r.Header); err != nil {
		apierror.Write(w, err)
		return
	}
	a.mux.ServeHTTP(w, r)
}

// Authorize checks that h carries the admin key (bearer or x-api-key), in
// constant time; its error is the 401 every bad credential gets. Other
// admin surfaces (the gateway's status page) use it too.
func (a *Admin) Authorize(h http.Header) error {
	tok, _ := credential(h)
	sum := sha256.Sum256([]byte(tok))
	if !a.enabled || tok == "" || subtle.ConstantTimeCompare(sum[:], a.adminSum[:]) != 1 {
		return errUnauthorized(errors.New("admin API: not the admin key"))
	}
	return nil
}

func (a *Admin) handle(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			he := apierror.Write(w, adminError(err))
			if he.Status >= 500 {
				a.log.Error("tenancy: admin API", "method", r.Method, "path", r.URL.Path, "err", err)
			}
		}
	})
}

// adminError maps store errors onto the envelope.
func adminError(err error) error {
	if ie, ok := errors.AsType[*InvalidError](err); ok {
		return apierror.BadRequest(ie.Param, "%v", ie.Err)
	}
	switch {
	case errors.Is(err, ErrNotFound):
		return apierror.NotFound("not_found", "No such tenant or key.")
	case errors.Is(err, ErrExists):
		return &apierror.Error{Status: http.StatusConflict, Type: apierror.TypeInvalidRequest, Code: "already_exists", Msg: "It already exists.", Err: err}
	case errors.Is(err, redis.TxFailedErr):
		return &apierror.Error{Status: http.StatusConflict, Type: apierror.TypeInvalidRequest, Code: "conflict", Msg: "Concurrent update; retry.", Err: err}
	}
	return err
}

func (a *Admin) unknown(w http.ResponseWriter, r *http.Request) error {
	return apierror.NotFound("unknown_url", "Unknown request URL: %s %s.", r.Method, r.URL.Path)
}

// decodeBody decodes one JSON object into v, rejecting unknown fields,
// trailing data and bodies over maxAdminBody. An empty body leaves v alone
// when allowEmpty.
func decodeBody(r io.Reader, v any, allowEmpty bool) error {
	b, err := io.ReadAll(io.LimitReader(r, maxAdminBody+1))
	if err != nil {
		return fmt.Errorf("tenancy: read body: %w", err)
	}
	if len(b) > maxAdminBody {
		return apierror.BadRequest("", "request body exceeds %d bytes", maxAdminBody)
	}
	if len(bytes.TrimSpace(b)) == 0 && allowEmpty {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return apierror.BadRequest("", "invalid JSON body: %v", err)
	}
	if dec.More() {
		return apierror.BadRequest("", "invalid JSON body: trailing data")
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("tenancy: encode response: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, err = w.Write(append(b, '\n'))
	return err
}

type list[T any] struct {
	Object string `json:"object"`
	Data   []T    `json:"data"`
}

func newList[T any](data []T) list[T] {
	if data == nil {
		data = []T{}
	}
	return list[T]{Object: "list", Data: data}
}

// tenantBody is the create body: a Tenant without Created.
type tenantBody struct {
	ID           string   `json:"id"`
	Name         string   `json:"name"`
	Isolated     bool     `json:"isolated"`
	Disabled     bool     `json:"disabled"`
	Limits       Limits   `json:"limits"`
	Weight       int      `json:"weight"`
	DefaultClass string   `json:"default_class"`
	ClassCeiling string   `json:"class_ceiling"`
	Models       []string `json:"models"`
	// BreakExcerpts: see Tenant.BreakExcerpts.
	BreakExcerpts bool `json:"break_excerpts"`
}

func (a *Admin) createTenant(w http.ResponseWriter, r *http.Request) error {
	var b tenantBody
	if err := decodeBody(r.Body, &b, false); err != nil {
		return err
	}
	t, err := a.store.CreateTenant(r.Context(), b.tenant())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, t)
}

func (b tenantBody) tenant() Tenant {
	return Tenant{ID: b.ID, Name: b.Name, Isolated: b.Isolated, Disabled: b.Disabled, Limits: b.Limits, Weight: b.Weight,
		DefaultClass: b.DefaultClass, ClassCeiling: b.ClassCeiling, Models: b.Models, BreakExcerpts: b.BreakExcerpts}
}

func (a *Admin) listTenants(w http.ResponseWriter, r *http.Request) error {
	ts, err := a.store.ListTenants(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, newList(ts))
}

func (a *Admin) getTenant(w http.ResponseWriter, r *http.Request) error {
	t, err := a.store.GetTenant(r.Context(), r.PathValue("tenant"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, t)
}

// TenantPatch is the update body: only the fields present change. Models
// set to null allows every model again.
type TenantPatch struct {
	Name         *string     `json:"name"`
	Isolated     *bool       `json:"isolated"`
	Disabled     *bool       `json:"disabled"`
	Limits       *Limits     `json:"limits"`
	Weight       *int        `json:"weight"`
	DefaultClass *string     `json:"default_class"`
	ClassCeiling *string     `json:"class_ceiling"`
	Models       optionalSet `json:"models"`
	// BreakExcerpts: see Tenant.BreakExcerpts.
	BreakExcerpts *bool `json:"break_excerpts"`
}

// optionalSet is a JSON list that tells absent (Set false) from null.
type optionalSet struct {
	Set   bool
	Value []string
}

func (o *optionalSet) UnmarshalJSON(b []byte) error {
	o.Set = true
	return json.Unmarshal(b, &o.Value)
}

// Apply applies the patch to t.
func (p TenantPatch) Apply(t *Tenant) {
	set := func(dst *string, v *string) {
		if v != nil {
			*dst = *v
		}
	}
	set(&t.Name, p.Name)
	set(&t.DefaultClass, p.DefaultClass)
	set(&t.ClassCeiling, p.ClassCeiling)
	if p.Isolated != nil {
		t.Isolated = *p.Isolated
	}
	if p.Disabled != nil {
		t.Disabled = *p.Disabled
	}
	if p.Limits != nil {
		t.Limits = *p.Limits
	}
	if p.Weight != nil {
		t.Weight = *p.Weight
	}
	if p.Models.Set {
		t.Models = p.Models.Value
	}
	if p.BreakExcerpts != nil {
		t.BreakExcerpts = *p.BreakExcerpts
	}
}

func (a *Admin) updateTenant(w http.ResponseWriter, r *http.Request) error {
	var p TenantPatch
	if err := decodeBody(r.Body, &p, false); err != nil {
		return err
	}
	t, err := a.store.UpdateTenant(r.Context(), r.PathValue("tenant"), func(t *Tenant) error {
		p.Apply(t)
		return nil
	})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, t)
}

// issueBody is the key issue body: a KeySpec, whose expiry may also be
// given relative to now.
type issueBody struct {
	KeySpec
	// ExpiresIn is a Go duration ("720h"); it overrides Expires.
	ExpiresIn string `json:"expires_in,omitempty"`
}

// keyWithSecret is a key record with its full key, shown once.
type keyWithSecret struct {
	Key
	APIKey string `json:"api_key"`
}

func (a *Admin) issueKey(w http.ResponseWriter, r *http.Request) error {
	var b issueBody
	if err := decodeBody(r.Body, &b, true); err != nil {
		return err
	}
	if b.ExpiresIn != "" {
		d, err := time.ParseDuration(b.ExpiresIn)
		if err != nil || d <= 0 {
			return apierror.BadRequest("expires_in", "expires_in must be a positive duration such as 720h")
		}
		b.Expires = a.store.now().Add(d)
	}
	k, full, err := a.store.IssueKey(r.Context(), r.PathValue("tenant"), b.KeySpec)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, keyWithSecret{Key: k, APIKey: full})
}

func (a *Admin) listKeys(w http.ResponseWriter, r *http.Request) error {
	ks, err := a.store.ListKeys(r.Context(), r.PathValue("tenant"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, newList(ks))
}

func (a *Admin) getKey(w http.ResponseWriter, r *http.Request) error {
	k, err := a.store.GetKey(r.Context(), r.PathValue("tenant"), r.PathValue("key"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, k)
}

func (a *Admin) revokeKey(w http.ResponseWriter, r *http.Request) error {
	k, err := a.store.RevokeKey(r.Context(), r.PathValue("tenant"), r.PathValue("key"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, k)
}

// rotateBody is the rotate body; Grace is a Go duration, default "0s"
// (the old key stops at once).
type rotateBody struct {
	Grace string `json:"grace"`
}

func (a *Admin) rotateKey(w http.ResponseWriter, r *http.Request) error {
	var b rotateBody
	if err := decodeBody(r.Body, &b, true); err != nil {
		return err
	}
	var grace time.Duration
	if b.Grace != "" {
		var err error
		if grace, err = time.ParseDuration(b.Grace); err != nil || grace < 0 {
			return apierror.BadRequest("grace", "grace must be a duration such as 1h")
		}
	}
	k, full, err := a.store.RotateKey(r.Context(), r.PathValue("tenant"), r.PathValue("key"), grace)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, keyWithSecret{Key: k, APIKey: full})
}

// usageReport is the usage response.
type usageReport struct {
	Object string    `json:"object"`
	Tenant string    `json:"tenant"`
	Key    string    `json:"key,omitempty"`
	From   time.Time `json:"from"`
	To     time.Time `json:"to"`
	Step   string    `json:"step"`
	Total  Counts    `json:"total"`
	Data   []Point   `json:"data"`
}

func (a *Admin) getUsage(w http.ResponseWriter, r *http.Request) error {
	tenant, q := r.PathValue("tenant"), r.URL.Query()
	if _, err := a.store.GetTenant(r.Context(), tenant); err != nil {
		return err
	}
	key := q.Get("key")
	if key != "" && (len(key) > 300 || !a.keyOf(r, tenant, key)) {
		return ErrNotFound
	}
	from, to, step, err := usageRange(q.Get("from"), q.Get("to"), q.Get("step"), a.store.now())
	if err != nil {
		return err
	}
	pts, total, err := a.usage.Query(r.Context(), tenant, key, from, to, step)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, usageReport{Object: "usage", Tenant: tenant, Key: key, From: from, To: to,
		Step: step.String(), Total: total, Data: pts})
}

// keyOf reports whether key names one of tenant's keys or a JWT subject
// ("jwt:<sub>", whose usage is stored under the tenant anyway).
func (a *Admin) keyOf(r *http.Request, tenant, key string) bool {
	if len(key) > 4 && key[:4] == "jwt:" {
		return true
	}
	_, err := a.store.GetKey(r.Context(), tenant, key)
	return err == nil
}

// usageRange parses the usage query: from and to are RFC 3339 (default the
// last 24h, the current minute included), step a Go duration (default 1h).
func usageRange(fromS, toS, stepS string, now time.Time) (from, to time.Time, step time.Duration, err error) {
	to = now.Truncate(time.Minute).Add(time.Minute)
	from, step = to.Add(-24*time.Hour), time.Hour
	parse := func(s, param string, dst *time.Time) error {
		if s == "" {
			return nil
		}
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return apierror.BadRequest(param, "%s must be an RFC 3339 time", param)
		}
		*dst = t
		return nil
	}
	if err := errors.Join(parse(toS, "to", &to), parse(fromS, "from", &from)); err != nil {
		return from, to, step, err
	}
	if stepS != "" {
		if step, err = time.ParseDuration(stepS); err != nil || step < time.Minute {
			return from, to, step, apierror.BadRequest("step", "step must be a duration of at least 1m")
		}
	}
	return from, to, step, nil
}
