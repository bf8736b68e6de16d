package tenancy

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Counts are usage counters: requests and their tokens.
type Counts struct {
	Requests         int64 `json:"requests"`
	PromptTokens     int64 `json:"prompt_tokens"`
	CachedTokens     int64 `json:"cached_tokens"` // prompt tokens served from the prefix cache
	CompletionTokens int64 `json:"completion_tokens"`
	// Uncached splits the uncached prompt tokens (prompt − cached) by
	// why they were not served from cache (the gateway's miss
	// attribution); its fields sum to PromptTokens − CachedTokens over
	// the requests that were attributed.
	Uncached Uncached `json:"uncached_tokens"`
}

// Uncached holds uncached prompt tokens by cause; the JSON names are the
// causes of warmpath_uncached_tokens_total (package misses).
type Uncached struct {
	New         int64 `json:"new"`
	ClientBreak int64 `json:"client_prefix_break"`
	Evicted     int64 `json:"evicted"`
	RoutedAway  int64 `json:"routed_away"`
	StaleIndex  int64 `json:"stale_index"`
	ColdReplica int64 `json:"cold_replica"`
}

func (c *Counts) add(o Counts) {
	v, w := c.values(), o.values()
	for i := range v {
		v[i] += w[i]
	}
	c.fromValues(v)
}

// usageFields are the fields of a bucket in Redis, in values order.
var usageFields = [...]string{"r", "p", "c", "o", "un", "ub", "ue", "ua", "us", "uc"}

func (c Counts) values() [len(usageFields)]int64 {
	u := c.Uncached
	return [...]int64{c.Requests, c.PromptTokens, c.CachedTokens, c.CompletionTokens,
		u.New, u.ClientBreak, u.Evicted, u.RoutedAway, u.StaleIndex, u.ColdReplica}
}

func (c *Counts) fromValues(v [len(usageFields)]int64) {
	*c = Counts{Requests: v[0], PromptTokens: v[1], CachedTokens: v[2], CompletionTokens: v[3],
		Uncached: Uncached{New: v[4], ClientBreak: v[5], Evicted: v[6], RoutedAway: v[7], StaleIndex: v[8], ColdReplica: v[9]}}
}

// set adds v to the counter stored under field; unknown fields are
// ignored.
func (c *Counts) set(field string, v int64) {
	i := slices.Index(usageFields[:], field)
	if i < 0 {
		return
	}
	vals := c.values()
	vals[i] += v
	c.fromValues(vals)
}

// maxPendingBuckets bounds the usage held in memory while Redis is down.
const maxPendingBuckets = 100000

type bucket struct {
	tenant, key string // key "" is the tenant's total
	minute      int64  // Unix minute
}

// Usage records per-tenant and per-key usage in per-minute buckets. Record
// only adds to memory; Run writes the batch every FlushInterval, so the
// request path makes no Redis round trip. Safe for concurrent use.
type Usage struct {
	r         Redis
	retention time.Duration
	every     time.Duration
	labels    *Labeler
	log       *slog.Logger
	now       func() time.Time

	mu      sync.Mutex // guards pending
	pending map[bucket]Counts
}

// NewUsage returns a usage recorder for cfg (after Validate); labels (may be
// nil) is fed every recorded request. log may be nil.
func NewUsage(r Redis, cfg Config, labels *Labeler, log *slog.Logger) *Usage {
	cfg = cfg.WithDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Usage{r: r, retention: cfg.Usage.Retention, every: cfg.Usage.FlushInterval, labels: labels, log: log,
		now: time.Now, pending: map[bucket]Counts{}}
}

// usageKey is the hash of one tenant's (or key's) buckets of one UTC day;
// its fields are "<minute of day>:<field>", one of usageFields.
func (u *Usage) usageKey(tenant, key string, day time.Time) string {
	k := u.r.Prefix + "usage:{" + tenant + "}:"
	if key != "" {
		k += "k:" + key + ":"
	}
	return k + day.Format("20060102")
}

// Record adds one request's usage for p at the current minute.
func (u *Usage) Record(p *Principal, c Counts) {
	m := u.now().Unix() / 60
	bs := []bucket{{p.TenantID, "", m}}
	if p.KeyID != "" {
		bs = append(bs, bucket{p.TenantID, p.KeyID, m})
	}
	u.mu.Lock()
	for _, b := range bs {
		v := u.pending[b]
		v.add(c)
		u.pending[b] = v
	}
	u.mu.Unlock()
	if u.labels != nil {
		u.labels.Observe(p.TenantName, c.Requests)
	}
}

// Run flushes recorded usage every FlushInterval until ctx ends, then once
// more.
func (u *Usage) Run(ctx context.Context) error {
	t := time.NewTicker(u.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			if err := u.Flush(fctx); err != nil {
				u.log.Warn("tenancy: final usage flush lost usage", "err", err)
			}
			return nil
		case <-t.C:
			if err := u.Flush(ctx); err != nil {
				u.log.Warn("tenancy: usage flush failed; retrying next interval", "err", err)
			}
			if u.labels != nil {
				u.labels.Recompute()
			}
		}
	}
}

// Flush writes the pending usage in one pipeline. On failure the batch is
// kept for the next flush (up to a bound).
func (u *Usage) Flush(ctx context.Context) error {
	u.mu.Lock()
	batch := u.pending
	u.pending = map[bucket]Counts{}
	u.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	_, err := u.r.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for b, c := range batch {
			u.queue(ctx, p, b, c)
		}
		return nil
	})
	if err != nil {
		u.restore(batch)
		return fmt.Errorf("tenancy: flush usage: %w", err)
	}
	return nil
}

func (u *Usage) queue(ctx context.Context, p redis.Pipeliner, b bucket, c Counts) {
	t := time.Unix(b.minute*60, 0).UTC()
	key := u.usageKey(b.tenant, b.key, t)
	mod := strconv.Itoa(t.Hour()*60 + t.Minute())
	for i, v := range c.values() {
		if v != 0 {
			p.HIncrBy(ctx, key, mod+":"+usageFields[i], v)
		}
	}
	p.Expire(ctx, key, u.retention+24*time.Hour)
}

func (u *Usage) restore(batch map[bucket]Counts) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for b, c := range batch {
		if len(u.pending) >= maxPendingBuckets {
			u.log.Warn("tenancy: usage backlog full; dropping usage", "buckets", len(batch))
			return
		}
		v := u.pending[b]
		v.add(c)
		u.pending[b] = v
	}
}

// Point is the usage of one step of a range.
type Point struct {
	Start time.Time `json:"start"`
	Counts
}

// Query returns usage of tenant (of one key when key is not "") from from to
// to (exclusive, minute resolution) in steps of step (a whole number of
// minutes, at least one), with every step present, and the range's total.
// The range is clipped to the retention and to the current minute.
func (u *Usage) Query(ctx context.Context, tenant, key string, from, to time.Time, step time.Duration) ([]Point, Counts, error) {
	from, to = from.UTC().Truncate(time.Minute), to.UTC().Truncate(time.Minute)
	now := u.now().UTC().Truncate(time.Minute)
	if oldest := now.Add(-u.retention); from.Before(oldest) {
		from = oldest
	}
	if end := now.Add(time.Minute); to.After(end) {
		to = end // nothing is recorded in the future
	}
	step = step.Truncate(time.Minute)
	if step <= 0 || !to.After(from) || to.Sub(from)/step > 10000 {
		return nil, Counts{}, invalid("step", "need from < to, a step of at least 1m and at most 10000 steps")
	}
	days := map[string]map[string]string{}
	for d := from.Truncate(24 * time.Hour); d.Before(to); d = d.Add(24 * time.Hour) {
		h, err := u.r.Client.HGetAll(ctx, u.usageKey(tenant, key, d)).Result()
		if err != nil {
			return nil, Counts{}, fmt.Errorf("tenancy: read usage: %w", err)
		}
		days[d.Format("20060102")] = h
	}
	points := make([]Point, int((to.Sub(from)+step-1)/step))
	for i := range points {
		points[i].Start = from.Add(time.Duration(i) * step)
	}
	var total Counts
	for day, h := range days {
		d, _ := time.Parse("20060102", day)
		for f, v := range h {
			add(points, &total, d, from, to, step, f, v)
		}
	}
	return points, total, nil
}

// add adds one stored field ("<minute of day>:<field>") to its point.
func add(points []Point, total *Counts, day, from, to time.Time, step time.Duration, field, val string) {
	mod, f, ok := strings.Cut(field, ":")
	m, err1 := strconv.Atoi(mod)
	v, err2 := strconv.ParseInt(val, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return
	}
	t := day.Add(time.Duration(m) * time.Minute)
	if t.Before(from) || !t.Before(to) {
		return
	}
	points[t.Sub(from)/step].Counts.set(f, v)
	total.set(f, v)
}

// Labeler bounds a metric's tenant label: the N busiest tenants (by
// requests seen by this process) are labelled by name, every other one
// "other". Until N tenants have been seen, each new one gets its own label
// at once; after that, the set is recomputed by Recompute (Usage.Run calls
// it at every flush). Safe for concurrent use; Label is lock-free.
type Labeler struct {
	n   int
	top atomic.Pointer[map[string]bool]

	mu     sync.Mutex // guards counts
	counts map[string]int64
}

// Other is the label shared by tenants outside the top N.
const Other = "other"

// NewLabeler returns a Labeler of n labels (0: every tenant is "other").
func NewLabeler(n int) *Labeler {
	l := &Labeler{n: n, counts: map[string]int64{}}
	l.top.Store(&map[string]bool{})
	return l
}

// Label returns name's label: name itself or Other.
func (l *Labeler) Label(name string) string {
	if (*l.top.Load())[name] {
		return name
	}
	return Other
}

// Observe counts requests for a tenant name.
func (l *Labeler) Observe(name string, requests int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.counts[name]; !ok && len(l.counts) >= 100*max(l.n, 1) {
		return // bound memory: a flood of names cannot grow the map
	}
	l.counts[name] += requests
	top := *l.top.Load()
	if !top[name] && len(top) < l.n {
		next := make(map[string]bool, len(top)+1)
		for k := range top {
			next[k] = true
		}
		next[name] = true
		l.top.Store(&next)
	}
}

// Recompute makes the N busiest names the labelled set.
func (l *Labeler) Recompute() {
	l.mu.Lock()
	type nc struct {
		name string
		n    int64
	}
	all := make([]nc, 0, len(l.counts))
	for k, v := range l.counts {
		all = append(all, nc{k, v})
	}
	l.mu.Unlock()
	slices.SortFunc(all, func(a, b nc) int { return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.name, b.name)) })
	next := map[string]bool{}
	for _, x := range all[:min(l.n, len(all))] {
		next[x.name] = true
	}
	l.top.Store(&next)
}
