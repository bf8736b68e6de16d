package fairq

import (
	"fmt"
	"math"
	"time"
)

// Policies for [Config.Policy].
const (
	// PolicyFair is warmpath's policy: class priority with a guaranteed
	// background share, weighted fair sharing across tenants by virtual
	// token counters, and turn priority then least attained service within
	// a tenant.
	PolicyFair = "fair"
	// PolicyStrict is the strict-priority baseline: interactive strictly
	// before background (BackgroundShare is ignored), first come first
	// served within a class, no tenant fairness.
	PolicyStrict = "strict"
)

// Defaults applied by [New] to zero-valued [Config] fields.
const (
	DefaultPolicy             = PolicyFair
	DefaultBackgroundShare    = 0.1
	DefaultMaxQueued          = 5000 // as llm-d's per-band default
	DefaultMaxQueuedPerTenant = 1000
	DefaultTimeout            = 60 * time.Second // as llm-d's request TTL
	DefaultOutputWeight       = 2                // VTC's w_q / w_p
	DefaultAgeCredit          = 1000             // tokens per second waited
	DefaultScanDepth          = 8
	DefaultSyncInterval       = 100 * time.Millisecond
	DefaultRedisTimeout       = 250 * time.Millisecond
	DefaultRecheckInterval    = 100 * time.Millisecond
	DefaultShareWindow        = 10 * time.Second
	DefaultIdleAfter          = 10 * time.Minute
	DefaultKeyPrefix          = "wp:"
	DefaultKeyTTL             = 24 * time.Hour
)

// Config tunes a [Queue]. The zero value is valid: every field has a
// default, filled in by [New].
type Config struct {
	// Policy is PolicyFair (default) or PolicyStrict.
	Policy string
	// BackgroundShare is the fraction of the dispatches made while both
	// classes wait for a model that go to Background, so background work
	// always progresses; default 0.1. A negative value means 0: background
	// only when no interactive request waits. PolicyStrict ignores it.
	BackgroundShare float64
	// MaxQueued bounds the requests waiting, over all models and tenants;
	// default 5000. Past it Admit answers 429.
	MaxQueued int
	// MaxQueuedPerTenant bounds one tenant's waiting requests, over all
	// models; default 1000. Past it Admit answers 429.
	MaxQueuedPerTenant int
	// Timeout is the longest a request waits before Admit answers 429;
	// default 60s.
	Timeout time.Duration
	// OutputWeight is what one output token costs relative to one prompt
	// token that must be computed (not a cache hit); default 2.
	OutputWeight float64
	// AgeCredit is how many tokens of attained service one second of
	// waiting forgives when ordering one tenant's waiting turns, so a long
	// session is not starved by a stream of short ones; default 1000. A
	// negative value means 0: pure least attained service.
	AgeCredit float64
	// ScanDepth is how many waiting requests, in dispatch order, one
	// dispatch considers when the first cannot start where routing would
	// send it (Ticket.Place); default 8. It bounds the Place calls per
	// dispatch. 1 considers the first only.
	ScanDepth int

	// KeyPrefix is prepended to the Redis keys the queue owns; default
	// "wp:".
	KeyPrefix string
	// KeyTTL is how long a model's shared counters outlive their last
	// sync; default 24h.
	KeyTTL time.Duration
	// SyncInterval is how often Run exchanges counter deltas with Redis;
	// default 100ms.
	SyncInterval time.Duration
	// RedisTimeout bounds one exchange; default 250ms.
	RedisTimeout time.Duration
	// RecheckInterval is how often Run re-checks capacity for models with
	// waiting requests, in case nothing calls Kick; default 100ms.
	RecheckInterval time.Duration
	// ShareWindow is the period over which the dispatch-share gauges are
	// computed and tenant labels refreshed; default 10s.
	ShareWindow time.Duration
	// IdleAfter is how long a tenant without queued or running requests
	// keeps its local state; default 10m. Its shared counter stays in
	// Redis.
	IdleAfter time.Duration

	// Label maps a tenant ID to its metric label, so the gateway can bound
	// label cardinality (top tenants by name, the rest "other"). It is
	// called when a tenant is first seen and then about once per
	// ShareWindow, never on the request path. Nil means the tenant ID.
	Label func(tenant string) string
}

// withDefaults returns c with zero fields defaulted, or an error for a
// value that cannot work.
func (c Config) withDefaults() (Config, error) {
	if c.Policy == "" {
		c.Policy = DefaultPolicy
	}
	if c.Policy != PolicyFair && c.Policy != PolicyStrict {
		return c, fmt.Errorf("fairq: unknown policy %q (want %s or %s)", c.Policy, PolicyFair, PolicyStrict)
	}
	switch {
	case c.BackgroundShare == 0:
		c.BackgroundShare = DefaultBackgroundShare
	case c.BackgroundShare < 0:
		c.BackgroundShare = 0
	case c.BackgroundShare > 1 || math.IsNaN(c.BackgroundShare):
		return c, fmt.Errorf("fairq: background share %v is not a fraction", c.BackgroundShare)
	}
	switch {
	case c.AgeCredit == 0:
		c.AgeCredit = DefaultAgeCredit
	case c.AgeCredit < 0:
		c.AgeCredit = 0
	case math.IsNaN(c.AgeCredit) || math.IsInf(c.AgeCredit, 0):
		return c, fmt.Errorf("fairq: age credit %v is not a number", c.AgeCredit)
	}
	if c.OutputWeight == 0 {
		c.OutputWeight = DefaultOutputWeight
	}
	if !(c.OutputWeight >= 0) || math.IsInf(c.OutputWeight, 0) {
		return c, fmt.Errorf("fairq: output weight %v must be a non-negative number", c.OutputWeight)
	}
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	ints := []struct {
		name string
		p    *int
		def  int
	}{{"max queued", &c.MaxQueued, DefaultMaxQueued}, {"max queued per tenant", &c.MaxQueuedPerTenant, DefaultMaxQueuedPerTenant},
		{"scan depth", &c.ScanDepth, DefaultScanDepth}}
	for _, f := range ints {
		if *f.p == 0 {
			*f.p = f.def
		}
		if *f.p < 0 {
			return c, fmt.Errorf("fairq: %s: negative value %d", f.name, *f.p)
		}
	}
	durs := []struct {
		name string
		p    *time.Duration
		def  time.Duration
	}{
		{"timeout", &c.Timeout, DefaultTimeout},
		{"key TTL", &c.KeyTTL, DefaultKeyTTL},
		{"sync interval", &c.SyncInterval, DefaultSyncInterval},
		{"redis timeout", &c.RedisTimeout, DefaultRedisTimeout},
		{"recheck interval", &c.RecheckInterval, DefaultRecheckInterval},
		{"share window", &c.ShareWindow, DefaultShareWindow},
		{"idle after", &c.IdleAfter, DefaultIdleAfter},
	}
	for _, f := range durs {
		if *f.p == 0 {
			*f.p = f.def
		}
		if *f.p < 0 {
			return c, fmt.Errorf("fairq: %s: negative duration %v", f.name, *f.p)
		}
	}
	if c.Policy == PolicyStrict {
		c.BackgroundShare = 0
	}
	if c.Label == nil {
		c.Label = func(t string) string { return t }
	}
	return c, nil
}
