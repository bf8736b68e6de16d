package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
)

// errRedisOpen is what every Redis command returns while the breaker is
// open: at once, without dialing or waiting.
var errRedisOpen = errors.New("gateway: redis unreachable (breaker open); using in-process state")

// Breaker defaults.
const (
	breakerFailures = 3                      // consecutive failures that open it
	breakerProbe    = 250 * time.Millisecond // probe period while open
)

// redisBreaker keeps a Redis outage off the request path. It is a go-redis
// hook on the gateway's client: after breakerFailures consecutive network
// failures (not redis.Nil, not server error replies, not a canceled
// client) it opens, and every command then fails at once with errRedisOpen,
// so session bindings, key lookups and limits fall back to their
// in-process state instead of waiting on dial retries. Run probes with a
// PING every breakerProbe while it is open and closes it on the first
// answer. Transitions are logged once each, with the error.
type redisBreaker struct {
	rdb      redis.UniversalClient
	log      *slog.Logger
	open     atomic.Bool
	fails    atomic.Int32
	wake     chan struct{} // cap 1: Run's signal that the breaker opened
	gauge    prometheus.Gauge
	trips    prometheus.Counter
	shortcut prometheus.Counter
}

// probeKey marks the probe's context: its PING passes the open breaker.
type probeKey struct{}

func newRedisBreaker(rdb redis.UniversalClient, log *slog.Logger, reg prometheus.Registerer) *redisBreaker {
	b := &redisBreaker{
		rdb: rdb, log: log.With("component", "redis"), wake: make(chan struct{}, 1),
		gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "warmpath_redis_breaker_open",
			Help: "1 while Redis is unreachable and requests use in-process state instead of waiting on it."}),
		trips: prometheus.NewCounter(prometheus.CounterOpts{Name: "warmpath_redis_breaker_trips_total",
			Help: "Times the Redis breaker opened."}),
		shortcut: prometheus.NewCounter(prometheus.CounterOpts{Name: "warmpath_redis_short_circuited_total",
			Help: "Redis commands failed at once by the open breaker."}),
	}
	reg.MustRegister(b.gauge, b.trips, b.shortcut)
	rdb.AddHook(b)
	return b
}

func (b *redisBreaker) blocked(ctx context.Context) bool {
	if !b.open.Load() || ctx.Value(probeKey{}) != nil {
		return false
	}
	b.shortcut.Inc()
	return true
}

// DialHook implements redis.Hook. Dials pass: commands are stopped before
// they dial, and the pool's own background redial (after dial errors) must
// be free to reconnect.
func (b *redisBreaker) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (b *redisBreaker) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if b.blocked(ctx) {
			cmd.SetErr(errRedisOpen)
			return errRedisOpen
		}
		err := next(ctx, cmd)
		b.observe(ctx, err)
		return err
	}
}

// ProcessPipelineHook implements redis.Hook.
func (b *redisBreaker) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if b.blocked(ctx) {
			for _, c := range cmds {
				c.SetErr(errRedisOpen)
			}
			return errRedisOpen
		}
		err := next(ctx, cmds)
		b.observe(ctx, err)
		return err
	}
}

// observe counts a command's outcome toward opening the breaker.
func (b *redisBreaker) observe(ctx context.Context, err error) {
	var reply redis.Error
	switch {
	case err == nil, errors.Is(err, redis.Nil), errors.As(err, &reply):
		b.fails.Store(0) // Redis answered
		return
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		return // the caller gave up; says nothing about Redis
	}
	if b.fails.Add(1) >= breakerFailures && b.open.CompareAndSwap(false, true) {
		b.gauge.Set(1)
		b.trips.Inc()
		b.log.Warn("redis unreachable; serving from in-process state until it answers", "err", err)
		select {
		case b.wake <- struct{}{}:
		default:
		}
	}
}

// Run probes Redis while the breaker is open and closes it on the first
// answer, until ctx ends.
func (b *redisBreaker) Run(ctx context.Context) error {
	t := time.NewTicker(breakerProbe)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-b.wake:
		case <-t.C:
		}
		if !b.open.Load() {
			continue
		}
		pctx, cancel := context.WithTimeout(context.WithValue(ctx, probeKey{}, true), breakerProbe)
		err := b.rdb.Ping(pctx).Err()
		cancel()
		if err == nil {
			b.fails.Store(0)
			b.open.Store(false)
			b.gauge.Set(0)
			b.log.Info("redis answers again; breaker closed")
		}
	}
}

// RedisLogger adapts go-redis's own log lines (dial failures, pool
// notices; redis.SetLogger) to structured, rate-limited records: at most
// one a second, with how many were held back, so an outage is visible
// without a line per request.
func RedisLogger(log *slog.Logger) interface {
	Printf(ctx context.Context, format string, v ...any)
} {
	return &redisLogger{log: log.With("component", "go-redis"), limit: sometimes{period: time.Second}}
}

type redisLogger struct {
	log   *slog.Logger
	limit sometimes
}

func (l *redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if ok, held := l.limit.allow(); ok {
		l.log.WarnContext(ctx, fmt.Sprintf(format, v...), "held_back", held)
	}
}

// store is the gateway's Redis: the client (nil keeps everything in
// process memory), whether the gateway made it (and so closes it), and
// the breaker that keeps an outage off the request path.
type store struct {
	rdb     redis.UniversalClient
	owns    bool
	breaker *redisBreaker // nil without Redis
}

// newStore connects the configured Redis, or takes over rdb (a test's,
// with a key prefix) when not nil, and adds the breaker's hook to it.
func newStore(rc RedisConfig, rdb redis.UniversalClient, log *slog.Logger, reg prometheus.Registerer) (*store, error) {
	s := &store{rdb: rdb}
	if s.rdb == nil && !rc.embedded() {
		var err error
		if s.rdb, err = rc.Client(); err != nil {
			return nil, err
		}
		s.owns = true
	}
	if s.rdb != nil {
		s.breaker = newRedisBreaker(s.rdb, log, reg)
	}
	return s, nil
}

// run starts the breaker's probe under eg.
func (s *store) run(ctx context.Context, eg *errgroup.Group) {
	if s.breaker != nil {
		eg.Go(func() error { return s.breaker.Run(ctx) })
	}
}

// close closes the client if the gateway made it.
func (s *store) close() {
	if s.owns && s.rdb != nil {
		s.rdb.Close()
	}
}
