package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Tracking keeps a Store's local bindings trustworthy without asking Redis
// on every turn: Redis's client-side caching in broadcasting mode (CLIENT
// TRACKING … BCAST PREFIX <prefix>sess:) tells it of every change to a
// binding key, whoever made it, on one pub/sub connection that redirects
// the notices to itself. A binding this process read from Redis or wrote
// there is then answered from memory until a notice says the key changed
// (another gateway rebound the session or recorded a turn, the key
// expired or was deleted), so a sticky turn pays no round trip.
//
// What makes it safe:
//   - This process's own writes notify too. Each write announces itself
//     first (expect), and the notice it causes is absorbed instead of
//     distrusting the key; a write that may or may not have landed (an
//     error) distrusts everything, as a lost connection does.
//   - A notice can overtake the reply of a read or write issued before
//     it (two connections): trust is granted only if no notice about the
//     key's stripe arrived between issuing the call and using its answer
//     (mark, then trusted compares generations).
//   - While the connection is down, being re-established, or silent past
//     its health check, nothing is trusted; every re-established
//     subscription starts a new epoch, so trust granted before a gap
//     never survives it.
//
// Without Run (or while it is not subscribed) the Store behaves as
// without tracking: Options.LocalTrust alone decides.
type Tracking struct {
	opt    *redis.Options
	prefix string // the Store's key prefix for bindings: Prefix + "sess:"
	log    *slog.Logger

	active atomic.Bool
	epoch  atomic.Uint64
	gens   [trackStripes]atomic.Uint64

	mu      sync.Mutex
	pending map[string]int // key → own writes whose notices are yet to come

	notices, flushes atomic.Int64
	// Tests' hooks: after each notice is applied, after trust is turned
	// on or off, and with each connection's client id.
	onNotice  func(key string)
	onActive  func(on bool)
	onConnect func(id int64)
}

// trackStripes is how many generation counters the keys share: a notice
// about one key distrusts the others of its stripe until they are read
// again (a round trip, never a wrong answer).
const trackStripes = 1 << 14

// trackPing is how often Run checks the subscription is alive; silent for
// three of them, nothing is trusted until it answers again.
const trackPing = time.Second

// invalidateChannel is where Redis publishes RESP2 tracking notices.
const invalidateChannel = "__redis__:invalidate"

// Track returns the Store's tracking over a single-node Redis reached
// with opt (its own connection; the Store's client may be any). Run it.
func (s *Store) Track(opt *redis.Options, log *slog.Logger) *Tracking {
	o := *opt
	o.Protocol = 2 // notices as pub/sub messages on the subscribed connection
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns = 1, 0, 1
	o.ConnMaxIdleTime, o.ConnMaxLifetime = -1, 0
	o.ReadTimeout = max(o.ReadTimeout, 3*trackPing)
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	t := &Tracking{opt: &o, prefix: s.opts.Prefix + "sess:", log: log, pending: map[string]int{}}
	t.epoch.Store(1)
	s.trk = t
	return t
}

// On reports whether bindings are trusted from memory now.
func (t *Tracking) On() bool { return t != nil && t.active.Load() }

// Notices returns how many change notices arrived, and how many of them
// distrusted everything (a flush, a lost connection, a failed write).
func (t *Tracking) Notices() (keys, flushes int64) {
	if t == nil {
		return 0, 0
	}
	return t.notices.Load(), t.flushes.Load()
}

// ErrTrackingUnsupported is what Run returns when the server refuses
// CLIENT TRACKING (Redis before 6, or a Redis-compatible store without
// it): the Store then works as without tracking.
var ErrTrackingUnsupported = errors.New("session tracking: the Redis server does not support CLIENT TRACKING")

// Run keeps the subscription until ctx ends, re-establishing it (with a
// backoff of 100 ms to 5 s) when it fails. It returns nil when ctx ends,
// and ErrTrackingUnsupported at once if the server refuses tracking.
func (t *Tracking) Run(ctx context.Context) error {
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := t.follow(ctx)
		t.distrust(false)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrTrackingUnsupported) {
			return err
		}
		t.log.Warn("session tracking lost; every turn asks Redis until it is back", "err", err, "retry", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
	return nil
}

// follow subscribes and applies notices until the connection fails.
func (t *Tracking) follow(ctx context.Context) error {
	o := *t.opt
	o.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		t.distrust(false) // a new connection: what the last one missed is unknown
		id, err := cn.ClientID(ctx).Result()
		if err != nil && isServerError(err) {
			return fmt.Errorf("%w: %w", ErrTrackingUnsupported, err)
		} else if err != nil {
			return fmt.Errorf("session tracking: client id: %w", err)
		}
		if t.onConnect != nil {
			t.onConnect(id)
		}
		err = cn.Do(ctx, "CLIENT", "TRACKING", "on", "REDIRECT", strconv.FormatInt(id, 10), "BCAST", "PREFIX", t.prefix).Err()
		if err != nil && isServerError(err) {
			return fmt.Errorf("%w: %w", ErrTrackingUnsupported, err)
		}
		return err
	}
	rdb := redis.NewClient(&o)
	defer rdb.Close()
	ps := rdb.Subscribe(ctx, invalidateChannel)
	defer ps.Close()
	stop := context.AfterFunc(ctx, func() { ps.Close() }) // a blocked receive returns at once
	defer stop()
	heard, pinged := time.Now(), time.Time{}
	for {
		msg, err := ps.ReceiveTimeout(ctx, trackPing)
		now := time.Now()
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && m.Channel == invalidateChannel {
				t.distrust(true)
				t.log.Info("session tracking on: sticky turns answered from memory")
			}
		case *redis.Message:
			t.notice(m)
		}
		if err == nil {
			heard = now
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		var nerr interface{ Timeout() bool }
		if !errors.As(err, &nerr) || !nerr.Timeout() {
			return err
		}
		if now.Sub(heard) > 3*trackPing && t.active.Load() {
			t.distrust(false) // silent: trust nothing until it answers
		}
		if now.Sub(pinged) >= trackPing {
			pinged = now
			if err := ps.Ping(ctx); err != nil {
				return err
			}
		}
		if now.Sub(heard) <= trackPing && !t.active.Load() {
			t.distrust(true) // it answered again on the same connection: nothing was lost
		}
	}
}

// notice applies one invalidation message: its keys, or everything when
// it names none (FLUSHALL, or the server dropped its tracking table).
func (t *Tracking) notice(m *redis.Message) {
	keys := m.PayloadSlice
	if len(keys) == 0 && m.Payload != "" {
		keys = []string{m.Payload}
	}
	if len(keys) == 0 {
		t.flushes.Add(1)
		t.distrust(t.active.Load())
		return
	}
	for _, k := range keys {
		t.notices.Add(1)
		key := k[min(len(k), len(t.prefix)):]
		t.mu.Lock()
		if n := t.pending[key]; n > 0 {
			if n == 1 {
				delete(t.pending, key)
			} else {
				t.pending[key] = n - 1
			}
		} else {
			t.gens[trackStripe(key)].Add(1)
		}
		t.mu.Unlock()
		if t.onNotice != nil {
			t.onNotice(key)
		}
	}
}

// distrust ends every trust granted so far (a new epoch, own writes'
// expected notices forgotten: one still to come now distrusts its key);
// on says whether trust may be granted from here on.
func (t *Tracking) distrust(on bool) {
	t.mu.Lock()
	t.epoch.Add(1)
	clear(t.pending)
	was := t.active.Swap(on)
	t.mu.Unlock()
	if t.onActive != nil && was != on {
		t.onActive(on)
	}
}

func trackStripe(key string) uint64 { return xxhash.Sum64String(key) % trackStripes }

// mark is what a call about a key knew when it was issued: trust from its
// answer holds while the epoch and the key's stripe generation still are.
type mark struct{ epoch, gen uint64 }

// mark returns key's mark now; the zero mark (never trusted) when
// tracking is off.
func (t *Tracking) mark(key string) mark {
	if !t.On() {
		return mark{}
	}
	return mark{epoch: t.epoch.Load(), gen: t.gens[trackStripe(key)].Load()}
}

// holds reports whether trust granted under m still holds.
func (t *Tracking) holds(key string, m mark) bool {
	return m.epoch != 0 && t.On() && t.epoch.Load() == m.epoch && t.gens[trackStripe(key)].Load() == m.gen
}

// expect announces a write of key by this process: its notice is its own.
func (t *Tracking) expect(key string) {
	if !t.On() {
		return
	}
	t.mu.Lock()
	t.pending[key]++
	t.mu.Unlock()
}

// unwritten withdraws an expect whose write changed nothing (a SET NX that
// found a binding): no notice will come for it. One already absorbed in
// its place was another writer's, so the key is distrusted.
func (t *Tracking) unwritten(key string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch n := t.pending[key]; {
	case n > 1:
		t.pending[key] = n - 1
	case n == 1:
		delete(t.pending, key)
	default:
		t.gens[trackStripe(key)].Add(1)
	}
}

// failed follows a write whose fate is unknown (it erred): whether its
// notice will come is unknown too, so nothing is trusted from before it.
func (t *Tracking) failed() {
	if t == nil {
		return
	}
	t.flushes.Add(1)
	t.distrust(t.active.Load())
}

// isServerError reports whether err is the server's error reply (rather
// than a connection's failure).
func isServerError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.Nil)
}
