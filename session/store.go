package session

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/scoring"
)

// Binding is a session's affinity to one replica: the routing-relevant
// part (scoring.Binding: replica, known cached blocks and tokens, tokens
// per byte, turns, last write), plus what only the gateway can check.
type Binding struct {
	scoring.Binding
	// TipKey is the prefix-index key of the deepest block known cached on
	// Replica for this session, at TipDepth blocks from block 0; zero when
	// unknown.
	TipKey uint64
	// TextLen and TextHash fingerprint the conversation text of the last
	// scored turn (its length and xxhash64): a later turn of the same
	// conversation starts with exactly that text. A turn that does not is
	// another conversation sharing the key, and is not routed as sticky.
	TextLen  int
	TextHash uint64
}

// Options configures a Store.
type Options struct {
	// Prefix is prepended to every Redis key ("" = none); the store owns
	// Prefix+"sess:*".
	Prefix string
	// TTL is how long a binding lives after its last turn; default 30m.
	TTL time.Duration
	// Timeout bounds each Redis call; default 100ms. Routing must not wait
	// long on affinity.
	Timeout time.Duration
	// LocalSize bounds the in-process copy of recent bindings; default
	// 100,000 sessions.
	LocalSize int
	// LocalTrust is how long after this process last read a binding from
	// Redis or wrote it there Lookup answers from the in-process copy
	// without asking Redis again: how stale a binding another process
	// changed (a rebind, a completed turn's cached tokens) may be seen
	// here. Local changes (UpdateLocal) do not extend it. Default 0 (or
	// negative): every lookup asks Redis.
	LocalTrust time.Duration
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

// Store keeps session bindings in Redis, with a bounded in-process copy.
type Store struct {
	rdb   redis.UniversalClient
	opts  Options
	local *lru.Cache[string, entry] // recent bindings; safe for concurrent use
	// updates serialises UpdateLocal's read-modify-writes, striped by key,
	// so two of this process's updates of one binding never lose each
	// other; flushes serialises Flush's writes the same way, so the last
	// write of a key to land is of its latest local copy.
	updates, flushes [64]sync.Mutex
	// trk, when Track made one, trusts local copies while Redis reports
	// no change to them.
	trk *Tracking
}

// entry is a binding kept in process memory and when it last agreed with
// Redis (read from or written to it; zero: never).
type entry struct {
	b       Binding
	checked time.Time
	mark    mark // tracking's state when that read or write was issued
}

// stripe is key's index into the updates and flushes locks.
func stripe(key string) uint64 { return xxhash.Sum64String(key) % 64 }

// NewStore returns a store over rdb. rdb may be nil: the store then keeps
// bindings in process memory only.
func NewStore(rdb redis.UniversalClient, o Options) *Store {
	if o.TTL <= 0 {
		o.TTL = 30 * time.Minute
	}
	if o.Timeout <= 0 {
		o.Timeout = 100 * time.Millisecond
	}
	if o.LocalSize <= 0 {
		o.LocalSize = 100_000
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	local, _ := lru.New[string, entry](o.LocalSize) // errs only for a non-positive size
	return &Store{rdb: rdb, opts: o, local: local}
}

func (s *Store) key(k string) string { return s.opts.Prefix + "sess:" + k }

// Lookup returns the session's binding. A binding this process read from
// or wrote to Redis less than LocalTrust ago is answered from memory, with
// no round trip; otherwise Redis is authoritative when it answers, and when
// it errs or has no binding, a fresh in-process copy is used (and written
// back to Redis in the second case). A non-nil error reports a Redis
// failure even when a local binding was found, so callers can count
// degraded lookups.
func (s *Store) Lookup(ctx context.Context, key string) (Binding, bool, error) {
	if key == "" {
		return Binding{}, false, nil
	}
	if b, ok := s.trusted(key); ok {
		return b, true, nil
	}
	var rerr error
	if s.rdb != nil {
		m := s.trk.mark(key)
		cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
		v, err := s.rdb.Get(cctx, s.key(key)).Result()
		cancel()
		switch {
		case err == nil:
			b, derr := decode(v)
			if derr == nil {
				return s.newer(key, b, s.trk.settle(key, m)), true, nil
			}
			rerr = derr
		case errors.Is(err, redis.Nil):
			b, ok := s.fresh(key)
			if !ok {
				return Binding{}, false, nil
			}
			// Redis lost it (a restart, an eviction): restore it, unless
			// another gateway bound the session meanwhile.
			won, err := s.setIfAbsent(ctx, key, b)
			if err != nil {
				return b, true, err
			}
			return won, true, nil
		default:
			rerr = fmt.Errorf("session: lookup: %w", err)
		}
	}
	b, ok := s.fresh(key)
	return b, ok, rerr
}

// Remember binds the session, refreshing its TTL. With onlyIfNew set the
// write happens only when Redis holds no binding yet; then the returned
// binding is whichever won (this call's, or one another gateway wrote
// first), so concurrent first turns agree on one replica.
func (s *Store) Remember(ctx context.Context, key string, b Binding, onlyIfNew bool) (Binding, error) {
	if key == "" {
		return b, nil
	}
	b.Updated = s.opts.Now()
	if s.rdb == nil {
		s.rememberUnchecked(key, b)
		return b, nil
	}
	if onlyIfNew {
		return s.setIfAbsent(ctx, key, b)
	}
	s.rememberUnchecked(key, b)
	return b, s.write(ctx, key, b)
}

// Propose keeps b as this process's copy of the session's binding without
// writing it to Redis, so the caller need not wait for Redis: the
// session's next Flush writes it. A binding Redis never confirmed is
// flushed with SET NX GET, so when another gateway bound the session
// meanwhile, its binding replaces this one here (FlushAll). Until then
// other processes do not see b, and this process's lookups answer with it
// when Redis has none (and write it back). Rebindings must not be proposed: Lookup prefers Redis's
// copy to a local one naming another replica.
func (s *Store) Propose(key string, b Binding) {
	if key == "" {
		return
	}
	b.Updated = s.opts.Now()
	mu := &s.updates[stripe(key)]
	mu.Lock()
	defer mu.Unlock()
	s.rememberUnchecked(key, b)
}

// setIfAbsent writes b unless Redis already holds a binding, and returns the
// binding Redis holds afterwards, in one round trip (SET NX GET, Redis ≥
// 7.0). Only that binding is kept locally, so a losing write never lingers
// where a later lookup could restore it.
func (s *Store) setIfAbsent(ctx context.Context, key string, b Binding) (Binding, error) {
	won, wrote, m, err := s.setNX(ctx, key, b)
	switch {
	case err != nil:
		s.rememberUnchecked(key, won) // Redis is down: this process's choice stands
	case wrote:
		s.remember(key, b, m)
	default:
		s.remember(key, won, m)
	}
	return won, err
}

// setNX writes b unless Redis holds a binding, and returns the binding
// Redis holds afterwards (b when the write failed), whether it was b's
// write, and the tracking mark its answer may be trusted with.
func (s *Store) setNX(ctx context.Context, key string, b Binding) (Binding, bool, mark, error) {
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	m := s.trk.markWrite(key)
	defer s.trk.done(key, m)
	old, err := s.rdb.SetArgs(cctx, s.key(key), b.encode(), redis.SetArgs{Mode: "NX", Get: true, TTL: s.opts.TTL}).Result()
	switch {
	case errors.Is(err, redis.Nil): // nothing was there: ours is written
		return b, true, s.trk.settle(key, m), nil
	case err != nil:
		s.trk.failed()
		return b, false, mark{}, fmt.Errorf("session: remember: %w", err)
	}
	s.trk.unwritten(key)
	won, err := decode(old)
	if err != nil {
		return b, false, mark{}, err
	}
	return won, false, s.trk.settle(key, m), nil
}

func (s *Store) write(ctx context.Context, key string, b Binding) error {
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	m := s.trk.markWrite(key)
	defer s.trk.done(key, m)
	if err := s.rdb.Set(cctx, s.key(key), b.encode(), s.opts.TTL).Err(); err != nil {
		s.trk.failed()
		return fmt.Errorf("session: remember: %w", err)
	}
	s.checked(key, b, s.trk.settle(key, m))
	return nil
}

// checked marks the local copy as agreeing with Redis now, if it is still
// b (a later local change is not what Redis holds). It holds the key's
// update lock, so an UpdateLocal is never overwritten.
func (s *Store) checked(key string, b Binding, m mark) {
	mu := &s.updates[stripe(key)]
	mu.Lock()
	defer mu.Unlock()
	if e, ok := s.local.Peek(key); ok && e.b == b {
		s.local.Add(key, entry{b: b, checked: s.opts.Now(), mark: m})
	}
}

// Forget drops the session's binding from Redis and from this process.
// Another process that served the session keeps its local copy and, seeing
// Redis without the binding, restores it (the same path that survives a
// Redis restart) until the TTL passes.
func (s *Store) Forget(ctx context.Context, key string) error {
	s.local.Remove(key)
	if s.rdb == nil {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	if err := s.rdb.Del(cctx, s.key(key)).Err(); err != nil {
		return fmt.Errorf("session: forget: %w", err)
	}
	return nil
}

// remember keeps b as the local copy, agreeing with Redis now (as of a
// call issued under m).
func (s *Store) remember(key string, b Binding, m mark) {
	s.local.Add(key, entry{b: b, checked: s.opts.Now(), mark: m})
}

// rememberUnchecked keeps b as the local copy without Redis having
// confirmed it: Redis is unreachable (or absent), or b is a local change.
// An update of the copy that last agreed with Redis keeps its check time,
// so local changes never stretch the trust window.
func (s *Store) rememberUnchecked(key string, b Binding) {
	var (
		checked time.Time
		m       mark
	)
	if e, ok := s.local.Peek(key); ok && e.b.Replica == b.Replica {
		checked, m = e.checked, e.mark
	}
	s.local.Add(key, entry{b: b, checked: checked, mark: m})
}

// newer returns the binding a lookup should use when Redis holds stored:
// this process's copy when it is a later write of the same binding (an
// UpdateLocal whose Flush has not landed yet), else stored, which then
// replaces the local copy. A rebinding is always written to Redis at once,
// so a copy naming another replica is never preferred.
func (s *Store) newer(key string, stored Binding, m mark) Binding {
	if l, ok := s.fresh(key); ok && l.Replica == stored.Replica && l.Updated.UnixMilli() > stored.Updated.UnixMilli() {
		s.checked(key, l, m) // Redis agrees on the replica
		return l
	}
	s.remember(key, stored, m)
	return stored
}

// Update applies fn to this process's latest copy of the session's binding
// (base when it has none) and writes the result, unless fn returns false:
// UpdateLocal, then Flush.
func (s *Store) Update(ctx context.Context, key string, base Binding, fn func(*Binding) bool) (Binding, error) {
	b, changed := s.UpdateLocal(key, base, fn)
	if !changed {
		return b, nil
	}
	return b, s.Flush(ctx, key)
}

// UpdateLocal applies fn to this process's latest copy of the session's
// binding (base when it has none) and keeps the result in process memory,
// unless fn returns false; it reports whether it changed the binding.
// Updates of one key by this process are serialised, so two writers that
// each set their own fields (the completed turn's cached tokens, the tip
// found off the request path) keep both. Lookup prefers the result to
// Redis's older copy of the same binding until Flush writes it.
func (s *Store) UpdateLocal(key string, base Binding, fn func(*Binding) bool) (Binding, bool) {
	if key == "" {
		return base, false
	}
	mu := &s.updates[stripe(key)]
	mu.Lock()
	defer mu.Unlock()
	b, ok := s.fresh(key)
	if !ok {
		b = base
	}
	if !fn(&b) {
		return b, false
	}
	b.Updated = later(s.opts.Now(), b.Updated)
	s.rememberUnchecked(key, b)
	return b, true
}

// later stamps an update of a binding last written at prev: now, but at
// least a millisecond after prev, so that a lookup tells the update from
// the write it follows even when both fall within one millisecond (Redis
// keeps the stamp to the millisecond; see newer).
func later(now, prev time.Time) time.Time {
	if floor := prev.Truncate(time.Millisecond).Add(time.Millisecond); now.Before(floor) {
		return floor
	}
	return now
}

// Flush writes this process's latest copy of the session's binding to
// Redis, refreshing its TTL; nothing when it has none. It is FlushAll of
// one key.
func (s *Store) Flush(ctx context.Context, key string) error {
	return s.FlushAll(ctx, []string{key})
}

// FlushAll writes this process's latest copies of the sessions' bindings
// to Redis in one pipelined round trip (two when a key needs it, below),
// refreshing their TTLs; keys it has no copy of are skipped. A copy Redis
// never confirmed (a proposed binding, a write that failed) is written
// only if Redis holds no binding for the session, or holds this one (SET
// NX GET first, then the write): when another gateway bound the session
// first, its binding replaces the local copy instead. Flushes of one key
// are serialised and each writes the copy as it is when its turn comes,
// so concurrent flushes never leave an older copy in Redis than a newer
// one. A key given twice is written once. The error is the first key's
// that failed.
func (s *Store) FlushAll(ctx context.Context, keys []string) error {
	if s.rdb == nil || len(keys) == 0 {
		return nil
	}
	defer s.lockFlushes(keys)()
	var (
		nx, set []flushed
		now     = s.opts.Now()
		seen    = make(map[string]struct{}, len(keys))
	)
	for _, key := range keys {
		if _, dup := seen[key]; dup {
			continue
		}
		seen[key] = struct{}{}
		e, ok := s.local.Peek(key)
		if !ok || key == "" || !e.b.Live(now, s.opts.TTL) {
			continue
		}
		if e.checked.IsZero() {
			nx = append(nx, flushed{key: key, b: e.b})
		} else {
			set = append(set, flushed{key: key, b: e.b})
		}
	}
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	var nxErr error
	if len(nx) > 0 {
		var again []flushed
		again, nxErr = s.setAllNX(cctx, nx)
		set = append(set, again...)
	}
	return cmp.Or(nxErr, s.writeAll(cctx, set))
}

// flushed is one binding FlushAll writes.
type flushed struct {
	key string
	b   Binding
}

// lockFlushes takes the flush locks of keys' stripes, in stripe order so
// concurrent batches cannot deadlock, and returns their unlock.
func (s *Store) lockFlushes(keys []string) func() {
	var taken [len(s.flushes)]bool
	for _, k := range keys {
		taken[stripe(k)] = true
	}
	for i := range taken {
		if taken[i] {
			s.flushes[i].Lock()
		}
	}
	return func() {
		for i := range taken {
			if taken[i] {
				s.flushes[i].Unlock()
			}
		}
	}
}

// setAllNX writes each binding unless Redis holds one for its session, in
// one pipeline; it returns those Redis already held as they are (another
// of this process's writes, or a restore, landed first), to be written.
func (s *Store) setAllNX(ctx context.Context, bs []flushed) ([]flushed, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StatusCmd, len(bs))
	marks := s.markWrites(bs)
	defer s.doneAll(bs, marks)
	for i, f := range bs {
		cmds[i] = pipe.SetArgs(ctx, s.key(f.key), f.b.encode(), redis.SetArgs{Mode: "NX", Get: true, TTL: s.opts.TTL})
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	var (
		again []flushed
		first error
	)
	for i, f := range bs {
		old, err := cmds[i].Result()
		switch {
		case errors.Is(err, redis.Nil): // nothing was there: ours is written
			s.checked(f.key, f.b, s.trk.settle(f.key, marks[i]))
		case err != nil:
			s.trk.failed()
			first = cmp.Or(first, fmt.Errorf("session: remember: %w", err))
		default:
			s.trk.unwritten(f.key)
			won, derr := decode(old)
			switch {
			case derr != nil:
				first = cmp.Or(first, derr)
			case won.Replica != f.b.Replica:
				s.updateTo(f.key, won, s.trk.settle(f.key, marks[i])) // another gateway bound the session first
			default:
				again = append(again, f) // Redis holds this binding already
			}
		}
	}
	return again, first
}

// writeAll writes the bindings in one pipeline.
func (s *Store) writeAll(ctx context.Context, bs []flushed) error {
	if len(bs) == 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StatusCmd, len(bs))
	marks := s.markWrites(bs)
	defer s.doneAll(bs, marks)
	for i, f := range bs {
		cmds[i] = pipe.Set(ctx, s.key(f.key), f.b.encode(), s.opts.TTL)
	}
	_, _ = pipe.Exec(ctx)
	var first error
	for i, f := range bs {
		if err := cmds[i].Err(); err != nil {
			s.trk.failed()
			first = cmp.Or(first, fmt.Errorf("session: remember: %w", err))
			continue
		}
		s.checked(f.key, f.b, s.trk.settle(f.key, marks[i]))
	}
	return first
}

// markWrites announces each binding's write to tracking (markWrite).
func (s *Store) markWrites(bs []flushed) []mark {
	marks := make([]mark, len(bs))
	if s.trk.On() {
		for i, f := range bs {
			marks[i] = s.trk.markWrite(f.key)
		}
	}
	return marks
}

// doneAll ends the writes markWrites announced.
func (s *Store) doneAll(bs []flushed, marks []mark) {
	for i, f := range bs {
		s.trk.done(f.key, marks[i])
	}
}

// updateTo replaces the local copy with b, which Redis holds now (as of a
// call issued under m).
func (s *Store) updateTo(key string, b Binding, m mark) {
	mu := &s.updates[stripe(key)]
	mu.Lock()
	defer mu.Unlock()
	s.remember(key, b, m)
}

// Local returns this process's latest copy of the session's binding,
// without asking Redis; false when it has none (or it outlived the TTL).
func (s *Store) Local(key string) (Binding, bool) { return s.fresh(key) }

// Trusted reports whether Lookup would answer key from this process's
// memory now, without asking Redis.
func (s *Store) Trusted(key string) bool {
	_, ok := s.trusted(key)
	return ok
}

// fresh returns the local binding if it has not outlived the TTL.
func (s *Store) fresh(key string) (Binding, bool) {
	e, ok := s.local.Get(key)
	if !ok || !e.b.Live(s.opts.Now(), s.opts.TTL) {
		return Binding{}, false
	}
	return e.b, true
}

// trusted returns the local binding if it has not outlived the TTL and,
// while tracking is on, tracking has reported no change to it since it
// agreed with Redis; otherwise if it agreed with Redis less than
// LocalTrust ago. Without Redis there is nothing to agree with,
// and the local copy is the truth.
func (s *Store) trusted(key string) (Binding, bool) {
	if s.rdb != nil && s.opts.LocalTrust <= 0 && !s.trk.On() {
		return Binding{}, false
	}
	e, ok := s.local.Get(key)
	now := s.opts.Now()
	switch {
	case !ok || !e.b.Live(now, s.opts.TTL):
		return Binding{}, false
	case s.rdb == nil:
		return e.b, true
	case e.checked.IsZero():
		return Binding{}, false
	case s.trk.On(): // notices decide, whatever LocalTrust says
		return e.b, s.trk.holds(key, e.mark)
	}
	return e.b, now.Sub(e.checked) < s.opts.LocalTrust
}
