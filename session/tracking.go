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

	"github.com/warmpath/warmpath/internal/backoff"
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
//     first (markWrite), and the notice it causes is absorbed instead of
//     distrusting the key; a write that may or may not have landed (an
//     error) distrusts everything, as a lost connection does.
//   - A notice can overtake the reply of a read or write issued before
//     it (two connections): trust is granted only if no notice about the
//     key's stripe arrived between issuing the call and using its answer
//     (mark, then trusted compares generations).
//   - Two of this process's own calls about one key can land in Redis in
//     either order, and their absorbed notices say nothing of the order:
//     an answer is trusted only if no other own write of its stripe was in
//     flight when the call was issued or was issued before it was used
//     (settle).
//   - While the connection is down, being re-established, or silent past
//     its health check, nothing is trusted; every subscription starts a
//     new epoch, so trust granted before a gap never survives it. A flush
//     (FLUSHALL, FLUSHDB) sends a notice naming no key, which go-redis
//     cannot parse: the connection is re-established, with the same
//     effect.
//
// Without Run (or while it is not subscribed) the Store behaves as
// without tracking: Options.LocalTrust alone decides.
type Tracking struct {
	opt    *redis.Options
	prefix string // the Store's key prefix for bindings: Prefix + "sess:"
	log    *slog.Logger

	active atomic.Bool
	epoch  atomic.Uint64
	gens   [trackStripes]atomic.Uint64 // notices not absorbed, per stripe
	// ownGen counts this process's writes issued and ownLive those in
	// flight, per stripe (settle).
	ownGen  [trackStripes]atomic.Uint64
	ownLive [trackStripes]atomic.Int64

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
// backoff of 100 ms to 5 s, reset once it is subscribed again) when it
// fails. It returns nil when ctx ends, and ErrTrackingUnsupported at once
// if the server refuses tracking before it ever worked.
func (t *Tracking) Run(ctx context.Context) error {
	bo, worked := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}, false
	for ctx.Err() == nil {
		subscribed, err := t.follow(ctx)
		t.distrust(false)
		if ctx.Err() != nil {
			return nil
		}
		worked = worked || subscribed
		if !worked && errors.Is(err, ErrTrackingUnsupported) {
			return err
		}
		if subscribed {
			bo.Reset()
		}
		wait := bo.Next()
		t.log.Warn("session tracking lost; every turn asks Redis until it is back", "err", err, "retry", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	return nil
}

// follow subscribes and applies notices until the connection fails or
// falls silent (watch), and reports whether it was subscribed.
func (t *Tracking) follow(ctx context.Context) (subscribed bool, err error) {
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
	var heard atomic.Int64 // when the connection last said anything, Unix nanoseconds
	heard.Store(time.Now().UnixNano())
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { t.watch(wctx, ps, &heard) })
	defer func() { stop(); wg.Wait() }()
	for {
		// No read deadline: one firing inside a message would drop the
		// rest of it (watch closes a silent connection instead).
		msg, err := ps.Receive(wctx)
		if err != nil {
			return subscribed, err
		}
		heard.Store(time.Now().UnixNano())
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && m.Channel == invalidateChannel {
				subscribed = true
				t.distrust(true)
				t.log.Info("session tracking on: sticky turns answered from memory")
			}
		case *redis.Message:
			t.notice(m)
		case *redis.Pong:
			if m.Payload != "" {
				return subscribed, fmt.Errorf("session tracking: unexpected reply %q", m.Payload)
			}
		}
	}
}

// watch pings the subscription every trackPing and closes it once it has
// been silent for three: a connection that stopped delivering notices
// must not keep trust.
func (t *Tracking) watch(ctx context.Context, ps *redis.PubSub, heard *atomic.Int64) {
	tick := time.NewTicker(trackPing)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			ps.Close() // ends a blocked Receive
			return
		case now := <-tick.C:
			if now.Sub(time.Unix(0, heard.Load())) > 3*trackPing || ps.Ping(ctx) != nil {
				t.distrust(false)
				ps.Close()
				return
			}
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
// answer holds while the epoch and the key's stripe generation still are,
// and is granted at all only if no other own write could have landed
// around it (clean, own: see settle).
type mark struct {
	epoch, gen, own uint64
	clean           bool
}

// mark returns key's mark for a read issued now; the zero mark (never
// trusted) when tracking is off.
func (t *Tracking) mark(key string) mark {
	if !t.On() {
		return mark{}
	}
	i := trackStripe(key)
	return mark{epoch: t.epoch.Load(), gen: t.gens[i].Load(), own: t.ownGen[i].Load(), clean: t.ownLive[i].Load() == 0}
}

// markWrite announces a write of key by this process, issued now, and
// returns its mark: the notice it causes is its own. Call done when it
// has returned.
func (t *Tracking) markWrite(key string) mark {
	if !t.On() {
		return mark{}
	}
	i := trackStripe(key)
	t.mu.Lock()
	t.pending[key]++
	t.mu.Unlock()
	m := mark{epoch: t.epoch.Load(), gen: t.gens[i].Load()}
	m.clean = t.ownLive[i].Add(1) == 1
	m.own = t.ownGen[i].Add(1)
	return m
}

// done ends a write markWrite announced.
func (t *Tracking) done(key string, m mark) {
	if m.epoch != 0 {
		t.ownLive[trackStripe(key)].Add(-1)
	}
}

// settle returns the mark an answer obtained under m may be trusted with:
// m, unless another of this process's writes of the key's stripe was in
// flight when the call was issued or has been issued since (their order
// in Redis is unknown), then the zero mark.
func (t *Tracking) settle(key string, m mark) mark {
	if m.epoch == 0 || !m.clean || t.ownGen[trackStripe(key)].Load() != m.own {
		return mark{}
	}
	return m
}

// holds reports whether trust granted under m still holds.
func (t *Tracking) holds(key string, m mark) bool {
	return m.epoch != 0 && t.On() && t.epoch.Load() == m.epoch && t.gens[trackStripe(key)].Load() == m.gen
}

// unwritten withdraws a markWrite whose write changed nothing (a SET NX that
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
