package tenancy

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/periodic"
)

var (
	//go:embed admit.lua
	admitSrc    string
	admitScript = redis.NewScript(admitSrc)
	//go:embed done.lua
	doneSrc    string
	doneScript = redis.NewScript(doneSrc)
	// renewScript extends a lease that is still held (XX), on Redis's clock
	// like the admission script. KEYS: lease sets; ARGV: lease id, ttl (ms).
	renewScript = redis.NewScript(`
local t = redis.call("TIME")
local exp = t[1] * 1000 + t[2] / 1000 + tonumber(ARGV[2])
for _, k in ipairs(KEYS) do
  if redis.call("ZADD", k, "XX", "CH", exp, ARGV[1]) == 1 then
    redis.call("PEXPIRE", k, 2 * tonumber(ARGV[2]))
  end
end
return 1`)
)

// Limiter enforces requests per minute, tokens per minute and concurrency
// per tenant and per key, atomically across every gateway sharing Redis. It
// is safe for concurrent use; Run renews the concurrency leases of requests
// in flight.
type Limiter struct {
	r       Redis
	rate    *redis_rate.Limiter
	ttl     time.Duration
	failRPM bool // fail closed on rate limits
	failCon bool // fail closed on concurrency
	log     *slog.Logger

	mu   sync.Mutex          // guards live
	live map[*Lease]struct{} // leases holding concurrency slots
}

// NewLimiter returns a Limiter for cfg (after Validate). log may be nil.
func NewLimiter(r Redis, cfg Config, log *slog.Logger) *Limiter {
	cfg = cfg.WithDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Limiter{
		r: r, rate: redis_rate.NewLimiter(r.Client), ttl: cfg.LeaseTTL,
		failRPM: cfg.RedisFailure.RateLimits == FailClosed, failCon: cfg.RedisFailure.Concurrency == FailClosed,
		log: log, live: map[*Lease]struct{}{},
	}
}

// scope names one principal's limit keys. All keys of a tenant share the
// hash tag {<tenant>}, so the admission script's keys sit in one Cluster
// slot.
type scope struct{ tok, conc, req string }

func (l *Limiter) scopes(p *Principal) (tenant, key scope) {
	base := l.r.Prefix + "rl:{" + p.TenantID + "}:"
	tenant = scope{tok: base + "tok", conc: base + "conc", req: base + "req"}
	k := ":" + p.KeyID
	key = scope{tok: base + "tok" + k, conc: base + "conc" + k, req: base + "req" + k}
	return tenant, key
}

// Lease is an admitted request's hold on its limits. Call Done exactly once
// when the request ends (more calls are no-ops).
type Lease struct {
	l        *Limiter
	id       string
	t, k     scope
	tl, kl   Limits
	est      int
	slots    bool // holds concurrency slots
	charged  bool // tokens were charged
	header   http.Header
	doneOnce sync.Once
}

// Header returns the x-ratelimit-* headers to send with the response.
func (le *Lease) Header() http.Header { return le.header }

// Admit admits a request of p for model with estTokens estimated tokens
// (prompt plus expected completion), or returns a 429 rate_limit_exceeded
// with Retry-After and x-ratelimit-* headers, or a 503 when Redis is
// unreachable and that limit fails closed. model is not part of the limit
// (limits are per tenant and key); it is named in the 429's message.
func (l *Limiter) Admit(ctx context.Context, p *Principal, model string, estTokens int) (*Lease, error) {
	tl, kl := p.Limits, p.KeyLimits
	le := &Lease{l: l, tl: tl, kl: kl, est: max(estTokens, 0), header: http.Header{}}
	le.t, le.k = l.scopes(p)
	if tl.IsZero() && kl.IsZero() {
		return le, nil
	}
	ctx, cancel := context.WithTimeout(ctx, l.r.timeout())
	defer cancel()
	if err := l.admitTokensAndSlots(ctx, le, model); err != nil {
		return nil, err
	}
	if err := l.admitRequests(ctx, le, model); err != nil {
		le.release()
		return nil, err
	}
	if le.slots {
		l.mu.Lock()
		l.live[le] = struct{}{}
		l.mu.Unlock()
	}
	return le, nil
}

func (l *Limiter) admitTokensAndSlots(ctx context.Context, le *Lease, model string) error {
	tl, kl := le.tl, le.kl
	if tl.TokensPerMinute == 0 && kl.TokensPerMinute == 0 && tl.Concurrent == 0 && kl.Concurrent == 0 {
		return nil
	}
	le.id = newLeaseID()
	v, err := admitScript.Run(ctx, l.r.Client, []string{le.t.tok, le.t.conc, le.k.tok, le.k.conc},
		le.id, l.ttl.Milliseconds(), le.est, tl.TokensPerMinute, tl.Concurrent, kl.TokensPerMinute, kl.Concurrent).Slice()
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return err // the client has gone
		}
		closed := (l.failRPM && (tl.TokensPerMinute > 0 || kl.TokensPerMinute > 0)) || (l.failCon && (tl.Concurrent > 0 || kl.Concurrent > 0))
		if closed {
			return apierror.Unavailable(err, "Rate limiting is temporarily unavailable; retry shortly.")
		}
		l.log.Warn("tenancy: limiter unreachable; admitting unchecked (redis_failure: open)", "err", err)
		return nil
	}
	r, err := parseAdmit(v)
	if err != nil {
		return fmt.Errorf("tenancy: admit: %w", err)
	}
	if !r.admitted {
		return tooMany(r.reason, model, time.Duration(r.retryMS)*time.Millisecond, le.header)
	}
	le.charged = tl.TokensPerMinute > 0 || kl.TokensPerMinute > 0
	le.slots = tl.Concurrent > 0 || kl.Concurrent > 0
	tokenHeaders(le.header, tl.TokensPerMinute, kl.TokensPerMinute, r)
	return nil
}

type admitResult struct {
	admitted     bool
	reason       string
	retryMS      int64
	remT, resetT int64
	remK, resetK int64
}

func parseAdmit(v []any) (admitResult, error) {
	if len(v) != 7 {
		return admitResult{}, fmt.Errorf("script returned %d values", len(v))
	}
	n := func(i int) int64 { x, _ := v[i].(int64); return x }
	reason, _ := v[1].(string)
	return admitResult{admitted: n(0) == 1, reason: reason, retryMS: n(2), remT: n(3), resetT: n(4), remK: n(5), resetK: n(6)}, nil
}

// tokenHeaders sets the -tokens headers from the tighter of the two scopes.
func tokenHeaders(h http.Header, tenantTPM, keyTPM int, r admitResult) {
	limit, rem, reset := tenantTPM, r.remT, r.resetT
	if keyTPM > 0 && (tenantTPM == 0 || r.remK < rem) {
		limit, rem, reset = keyTPM, r.remK, r.resetK
	}
	if limit == 0 {
		return
	}
	h.Set("X-Ratelimit-Limit-Tokens", strconv.Itoa(limit))
	h.Set("X-Ratelimit-Remaining-Tokens", strconv.FormatInt(rem, 10))
	h.Set("X-Ratelimit-Reset-Tokens", fmtReset(time.Duration(reset)*time.Millisecond))
}

// admitRequests charges one request to the key's and then the tenant's
// requests-per-minute limit (redis_rate, GCRA).
func (l *Limiter) admitRequests(ctx context.Context, le *Lease, model string) error {
	var tightest *redis_rate.Result
	for _, c := range []struct {
		key  string
		rate int
	}{{le.k.req, le.kl.RequestsPerMinute}, {le.t.req, le.tl.RequestsPerMinute}} {
		if c.rate == 0 {
			continue
		}
		res, err := l.rate.Allow(ctx, c.key, redis_rate.PerMinute(c.rate))
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return err // the client has gone
			}
			if l.failRPM {
				return apierror.Unavailable(err, "Rate limiting is temporarily unavailable; retry shortly.")
			}
			l.log.Warn("tenancy: limiter unreachable; admitting unchecked (redis_failure: open)", "err", err)
			return nil
		}
		if res.Allowed == 0 {
			setRequestHeaders(le.header, res)
			return tooMany("requests", model, res.RetryAfter, le.header)
		}
		if tightest == nil || res.Remaining < tightest.Remaining {
			tightest = res
		}
	}
	if tightest != nil {
		setRequestHeaders(le.header, tightest)
	}
	return nil
}

// setRequestHeaders sets the x-ratelimit-*-requests headers OpenAI
// clients read, on success and on a 429 alike.
func setRequestHeaders(h http.Header, res *redis_rate.Result) {
	h.Set("X-Ratelimit-Limit-Requests", strconv.Itoa(res.Limit.Rate))
	h.Set("X-Ratelimit-Remaining-Requests", strconv.Itoa(res.Remaining))
	h.Set("X-Ratelimit-Reset-Requests", fmtReset(res.ResetAfter))
}

// tooMany is the 429 of a limit reached; its type names the limit
// ("requests" or "tokens", as OpenAI's do; concurrency counts as
// requests).
func tooMany(reason, model string, retry time.Duration, h http.Header) error {
	if retry < time.Millisecond {
		retry = time.Millisecond
	}
	what, typ := "requests per minute", "requests"
	switch reason {
	case "tokens":
		what, typ = "tokens per minute", "tokens"
	case "concurrency":
		what = "concurrent requests"
	}
	hdr := h.Clone()
	hdr.Set("Retry-After", strconv.Itoa(int(math.Ceil(retry.Seconds()))))
	hdr.Set("Retry-After-Ms", strconv.FormatInt(retry.Milliseconds()+1, 10))
	return &apierror.Error{Status: http.StatusTooManyRequests, Type: typ, Code: "rate_limit_exceeded", Header: hdr,
		Msg: fmt.Sprintf("Rate limit reached for %s on %s. Please try again in %s.", truncate(model, 256), what, fmtReset(retry))}
}

// fmtReset formats a reset duration as OpenAI does ("12ms", "1.5s", "6m0s").
func fmtReset(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	return d.Round(time.Millisecond).String()
}

func newLeaseID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Done ends the request: frees its concurrency slots and corrects its token
// charge to actualTokens (prompt plus completion, from the upstream's
// usage; pass a negative value when unknown to keep the estimate). It runs
// one bounded Redis call and is safe to call after the client has gone.
func (le *Lease) Done(actualTokens int) {
	le.doneOnce.Do(func() {
		delta := 0
		if le.charged && actualTokens >= 0 {
			delta = actualTokens - le.est
		}
		le.finish(delta)
	})
}

// release undoes an admission that a later limit refused.
func (le *Lease) release() { le.doneOnce.Do(func() { le.finish(-le.est) }) }

func (le *Lease) finish(delta int) {
	l := le.l
	if le.slots {
		l.mu.Lock()
		delete(l.live, le)
		l.mu.Unlock()
	}
	if !le.slots && (!le.charged || delta == 0) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.r.timeout())
	defer cancel()
	tpmT, tpmK := 0, 0
	if le.charged {
		tpmT, tpmK = le.tl.TokensPerMinute, le.kl.TokensPerMinute
	}
	err := doneScript.Run(ctx, l.r.Client, []string{le.t.tok, le.t.conc, le.k.tok, le.k.conc},
		le.id, delta, tpmT, tpmK).Err()
	if err != nil {
		l.log.Warn("tenancy: release lease; its slots expire within lease_ttl", "err", err)
	}
}

// Run renews the leases of requests in flight every LeaseTTL/3 until ctx
// ends, so a long stream keeps its slot while a crashed gateway's slots
// expire within LeaseTTL.
func (l *Limiter) Run(ctx context.Context) error {
	periodic.Every(ctx, l.ttl/3, func() { l.renew(ctx) })
	return nil
}

func (l *Limiter) renew(ctx context.Context) {
	l.mu.Lock()
	leases := make([]*Lease, 0, len(l.live))
	for le := range l.live {
		leases = append(leases, le)
	}
	l.mu.Unlock()
	if len(leases) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, l.ttl/3)
	defer cancel()
	_, err := l.r.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, le := range leases {
			l.renewOne(ctx, p, le)
		}
		return nil
	})
	if err != nil {
		l.log.Warn("tenancy: renew concurrency leases", "leases", len(leases), "err", err)
	}
}

func (l *Limiter) renewOne(ctx context.Context, p redis.Pipeliner, le *Lease) {
	var keys []string
	if le.tl.Concurrent > 0 {
		keys = append(keys, le.t.conc)
	}
	if le.kl.Concurrent > 0 {
		keys = append(keys, le.k.conc)
	}
	renewScript.Eval(ctx, p, keys, le.id, l.ttl.Milliseconds()) // EVALSHA cannot fall back inside a pipeline
}
