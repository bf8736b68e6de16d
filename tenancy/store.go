package tenancy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
)

// Sentinel errors of the Store.
var (
	ErrNotFound = errors.New("tenancy: not found")
	ErrExists   = errors.New("tenancy: already exists")
	// errUnavailable: Redis could not answer and nothing usable is cached.
	errUnavailable = errors.New("tenancy: redis unavailable")
)

// InvalidError is a rejected admin input; Param names the offending field.
type InvalidError struct {
	Param string
	Err   error
}

func (e *InvalidError) Error() string { return "tenancy: invalid " + e.Param + ": " + e.Err.Error() }
func (e *InvalidError) Unwrap() error { return e.Err }

func invalid(param, format string, args ...any) error {
	return &InvalidError{Param: param, Err: fmt.Errorf(format, args...)}
}

// lastUsedEvery is how often, at most, one gateway writes a key's last-used
// time.
const lastUsedEvery = time.Minute

// Store keeps tenant and key records in Redis and caches them in process.
// It is safe for concurrent use. Run must be running for pub/sub
// invalidation and last-used writes; without it, cached records are trusted
// for CacheTTL.
type Store struct {
	rdb     redis.UniversalClient
	prefix  string
	timeout time.Duration // bounds request-path reads
	ttl     time.Duration // fresh for
	stale   time.Duration // usable past ttl while Redis is down
	flush   time.Duration // last-used flush interval
	log     *slog.Logger
	now     func() time.Time

	cache *lru.Cache[string, cached]
	// seq counts invalidations; a read that raced one is not cached.
	seq atomic.Uint64
	// inval makes an invalidation (seq, then the removal) and a read's
	// keep (the seq check, then the add) one step each, so a record read
	// before a revocation cannot be added just after its removal.
	inval sync.Mutex

	// reads joins concurrent misses of one entry into one Redis read, so a
	// burst of requests with a key not yet cached (a gateway's first
	// seconds, a cache purge on resubscription) costs one round trip, not
	// one each, and cannot queue on the pool past the read timeout.
	reads singleflight.Group

	// onInvalidate, when set (tests), is called with each entry dropped on
	// a pub/sub message, or "*" when the whole cache is.
	onInvalidate func(name string)
	// onWait, when set (tests), is called as a lookup starts waiting on a
	// read, its own or one already in flight.
	onWait func(name string)

	mu      sync.Mutex           // guards noted and pending
	noted   map[string]time.Time // key id → last-used time last queued
	pending map[string]time.Time // key id → last-used time to write
}

// cached is one cache entry: a key or a tenant record, and when it was read.
type cached struct {
	key    *Key
	tenant *Tenant
	at     time.Time
}

// NewStore returns a Store over r. cfg must have been through Validate. log
// may be nil.
func NewStore(r Redis, cfg Config, log *slog.Logger) *Store {
	cfg = cfg.WithDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c, _ := lru.New[string, cached](cfg.CacheSize) // errors only on size <= 0
	return &Store{
		rdb: r.Client, prefix: r.Prefix, timeout: r.timeout(), ttl: cfg.CacheTTL, stale: cfg.CacheStale, flush: cfg.Usage.FlushInterval,
		log: log, now: time.Now, cache: c,
		noted: map[string]time.Time{}, pending: map[string]time.Time{},
	}
}

func (s *Store) tenantKey(id string) string     { return s.prefix + "tenant:" + id }
func (s *Store) tenantKeysKey(id string) string { return s.prefix + "tenant:" + id + ":keys" }
func (s *Store) tenantsKey() string             { return s.prefix + "tenants" }
func (s *Store) keyKey(id string) string        { return s.prefix + "key:" + id }
func (s *Store) hashKey(h string) string        { return s.prefix + "keyhash:" + h }
func (s *Store) channel() string                { return s.prefix + "auth:invalidate" }

// Run subscribes to invalidations and writes last-used times until ctx
// ends. On every (re)subscription it drops the whole cache, since messages
// published while it was disconnected are lost.
func (s *Store) Run(ctx context.Context) error {
	ps := s.rdb.Subscribe(ctx, s.channel())
	defer ps.Close()
	ch := ps.ChannelWithSubscriptions()
	tick := time.NewTicker(s.flush)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			s.flushLastUsed(fctx)
			cancel()
			return nil
		case m := <-ch:
			s.onPubSub(m)
		case <-tick.C:
			s.flushLastUsed(ctx)
		}
	}
}

func (s *Store) onPubSub(m any) {
	switch m := m.(type) {
	case *redis.Subscription:
		if m.Kind == "subscribe" {
			s.drop("*")
		}
	case *redis.Message:
		s.drop(m.Payload)
	}
}

// drop removes one cache entry, or all for "*".
func (s *Store) drop(name string) {
	s.inval.Lock()
	s.seq.Add(1)
	if name == "*" {
		s.cache.Purge()
	} else {
		s.cache.Remove(name)
	}
	s.inval.Unlock()
	if s.onInvalidate != nil {
		s.onInvalidate(name)
	}
}

// invalidate drops cache entries here and publishes their names to every
// gateway.
func (s *Store) invalidate(ctx context.Context, names ...string) {
	for _, n := range names {
		s.inval.Lock()
		s.seq.Add(1)
		s.cache.Remove(n)
		s.inval.Unlock()
		if err := s.rdb.Publish(ctx, s.channel(), n).Err(); err != nil {
			s.log.Warn("tenancy: publish invalidation; other gateways see it within cache_ttl", "entry", n, "err", err)
		}
	}
}

// --- cached lookups (the request path) ---

// lookupKey returns the key with the given id.
func (s *Store) lookupKey(ctx context.Context, id string, now time.Time) (*Key, error) {
	e, err := s.lookup(ctx, "k:"+id, now, func(ctx context.Context) (cached, error) {
		k, err := s.readKey(ctx, id)
		return cached{key: k}, err
	})
	return e.key, err
}

// lookupHash returns the imported key whose full-key hash is h.
func (s *Store) lookupHash(ctx context.Context, h string, now time.Time) (*Key, error) {
	e, err := s.lookup(ctx, "h:"+h, now, func(ctx context.Context) (cached, error) {
		id, err := s.rdb.Get(ctx, s.hashKey(h)).Result()
		if err != nil {
			return cached{}, err
		}
		k, err := s.readKey(ctx, id)
		return cached{key: k}, err
	})
	return e.key, err
}

// lookupTenant returns the tenant with the given id.
func (s *Store) lookupTenant(ctx context.Context, id string, now time.Time) (*Tenant, error) {
	e, err := s.lookup(ctx, "t:"+id, now, func(ctx context.Context) (cached, error) {
		t, err := s.readTenant(ctx, id)
		return cached{tenant: t}, err
	})
	return e.tenant, err
}

// lookup serves name from the cache while fresh, else reads it, joining a
// read of the same entry already in flight. When the read fails for any
// reason but absence, a stale entry (within CacheStale) still serves;
// without one the result is errUnavailable.
func (s *Store) lookup(ctx context.Context, name string, now time.Time, read func(context.Context) (cached, error)) (cached, error) {
	e, ok := s.cache.Get(name)
	if ok && now.Sub(e.at) < s.ttl {
		return e, nil
	}
	fresh, err := s.readShared(ctx, name, now, read)
	switch {
	case err == nil:
		return fresh, nil
	case errors.Is(err, redis.Nil) || errors.Is(err, ErrNotFound):
		s.cache.Remove(name)
		return cached{}, ErrNotFound
	case ok && s.stale > 0 && now.Sub(e.at) < s.ttl+s.stale:
		s.log.Debug("tenancy: serving a cached record while redis fails", "err", err)
		return e, nil
	}
	return cached{}, fmt.Errorf("%w: %w", errUnavailable, err)
}

// readShared reads name once for every concurrent caller and caches what it
// read. The flight is keyed by the invalidation count as well, so a caller
// that arrives after an invalidation never takes a read begun before it.
// The read is bounded by the store's timeout and outlives a caller that
// goes away, since others may be waiting on it.
func (s *Store) readShared(ctx context.Context, name string, now time.Time, read func(context.Context) (cached, error)) (cached, error) {
	seq := s.seq.Load()
	ch := s.reads.DoChan(name+"@"+strconv.FormatUint(seq, 10), func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
		defer cancel()
		fresh, err := read(rctx)
		if err == nil {
			fresh.at = now
			s.keep(name, fresh, seq)
		}
		return fresh, err
	})
	if s.onWait != nil {
		s.onWait(name)
	}
	select {
	case r := <-ch:
		return r.Val.(cached), r.Err
	case <-ctx.Done():
		return cached{}, ctx.Err()
	}
}

// keep caches e, read for name after the seq-th invalidation, unless an
// invalidation came since (which the read may have missed).
func (s *Store) keep(name string, e cached, seq uint64) {
	s.inval.Lock()
	defer s.inval.Unlock()
	if s.seq.Load() == seq {
		s.cache.Add(name, e)
	}
}

// noteUse queues a key's last-used time, at most once a minute per key.
func (s *Store) noteUse(id string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.noted[id]) < lastUsedEvery {
		return
	}
	s.noted[id] = now
	s.pending[id] = now
}

func (s *Store) flushLastUsed(ctx context.Context) {
	s.mu.Lock()
	pending := s.pending
	s.pending = map[string]time.Time{}
	cut := s.now().Add(-lastUsedEvery)
	for id, t := range s.noted {
		if t.Before(cut) {
			delete(s.noted, id)
		}
	}
	s.mu.Unlock()
	if len(pending) == 0 {
		return
	}
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for id, t := range pending {
			p.HSet(ctx, s.keyKey(id), "used", t.UnixMilli())
		}
		return nil
	})
	if err != nil {
		s.log.Warn("tenancy: write last-used times", "keys", len(pending), "err", err)
	}
}

// --- records in Redis ---

func (s *Store) readTenant(ctx context.Context, id string) (*Tenant, error) {
	b, err := s.rdb.Get(ctx, s.tenantKey(id)).Bytes()
	if err != nil {
		return nil, fmt.Errorf("tenancy: read tenant %s: %w", id, err)
	}
	var t Tenant
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("tenancy: decode tenant %s: %w", id, err)
	}
	return &t, nil
}

func (s *Store) readKey(ctx context.Context, id string) (*Key, error) {
	v, err := s.rdb.HMGet(ctx, s.keyKey(id), "rec", "used").Result()
	if err != nil {
		return nil, fmt.Errorf("tenancy: read key %s: %w", id, err)
	}
	rec, _ := v[0].(string)
	if rec == "" {
		return nil, ErrNotFound
	}
	var k Key
	if err := json.Unmarshal([]byte(rec), &k); err != nil {
		return nil, fmt.Errorf("tenancy: decode key %s: %w", id, err)
	}
	if used, _ := v[1].(string); used != "" {
		if ms, err := strconv.ParseInt(used, 10, 64); err == nil {
			k.LastUsed = time.UnixMilli(ms).UTC()
		}
	}
	return &k, nil
}

// CreateTenant stores a new tenant, filling its defaults; ErrExists when
// the id is taken.
func (s *Store) CreateTenant(ctx context.Context, t Tenant) (Tenant, error) {
	if err := t.normalize(); err != nil {
		return Tenant{}, invalidFrom(err)
	}
	t.Created = s.now().UTC().Truncate(time.Millisecond)
	b, _ := json.Marshal(t)
	ok, err := s.rdb.SetNX(ctx, s.tenantKey(t.ID), b, 0).Result()
	if err != nil {
		return Tenant{}, fmt.Errorf("tenancy: create tenant: %w", err)
	}
	if !ok {
		return Tenant{}, ErrExists
	}
	if err := s.rdb.SAdd(ctx, s.tenantsKey(), t.ID).Err(); err != nil {
		return Tenant{}, fmt.Errorf("tenancy: index tenant: %w", err)
	}
	return t, nil
}

// invalidFrom turns a normalize error ("field: reason") into an
// InvalidError naming the field.
func invalidFrom(err error) error {
	msg := err.Error()
	for i := 0; i < len(msg); i++ {
		if msg[i] == ':' {
			return &InvalidError{Param: msg[:i], Err: err}
		}
	}
	return &InvalidError{Err: err}
}

// GetTenant reads a tenant from Redis (not the cache).
func (s *Store) GetTenant(ctx context.Context, id string) (Tenant, error) {
	if !idPattern.MatchString(id) {
		return Tenant{}, ErrNotFound
	}
	t, err := s.readTenant(ctx, id)
	if errors.Is(err, redis.Nil) {
		return Tenant{}, ErrNotFound
	}
	if err != nil {
		return Tenant{}, err
	}
	return *t, nil
}

// ListTenants returns every tenant, ordered by id.
func (s *Store) ListTenants(ctx context.Context) ([]Tenant, error) {
	ids, err := s.rdb.SMembers(ctx, s.tenantsKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("tenancy: list tenants: %w", err)
	}
	slices.Sort(ids)
	var out []Tenant
	for _, id := range ids {
		t, err := s.GetTenant(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// UpdateTenant applies edit to the stored tenant atomically (optimistic
// locking on the record) and invalidates it on every gateway.
func (s *Store) UpdateTenant(ctx context.Context, id string, edit func(*Tenant) error) (Tenant, error) {
	var out Tenant
	err := s.watch(ctx, func(tx *redis.Tx) error {
		t, err := s.GetTenant(ctx, id)
		if err != nil {
			return err
		}
		if err := edit(&t); err != nil {
			return err
		}
		t.ID = id
		if err := t.normalize(); err != nil {
			return invalidFrom(err)
		}
		b, _ := json.Marshal(t)
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, s.tenantKey(id), b, 0)
			return nil
		})
		out = t
		return err
	}, s.tenantKey(id))
	if err != nil {
		return Tenant{}, retryable(err)
	}
	s.invalidate(ctx, "t:"+id)
	return out, nil
}

// txAttempts bounds how often watch tries an optimistic transaction.
// What loses it is mostly a gateway's last-used write to the same key
// (at most one a minute per key and gateway), so eight losses in a row
// mean a real contention, which the caller sees as a conflict.
const txAttempts = 8

// watch runs fn as an optimistic transaction on keys (WATCH … EXEC), and
// again, re-reading, when another write to them landed between fn's read
// and its write. fn must read what it edits inside the transaction.
func (s *Store) watch(ctx context.Context, fn func(*redis.Tx) error, keys ...string) error {
	var err error
	for range txAttempts {
		if err = s.rdb.Watch(ctx, fn, keys...); !errors.Is(err, redis.TxFailedErr) {
			return err
		}
	}
	return err
}

// retryable maps a lost optimistic race to a conflict the caller may retry.
func retryable(err error) error {
	if errors.Is(err, redis.TxFailedErr) {
		return fmt.Errorf("tenancy: concurrent update, retry: %w", err)
	}
	return err
}
