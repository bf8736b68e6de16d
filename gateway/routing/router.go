package routing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/warmpath/warmpath/gateway/admission"
	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/session"
)

// Router is the routing stage: it prepares each turn's routing before
// admission (Prepare), decides where it goes as it leaves the queue
// (Route, or the queue's Placement.Place), and keeps what the decision
// reads and writes: the policy and its calibration, the prefix indexes,
// the tokenizer, the learned bytes-per-token ratios, and the session
// bindings with their writes (off the request path: the binding flusher,
// the tip and write workers). Build one with New; Run runs its workers.
type Router struct {
	cfg        Config
	log        *slog.Logger
	m          *metrics
	fleet      *fleet.Fleet
	policy     *scoring.Policy
	cal        *scoring.Calibrator // the TTFT model's per-model calibration
	sessions   *session.Store
	tracking   *session.Tracking // keeps sticky lookups off Redis; nil without a single Redis server
	index      *PreciseIndex
	approx     *ApproxIndex
	tok        *Tokenizer
	ratios     *tokenRatios    // bytes per prompt token, by model
	tips       *workers        // fill session tips off the request path (tips.go)
	tipPending sync.Map        // sessions with a tip job queued or running
	writes     *workers        // Redis writes off the request path (family placements)
	flusher    *bindingFlusher // write completed turns' bindings to Redis in batches
	capacity   *admission.Capacity
	backlog    Backlog
	// tokenizeTimeout bounds a /tokenize call (upstream.tokenize_timeout).
	tokenizeTimeout time.Duration

	decided        func(*Turn, *Route)
	tokenizeFailed func(ctx context.Context, requestID string, err error)
}

// Backlog is what routing reads of the requests waiting in admission
// (the gateway's backlog, shared with the other gateways): how many of a
// model's requests wait, those held for each replica, and how many other
// gateways there are.
type Backlog interface {
	// Of returns how many of model's requests wait now.
	Of(model string) int
	// Fill sets, on eps (the endpoints of reps), the other waiting
	// requests held for each replica, ahead of p or behind it.
	Fill(p *Placement, reps []*fleet.Replica, eps []scoring.Endpoint)
	// Plan records the plan p's placement made while it waits.
	Plan(p *Placement, rep *fleet.Replica, plan *scoring.Plan, room bool)
	// Peers returns how many other gateways the last exchange saw.
	Peers() int
}

// Deps are the router's dependencies that do not come from its Config.
type Deps struct {
	Fleet *fleet.Fleet
	// Capacity is admission's judgment of a replica's room; nil without a
	// fair queue.
	Capacity *admission.Capacity
	Backlog  Backlog
	// Redis keeps the session bindings (nil: process memory only), under
	// KeyPrefix, each call bounded by RedisTimeout; Tracking turns on
	// client-side tracking of the bindings (single server only).
	Redis        redis.UniversalClient
	KeyPrefix    string
	RedisTimeout time.Duration
	Tracking     bool
	// Tokenize calls /tokenize (its Timeout bounds a call).
	Tokenize *http.Client
	// RedisErrors counts Redis operations that failed, by op.
	RedisErrors *prometheus.CounterVec
	// Decided, when set, is told of each decision (the status page).
	Decided func(*Turn, *Route)
	// TokenizeFailed, when set, is told of a failed tokenization that
	// routing went on without (the gateway rate-limits its warning).
	TokenizeFailed func(ctx context.Context, requestID string, err error)
	Logger         *slog.Logger
	Registerer     prometheus.Registerer
}

// Pools off the request path: the tip workers and the Redis writes (a
// session family's placement).
const (
	tipWorkers   = 2
	tipBacklog   = 256
	writeWorkers = 2
	writeBacklog = 4096
)

// New builds the router from cfg (defaults filled, validated) and d. It
// starts no goroutine; Run does.
func New(cfg Config, d Deps) (*Router, error) {
	g := &Router{cfg: cfg, log: d.Logger, fleet: d.Fleet, capacity: d.Capacity, backlog: d.Backlog,
		decided: d.Decided, tokenizeFailed: d.TokenizeFailed, cal: scoring.NewCalibrator(scoring.DefaultCost()),
		ratios: newTokenRatios(), tips: newWorkers(tipWorkers, tipBacklog, 0), writes: newWorkers(writeWorkers, writeBacklog, time.Second)}
	if d.Tokenize != nil {
		g.tokenizeTimeout = d.Tokenize.Timeout
	}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	g.m = newMetrics(d.Registerer, d.RedisErrors)
	var err error
	if g.policy, err = scoring.NewPolicy(cfg.Policy, cfg.Weights); err != nil {
		return nil, fmt.Errorf("config: routing: %w", err)
	}
	if g.index, err = newPreciseIndex(cfg.BlockSize, cfg.IndexMaxEntries, d.Registerer); err != nil {
		return nil, fmt.Errorf("config: routing: %w", err)
	}
	if g.approx, err = newApproxIndex(cfg.ApproxChunkBytes); err != nil {
		return nil, fmt.Errorf("config: routing: %w", err)
	}
	g.tok, err = buildTokenizer(tokenizerOptions{Client: d.Tokenize, CacheBytes: cfg.TokenizeCacheBytes, Service: cfg.TokenizeURL,
		Local: cfg.Tokenizer, Dirs: cfg.TokenizerDirs, VerifyEvery: cfg.TokenizerVerifyEvery,
		Logger: g.log.With("component", "tokenizer"), Registerer: d.Registerer})
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	g.sessions = session.NewStore(d.Redis, session.Options{Prefix: d.KeyPrefix, TTL: cfg.SessionTTL, Timeout: d.RedisTimeout, LocalTrust: cfg.SessionLocalTrust})
	if c, ok := d.Redis.(*redis.Client); ok && d.Tracking {
		g.tracking = g.sessions.Track(c.Options(), g.log.With("component", "session-tracking"))
		g.m.watchTracking(d.Registerer, g.tracking)
	}
	g.flusher = newBindingFlusher(g.sessions.FlushAll, d.RedisTimeout, bindingSpacing(cfg.BindingWriteSpacing, d.Backlog.Peers),
		func() { g.m.redisErrors.WithLabelValues("remember").Inc() })
	return g, nil
}

// Run runs the router's workers (tips, writes, the binding flusher, the
// in-process tokenizer's checker, the session tracking) until ctx ends.
func (g *Router) Run(ctx context.Context) error {
	eg, ectx := errgroup.WithContext(ctx)
	eg.Go(func() error { return g.tips.Run(ectx) })
	eg.Go(func() error { return g.tok.Run(ectx) })
	eg.Go(func() error { return g.writes.Run(ectx) })
	eg.Go(func() error { return g.flusher.Run(ectx) })
	if g.tracking != nil {
		eg.Go(func() error {
			if err := g.tracking.Run(ectx); errors.Is(err, session.ErrTrackingUnsupported) {
				g.log.Info("session tracking off: every sticky turn asks Redis", "err", err)
			} else if err != nil {
				return err
			}
			return nil
		})
	}
	return eg.Wait()
}

// Policy returns the routing policy in force.
func (g *Router) Policy() *scoring.Policy { return g.policy }

// Index returns the precise prefix index (the KV-event subscribers feed
// it).
func (g *Router) Index() *PreciseIndex { return g.index }

// Approx returns the approximate prefix index.
func (g *Router) Approx() *ApproxIndex { return g.approx }

// Tokenizer returns the tokenizer.
func (g *Router) Tokenizer() *Tokenizer { return g.tok }

// Sessions returns the session bindings' store.
func (g *Router) Sessions() *session.Store { return g.sessions }

// BytesPerToken returns model's learned bytes per prompt token, 0 while
// unknown.
func (g *Router) BytesPerToken(model string) float64 { return g.ratios.get(model) }

// ObserveTokens learns the model's bytes-per-token ratio from an
// answered request whose text made promptTokens tokens.
func (g *Router) ObserveTokens(r *request.R, promptTokens int) {
	g.ratios.observe(r.Model(), r.TextBytes(), promptTokens)
}

// ObserveTTFT calibrates the TTFT model: the estimate e for model's
// first byte was observed to take observed seconds.
func (g *Router) ObserveTTFT(model string, e scoring.Estimate, observed float64) {
	g.cal.Observe(model, e, observed)
}

// LocalKeys returns the block keys of r's prompt from the in-process
// tokenizer, nil when its model has none.
func (g *Router) LocalKeys(r *request.R) []uint64 {
	ids, ok := g.tok.LocalIDs(r)
	if !ok {
		return nil
	}
	return g.index.Keys(ids, r.Model(), r.CacheSalt())
}

// Calibrator returns the TTFT model's per-model calibration.
func (g *Router) Calibrator() *scoring.Calibrator { return g.cal }
