package tenancy

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Authentication modes.
const (
	ModeKeys    = "keys"     // API keys only
	ModeJWT     = "jwt"      // JWTs only
	ModeKeysJWT = "keys+jwt" // either
	ModeNone    = "none"     // no authentication: every request is the anonymous tenant
)

// Failure choices when Redis is unreachable.
const (
	FailOpen   = "open"   // admit the request unchecked
	FailClosed = "closed" // refuse it with 503
)

// Config configures tenancy; the gateway embeds it under `auth:`. Build it
// from YAML or as a literal; call Validate (which fills defaults through
// WithDefaults) before use. Secrets may come from files, read by Validate.
type Config struct {
	// Mode is keys, jwt, keys+jwt or none. No default: a configuration with
	// replicas must say which (see CheckStartup); the embedded development
	// setup uses keys.
	Mode string `yaml:"mode"`
	// AdminKey is the admin API's credential; AdminKeyFile names a file
	// holding it (surrounding whitespace trimmed). Neither set: the admin
	// API answers 401 to everything.
	AdminKey     string `yaml:"admin_key"`
	AdminKeyFile string `yaml:"admin_key_file"`
	// SaltSecret is the server secret behind isolated tenants' cache salts
	// (HMAC-SHA256 of the tenant id); SaltSecretFile names a file holding
	// it. Required unless mode is none; at least 16 bytes. Changing it
	// makes every isolated tenant's cached prefixes cold once.
	SaltSecret     string `yaml:"salt_secret"`
	SaltSecretFile string `yaml:"salt_secret_file"`
	// CacheTTL is how long a gateway trusts a cached key or tenant record
	// without asking Redis again, and so the bound on how late a revocation
	// reaches a gateway that missed its pub/sub message; default 10s.
	CacheTTL time.Duration `yaml:"cache_ttl"`
	// CacheStale is how long past CacheTTL a cached record keeps working
	// while Redis is unreachable; default 10m. Zero after defaults is not
	// possible; set a negative value to disable (fail closed at once).
	CacheStale time.Duration `yaml:"cache_stale"`
	// CacheSize bounds the cached records per gateway; default 100000.
	CacheSize int `yaml:"cache_size"`
	// JWT configures bearer JWTs (modes jwt and keys+jwt).
	JWT JWTConfig `yaml:"jwt"`
	// RedisFailure chooses, per limit, what happens when Redis is
	// unreachable at admission.
	RedisFailure FailureConfig `yaml:"redis_failure"`
	// LeaseTTL is how long a concurrency slot outlives its gateway: a
	// crashed gateway's slots are reclaimed after at most LeaseTTL. Live
	// leases are renewed every LeaseTTL/3 by Limiter.Run; default 30s.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// Usage configures usage accounting.
	Usage UsageConfig `yaml:"usage"`
	// MetricsTopN is how many tenants (the busiest, by requests) get their
	// own metrics label; the rest share "other". Default 20.
	MetricsTopN int `yaml:"metrics_top_n"`
}

// JWTConfig configures JWT verification.
type JWTConfig struct {
	// Issuer and Audience must match the token's iss and aud; both
	// required in the jwt modes.
	Issuer   string `yaml:"issuer"`
	Audience string `yaml:"audience"`
	// Leeway tolerates clock skew on exp, nbf and iat; default 30s.
	Leeway time.Duration `yaml:"leeway"`
	// TenantClaim names the claim holding the tenant id; default "tenant".
	TenantClaim string `yaml:"tenant_claim"`
	// ClassClaim names a claim that may lower the class ceiling
	// ("background"); default "warmpath_class".
	ClassClaim string `yaml:"class_claim"`
	// LimitsClaim names a claim holding an object of limits
	// ({"requests_per_minute":…,"tokens_per_minute":…,"concurrent":…}) that
	// may lower, never raise, the tenant's; default "warmpath_limits".
	LimitsClaim string `yaml:"limits_claim"`
	// Keys are verification keys given inline or by file.
	Keys []JWTKeyConfig `yaml:"keys"`
	// JWKSFile is a JSON Web Key Set file, reloaded when it changes.
	JWKSFile string `yaml:"jwks_file"`
	// JWKSPoll is how often the JWKS file's mtime and size are checked;
	// default 5s.
	JWKSPoll time.Duration `yaml:"jwks_poll"`
}

// JWTKeyConfig is one verification key, pinned to one algorithm.
type JWTKeyConfig struct {
	// KID matches the token header's kid. It may be empty only when it is
	// the only key; then it verifies every token, whatever its kid (the
	// algorithm pin still applies).
	KID string `yaml:"kid"`
	// Alg is HS256, RS256 or ES256; tokens signed otherwise are refused.
	Alg string `yaml:"alg"`
	// Secret (HS256) or PublicKey (RS256, ES256: PEM), inline or by file.
	Secret        string `yaml:"secret"`
	SecretFile    string `yaml:"secret_file"`
	PublicKey     string `yaml:"public_key"`
	PublicKeyFile string `yaml:"public_key_file"`
}

// FailureConfig is the per-limit choice when Redis is unreachable.
type FailureConfig struct {
	// RateLimits (requests and tokens per minute): open (default) or closed.
	RateLimits string `yaml:"rate_limits"`
	// Concurrency: open (default) or closed.
	Concurrency string `yaml:"concurrency"`
}

// UsageConfig configures usage accounting.
type UsageConfig struct {
	// Retention is how long per-minute usage is kept; default 168h (7d).
	Retention time.Duration `yaml:"retention"`
	// FlushInterval is how often batched usage is written; default 10s.
	FlushInterval time.Duration `yaml:"flush_interval"`
}

// WithDefaults returns c with every unset field at its documented default.
// It is the one place defaults are filled.
func (c Config) WithDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.CacheTTL, 10*time.Second)
	def(&c.CacheStale, 10*time.Minute)
	def(&c.LeaseTTL, 30*time.Second)
	def(&c.Usage.Retention, 7*24*time.Hour)
	def(&c.Usage.FlushInterval, 10*time.Second)
	def(&c.JWT.Leeway, 30*time.Second)
	def(&c.JWT.JWKSPoll, 5*time.Second)
	if c.CacheSize == 0 {
		c.CacheSize = 100000
	}
	if c.MetricsTopN == 0 {
		c.MetricsTopN = 20
	}
	str := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	str(&c.JWT.TenantClaim, "tenant")
	str(&c.JWT.ClassClaim, "warmpath_class")
	str(&c.JWT.LimitsClaim, "warmpath_limits")
	str(&c.RedisFailure.RateLimits, FailOpen)
	str(&c.RedisFailure.Concurrency, FailOpen)
	return c
}

// Validate fills defaults, reads secret files and checks c, returning the
// completed config or errors naming each field (auth.jwt.audience: …).
func (c Config) Validate() (Config, error) {
	c = c.WithDefaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("auth.%s: "+format, append([]any{field}, args...)...))
	}
	switch c.Mode {
	case ModeKeys, ModeJWT, ModeKeysJWT, ModeNone:
	case "":
		bad("mode", "required: keys, jwt, keys+jwt, or none to run without authentication")
	default:
		bad("mode", "%q is not keys, jwt, keys+jwt or none", c.Mode)
	}
	if err := readSecret(&c.AdminKey, c.AdminKeyFile); err != nil {
		bad("admin_key_file", "%v", err)
	}
	if c.AdminKey != "" && len(c.AdminKey) < 16 {
		bad("admin_key", "at least 16 characters")
	}
	if err := readSecret(&c.SaltSecret, c.SaltSecretFile); err != nil {
		bad("salt_secret_file", "%v", err)
	}
	if c.Mode != ModeNone && c.Mode != "" && len(c.SaltSecret) < 16 {
		bad("salt_secret", "required (at least 16 bytes, or salt_secret_file) unless mode is none")
	}
	if c.CacheTTL < 0 {
		bad("cache_ttl", "must be positive")
	}
	if c.CacheSize < 0 {
		bad("cache_size", "must be positive")
	}
	if c.LeaseTTL < time.Second {
		bad("lease_ttl", "at least 1s")
	}
	if c.Usage.Retention < time.Hour {
		bad("usage.retention", "at least 1h")
	}
	if c.Usage.FlushInterval <= 0 {
		bad("usage.flush_interval", "must be positive")
	}
	if c.MetricsTopN < 0 {
		bad("metrics_top_n", "must not be negative")
	}
	for f, v := range map[string]string{"rate_limits": c.RedisFailure.RateLimits, "concurrency": c.RedisFailure.Concurrency} {
		if v != FailOpen && v != FailClosed {
			bad("redis_failure."+f, "%q is not open or closed", v)
		}
	}
	if c.Mode == ModeJWT || c.Mode == ModeKeysJWT {
		errs = append(errs, c.JWT.validate()...)
	}
	return c, errors.Join(errs...)
}

func (j *JWTConfig) validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("auth.jwt.%s: "+format, append([]any{field}, args...)...))
	}
	if j.Issuer == "" {
		bad("issuer", "required in the jwt modes")
	}
	if j.Audience == "" {
		bad("audience", "required in the jwt modes")
	}
	if j.Leeway < 0 {
		bad("leeway", "must not be negative")
	}
	if len(j.Keys) == 0 && j.JWKSFile == "" {
		bad("keys", "required (or jwks_file) in the jwt modes")
	}
	if j.JWKSPoll <= 0 {
		bad("jwks_poll", "must be positive")
	}
	for i := range j.Keys {
		k := &j.Keys[i]
		if err := readSecret(&k.Secret, k.SecretFile); err != nil {
			bad(fmt.Sprintf("keys[%d].secret_file", i), "%v", err)
		}
		if err := readSecret(&k.PublicKey, k.PublicKeyFile); err != nil {
			bad(fmt.Sprintf("keys[%d].public_key_file", i), "%v", err)
		}
		if k.KID == "" && len(j.Keys) > 1 {
			bad(fmt.Sprintf("keys[%d].kid", i), "required when there is more than one key")
		}
		if _, err := k.parse(); err != nil {
			bad(fmt.Sprintf("keys[%d]", i), "%v", err)
		}
	}
	return errs
}

// readSecret sets *dst from file when dst is empty and file is set.
func readSecret(dst *string, file string) error {
	if file == "" {
		return nil
	}
	if *dst != "" {
		return errors.New("set either the value or its file, not both")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	*dst = strings.TrimSpace(string(b))
	if *dst == "" {
		return fmt.Errorf("%s is empty", file)
	}
	return nil
}

// CheckStartup is the gateway's refusal to run open: with replicas
// configured (a production configuration), mode must be set, and mode none
// logs a warning at every start. The embedded development setup (no
// replicas) passes with any mode.
func CheckStartup(c Config, hasReplicas bool, log *slog.Logger) error {
	if !hasReplicas {
		return nil
	}
	switch c.Mode {
	case "":
		return errors.New("auth.mode: required when replicas are configured: set keys, jwt or keys+jwt, or `auth: {mode: none}` to serve without authentication")
	case ModeNone:
		log.Warn("auth.mode is none: every request is served unauthenticated, as one anonymous tenant, with no limits")
	}
	return nil
}

// Redis is the Redis deployment a tenancy component uses.
type Redis struct {
	// Client is any go-redis client: one server, Sentinel or Cluster.
	Client redis.UniversalClient
	// Prefix starts every key written, e.g. "wp:".
	Prefix string
	// Timeout bounds each call made on the request path; default 250ms.
	Timeout time.Duration
}

func (r Redis) timeout() time.Duration {
	if r.Timeout <= 0 {
		return 250 * time.Millisecond
	}
	return r.Timeout
}
