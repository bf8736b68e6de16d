package tenancy

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Priority classes, from highest to lowest. A class ceiling caps the class a
// request may ask for; a default class is what it gets when it asks for none.
const (
	ClassInteractive = "interactive"
	ClassBackground  = "background"
)

// classRank orders the classes; higher is more urgent.
func classRank(c string) int {
	switch c {
	case ClassInteractive:
		return 2
	case ClassBackground:
		return 1
	}
	return 0
}

func validClass(c string) bool { return classRank(c) > 0 }

// lowerClass returns the less urgent of a and b, ignoring "".
func lowerClass(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "" || classRank(a) <= classRank(b):
		return a
	}
	return b
}

// Limits are the admission limits of a tenant, a key or a JWT subject. A zero
// field means no limit of that kind.
type Limits struct {
	// RequestsPerMinute caps admitted requests (GCRA, burst = the rate).
	RequestsPerMinute int `json:"requests_per_minute,omitempty" yaml:"requests_per_minute"`
	// TokensPerMinute caps prompt plus completion tokens: estimated at
	// admission, corrected from the upstream's usage when the request ends.
	TokensPerMinute int `json:"tokens_per_minute,omitempty" yaml:"tokens_per_minute"`
	// Concurrent caps requests in flight at once, across every gateway.
	Concurrent int `json:"concurrent,omitempty" yaml:"concurrent"`
}

// IsZero reports whether l sets no limit.
func (l Limits) IsZero() bool { return l == Limits{} }

// Lower returns, field by field, the stricter of l and o (a zero field is no
// limit, so the other side wins).
func (l Limits) Lower(o Limits) Limits {
	return Limits{
		RequestsPerMinute: lowerLimit(l.RequestsPerMinute, o.RequestsPerMinute),
		TokensPerMinute:   lowerLimit(l.TokensPerMinute, o.TokensPerMinute),
		Concurrent:        lowerLimit(l.Concurrent, o.Concurrent),
	}
}

func lowerLimit(a, b int) int {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

func (l Limits) validate(field string) error {
	if l.RequestsPerMinute < 0 || l.TokensPerMinute < 0 || l.Concurrent < 0 {
		return fmt.Errorf("%s: limits must not be negative", field)
	}
	return nil
}

// Tenant is one team or customer sharing the fleet, stored in Redis under
// <prefix>tenant:<id>.
type Tenant struct {
	// ID is the tenant's immutable identifier: 1–64 of [a-z0-9_.-],
	// starting with a letter or digit.
	ID string `json:"id"`
	// Name is a display name, also the tenant's metrics label; default ID.
	Name string `json:"name"`
	// Isolated tenants get their own cache_salt on every upstream request,
	// so no other tenant shares (or can time) their cached prefixes.
	// Shared tenants share common prefixes with every other shared tenant.
	Isolated bool `json:"isolated"`
	// Disabled tenants authenticate nothing: every key and JWT gets 401.
	Disabled bool `json:"disabled,omitempty"`
	// Limits apply to the tenant as a whole, summed over its keys.
	Limits Limits `json:"limits"`
	// Weight is the tenant's fair-share weight in the queue; default 1.
	Weight int `json:"weight"`
	// DefaultClass is the priority class of requests that name none;
	// default "interactive".
	DefaultClass string `json:"default_class"`
	// ClassCeiling is the highest class the tenant may use; default
	// "interactive".
	ClassCeiling string `json:"class_ceiling"`
	// Models is the allow-list of model names; nil allows every model. A
	// trailing "*" matches any suffix ("qwen3-*").
	Models []string `json:"models"`
	// BreakExcerpts opts the tenant into text excerpts around its prefix
	// breaks in the diagnostics (admin API, status page); off, only
	// offsets, parts and short hashes are kept.
	BreakExcerpts bool `json:"break_excerpts,omitempty"`
	// Created is when the tenant was created.
	Created time.Time `json:"created"`
}

var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)

// normalize fills the tenant's defaults and validates it.
func (t *Tenant) normalize() error {
	if !idPattern.MatchString(t.ID) {
		return fmt.Errorf("id: must be 1-64 of [a-z0-9_.-], starting with a letter or digit")
	}
	if t.Name == "" {
		t.Name = t.ID
	}
	if len(t.Name) > 128 {
		return fmt.Errorf("name: at most 128 bytes")
	}
	if t.Weight == 0 {
		t.Weight = 1
	}
	if t.Weight < 0 || t.Weight > 1000 {
		return fmt.Errorf("weight: must be 1..1000")
	}
	if t.DefaultClass == "" {
		t.DefaultClass = ClassInteractive
	}
	if t.ClassCeiling == "" {
		t.ClassCeiling = ClassInteractive
	}
	if !validClass(t.DefaultClass) {
		return fmt.Errorf("default_class: must be %q or %q", ClassInteractive, ClassBackground)
	}
	if !validClass(t.ClassCeiling) {
		return fmt.Errorf("class_ceiling: must be %q or %q", ClassInteractive, ClassBackground)
	}
	t.DefaultClass = lowerClass(t.DefaultClass, t.ClassCeiling)
	if err := validModels(t.Models); err != nil {
		return err
	}
	return t.Limits.validate("limits")
}

func validModels(ms []string) error {
	if len(ms) > 1000 {
		return fmt.Errorf("models: at most 1000 entries")
	}
	for _, m := range ms {
		if m == "" || len(m) > 256 || strings.Contains(strings.TrimSuffix(m, "*"), "*") {
			return fmt.Errorf("models: %q is not a model name or a prefix ending in *", m)
		}
	}
	return nil
}

// Key is an API key's stored record, under <prefix>key:<id>. Only the
// SHA-256 of the key's secret is kept.
type Key struct {
	// ID is the key's visible id, the <id> of wp-<id>-<secret>.
	ID string `json:"id"`
	// Tenant is the owning tenant's ID.
	Tenant string `json:"tenant"`
	// Name is a free-form label ("ci", "alice's laptop").
	Name string `json:"name,omitempty"`
	// Hash is the hex SHA-256 of the secret (of the whole key, for an
	// imported key that is not of the wp- form). Never sent to clients.
	Hash string `json:"hash,omitempty"`
	// Imported marks a key that is not of the wp- form, found by its hash.
	Imported bool `json:"imported,omitempty"`
	// Created, Expires (zero: never) and Revoked (zero: not revoked).
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires,omitzero"`
	Revoked time.Time `json:"revoked,omitzero"`
	// LastUsed is when the key last authenticated a request, to within a
	// minute; zero when never (or not yet flushed).
	LastUsed time.Time `json:"last_used,omitzero"`
	// RotatedTo names the key that replaced this one; it keeps working
	// until Expires, the rotation's grace period.
	RotatedTo string `json:"rotated_to,omitempty"`
	// Models narrows the tenant's allow-list; nil keeps it.
	Models []string `json:"models"`
	// Limits are the key's own limits, enforced besides the tenant's.
	Limits Limits `json:"limits"`
	// ClassCeiling lowers the tenant's ceiling for this key; "" keeps it.
	ClassCeiling string `json:"class_ceiling,omitempty"`
}

// active reports whether k may authenticate at now.
func (k *Key) active(now time.Time) bool {
	return k.Revoked.IsZero() && (k.Expires.IsZero() || now.Before(k.Expires))
}

// public returns k without its hash, for the admin API.
func (k Key) public() Key {
	k.Hash = ""
	k.Models = slices.Clone(k.Models)
	return k
}

// allowModel reports whether model matches the allow-list ms (nil: all).
func allowModel(ms []string, model string) bool {
	if ms == nil {
		return true
	}
	for _, m := range ms {
		if p, ok := strings.CutSuffix(m, "*"); ok {
			if strings.HasPrefix(model, p) {
				return true
			}
		} else if m == model {
			return true
		}
	}
	return false
}

// intersectModels narrows the allow-list a by b (nil is everything): the
// result allows exactly the models both allow.
func intersectModels(a, b []string) []string {
	switch {
	case b == nil:
		return a
	case a == nil:
		return b
	}
	out := []string{}
	add := func(m string) {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	for _, m := range b {
		p, wild := strings.CutSuffix(m, "*")
		if !wild {
			if allowModel(a, m) {
				add(m)
			}
			continue
		}
		// m is "p*": keep it whole when a wildcard of a covers it, else keep
		// the entries of a that fall inside it.
		if allowModel(wildcards(a), p) {
			add(m)
			continue
		}
		for _, x := range a {
			if strings.HasPrefix(x, p) {
				add(x)
			}
		}
	}
	return out
}

// wildcards returns the entries of ms that end in "*".
func wildcards(ms []string) []string {
	out := []string{}
	for _, m := range ms {
		if strings.HasSuffix(m, "*") {
			out = append(out, m)
		}
	}
	return out
}
