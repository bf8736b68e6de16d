package gateway

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/warmpath/warmpath/anthropic"
	"github.com/warmpath/warmpath/gateway/admission"
	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/routing"
	"github.com/warmpath/warmpath/kvevents"
	"github.com/warmpath/warmpath/record"
	"github.com/warmpath/warmpath/responses"
)

// Options are a gateway's dependencies that do not come from configuration.
type Options struct {
	// Logger receives the gateway's logs; nil discards them.
	Logger *slog.Logger
	// Registry receives every metric; nil means a fresh registry (served
	// on /metrics either way).
	Registry *prometheus.Registry
	// Redis overrides the client built from Config.Redis (tests pass one
	// with a key prefix); the gateway adds its breaker hook to it. Nil with
	// an empty Config.Redis keeps session bindings in process memory only.
	Redis redis.UniversalClient
	// UpstreamAPIKey is sent to replicas as a bearer token (vLLM's
	// --api-key); empty sends none.
	UpstreamAPIKey string
	// Resolver resolves the discovery names (Config.Discovery); nil means
	// net.DefaultResolver.
	Resolver fleet.Resolver
	// Getenv reads the standard OTEL_* variables that turn tracing on
	// and tune it (see TracingConfig); nil reads none. warmpath serve
	// passes os.Getenv.
	Getenv func(string) string
	// SpanExporter, when set, turns tracing on and receives every span
	// as it ends (tests pass tracetest.NewInMemoryExporter), instead of
	// the OTLP exporter of Config.Tracing.
	SpanExporter sdktrace.SpanExporter

	// wrapRegisterer, when set, wraps the registerer every collector is
	// registered through (before the policy label is added): the metrics
	// reference test records each collector with its Go type.
	wrapRegisterer func(prometheus.Registerer) prometheus.Registerer
}

// Gateway is a running warmpath gateway: an OpenAI-compatible HTTP edge over
// a vLLM fleet. Build one with New, then call Run.
type Gateway struct {
	cfg         Config
	log         *slog.Logger
	reg         *prometheus.Registry
	m           *metrics
	kvm         *kvevents.Metrics
	fleet       *fleet.Fleet
	router      *routing.Router // the routing stage: policy, indexes, tokenizer, session bindings
	rdb         redis.UniversalClient
	ownsRedis   bool
	breaker     *redisBreaker // nil without Redis
	tenants     *tenants
	activity    *activity          // what the status page shows
	miss        *missTracker       // miss attribution and prefix-break diagnostics (misses.go)
	rec         *record.Recorder   // nil unless record.dir is set (record.go)
	responses   *responses.Service // nil without Redis
	messages    *anthropic.Service
	admit       admitFunc
	waiting     backlog               // requests waiting in admit, by model
	queue       *admission.Queue      // nil: no fair queue (queue.disabled)
	shareQueue  *backlogSync          // shares waiting with the other gateways; nil without a queue or Redis
	wrapped     prometheus.Registerer // reg with the policy label
	upstream    *http.Transport
	upstreamKey string
	ln          net.Listener
	srv         *http.Server
	metricsLn   net.Listener // nil: /metrics is served on ln
	metricsSrv  *http.Server
	draining    atomic.Bool // SIGTERM arrived: /readyz answers 503
	// tokenizeWarn rate-limits a warning any client can trigger.
	tokenizeWarn sometimes
	drainCtx     context.Context // ends when the drain timeout passes, cutting open streams
	cutStreams   context.CancelFunc
	started      time.Time
	trace        tracing // OpenTelemetry; off unless configured (tracing.go)
}

// New builds a gateway from cfg: it fills defaults, validates (errors name
// the offending field), connects nothing yet but binds the listen address,
// so Addr is known before Run. It starts no goroutine but, with tracing
// on, the span exporter's (stopped by Run's exit).
func New(cfg Config, o Options) (*Gateway, error) {
	cfg, log, err := settle(cfg, o)
	if err != nil {
		return nil, err
	}
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"policy": cfg.Routing.Policy}, reg)
	if o.wrapRegisterer != nil {
		wrapped = o.wrapRegisterer(wrapped)
	}
	g := &Gateway{cfg: cfg, log: log, reg: reg, wrapped: wrapped, m: newMetrics(wrapped), kvm: kvevents.NewMetrics(wrapped), upstreamKey: o.UpstreamAPIKey, started: time.Now()}
	g.drainCtx, g.cutStreams = context.WithCancel(context.Background())
	g.activity = newActivity()
	g.tokenizeWarn.period = 10 * time.Second
	for _, build := range []func(Options) error{g.buildStores, g.buildFleet, g.buildAdmission, g.buildRouting, g.buildFronts, g.buildServers} {
		if err := build(o); err != nil {
			g.close()
			return nil, err
		}
	}
	g.miss = newMissTracker(cfg.Routing.BlockSize, wrapped, log, g.fleet, g.tenants.usage)
	return g, nil
}

// settle fills cfg's defaults, warns about what it enables or ignores,
// validates it, and returns the logger (trace ids added with tracing on).
func settle(cfg Config, o Options) (Config, *slog.Logger, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	cfg.devAuth(log)
	cfg.warnDeprecated(log)
	if err := cfg.validate(); err != nil {
		return cfg, nil, err
	}
	if cfg.Embedded() {
		return cfg, nil, errors.New("config: no replicas and no discovery configured (warmpath serve starts a simulated fleet in that case)")
	}
	if _, on := cfg.Tracing.resolve(o.Getenv); on || o.SpanExporter != nil {
		log = slog.New(traceLogHandler{log.Handler()})
	}
	return cfg, log, nil
}

// buildStores connects what is kept in Redis (or in process): tenants and
// keys, and the recorder.
func (g *Gateway) buildStores(o Options) error {
	cfg, log := &g.cfg, g.log
	var err error
	g.rdb = o.Redis
	if g.rdb == nil && !cfg.Redis.embedded() {
		if g.rdb, err = cfg.Redis.Client(); err != nil {
			return err
		}
		g.ownsRedis = true
	}
	if g.rdb != nil {
		g.breaker = newRedisBreaker(g.rdb, log, g.wrapped)
	}
	if g.tenants, err = newTenants(cfg, g.rdb, log); err != nil {
		return err
	}
	if g.rec, err = newRecorder(cfg.Record, g.tenants.cfg.SaltSecret, log, g.wrapped); err != nil {
		return err
	}
	return nil
}

// buildFleet builds the fleet and the upstream transport.
func (g *Gateway) buildFleet(o Options) error {
	cfg := &g.cfg
	var err error
	fc := cfg.fleetConfig(o, g.log, g.wrapped)
	fc.OnUpdate = g.replicaUpdated
	if g.fleet, err = fleet.New(fc); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	g.upstream = &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: cfg.Upstream.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   512,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return nil
}

// buildRouting builds the routing stage over the fleet and admission's
// judgment of room.
func (g *Gateway) buildRouting(Options) error {
	cfg := &g.cfg
	_, single := g.rdb.(*redis.Client)
	var err error
	g.router, err = routing.New(cfg.Routing, routing.Deps{Fleet: g.fleet, Capacity: g.capacity(), Backlog: &g.waiting,
		Redis: g.rdb, KeyPrefix: cfg.Redis.KeyPrefix, RedisTimeout: cfg.Redis.Timeout,
		Tracking: single && cfg.Redis.Tracking == "on" && cfg.Redis.MasterName == "",
		Tokenize: &http.Client{Transport: g.upstream, Timeout: cfg.Upstream.TokenizeTimeout}, RedisErrors: g.m.redisErrors,
		Decided: g.decided, TokenizeFailed: g.tokenizeFailed, Logger: g.log, Registerer: g.wrapped})
	return err
}

// buildAdmission builds the fair queue (unless queue.disabled) and, with
// Redis, the backlog exchange with the other gateways.
func (g *Gateway) buildAdmission(Options) error {
	cfg := &g.cfg
	g.admit = admitAll
	if cfg.Queue.Disabled {
		return nil
	}
	var err error
	if g.queue, err = admission.New(cfg.Queue, g.fleet, admission.Options{KeyPrefix: cfg.Redis.KeyPrefix, Redis: g.rdb,
		Labels: g.tenants.labels, Registerer: g.wrapped, Logger: g.log}); err != nil {
		return err
	}
	g.admit = admitFunc(g.admitQueued)
	if g.rdb != nil {
		g.shareQueue = &backlogSync{b: &g.waiting, rdb: g.rdb, key: cfg.Redis.KeyPrefix + backlogHash, id: rand.Text(),
			every: cfg.Queue.SyncInterval, limit: cfg.Redis.Timeout, log: g.log.With("component", "backlog"),
			failed: func() { g.m.redisErrors.WithLabelValues("backlog").Inc() }}
	}
	return nil
}

// buildFronts builds the Responses and Messages APIs over Do.
func (g *Gateway) buildFronts(Options) error {
	var err error
	if g.responses, err = g.newResponses(); err != nil {
		return fmt.Errorf("config: responses: %w", err)
	}
	if g.messages, err = g.newMessages(); err != nil {
		return fmt.Errorf("config: messages: %w", err)
	}
	return nil
}

// buildServers binds the listeners (so Addr is known before Run), starts
// tracing's exporter and builds the HTTP servers.
func (g *Gateway) buildServers(o Options) error {
	cfg := &g.cfg
	var err error
	if g.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("config: listen: %w", err)
	}
	g.ln = limitClients(g.ln, cfg.Server.MaxConnsPerClient, g.m.connsRejected)
	if cfg.MetricsListen != "" {
		if g.metricsLn, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			return fmt.Errorf("config: metrics_listen: %w", err)
		}
		g.metricsSrv = &http.Server{Handler: promhttp.HandlerFor(g.reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
	}
	if g.trace, err = newTracing(cfg.Tracing, o); err != nil {
		return err
	}
	g.srv = &http.Server{
		Handler:           g.routes(),
		ReadHeaderTimeout: cfg.Server.HeaderTimeout,
		MaxHeaderBytes:    cfg.Server.MaxHeaderBytes,
		IdleTimeout:       cfg.Server.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
	}
	return nil
}

// MetricsAddr returns the address /metrics is served on.
func (g *Gateway) MetricsAddr() string {
	if g.metricsLn != nil {
		return g.metricsLn.Addr().String()
	}
	return g.Addr()
}

// fleetConfig is the fleet's configuration: the replica and discovery
// specs as decoded, the health: block as it is, and the fleet's
// dependencies.
func (c *Config) fleetConfig(o Options, log *slog.Logger, reg prometheus.Registerer) fleet.Config {
	var header http.Header
	if o.UpstreamAPIKey != "" {
		header = http.Header{"Authorization": {"Bearer " + o.UpstreamAPIKey}}
	}
	return fleet.Config{
		Replicas:   c.Replicas,
		Discovery:  c.Discovery,
		Health:     c.Health,
		Saturation: c.Routing.Saturation,
		Header:     header,
		Logger:     log.With("component", "fleet"),
		Registerer: reg,
		Resolver:   o.Resolver,
	}
}

// Client returns a client for the configured Redis: one server (url, or
// one addr), Sentinel (addrs of the sentinels and master_name) or Cluster
// (several addrs, or cluster: true). The caller closes it.
func (rc RedisConfig) Client() (redis.UniversalClient, error) {
	if rc.URL != "" {
		opt, err := redis.ParseURL(rc.URL)
		if err != nil {
			return nil, fmt.Errorf("config: redis.url: %w", err)
		}
		return redis.NewClient(opt), nil
	}
	uo := &redis.UniversalOptions{
		Addrs:         rc.Addrs,
		MasterName:    rc.MasterName,
		Username:      rc.Username,
		Password:      rc.Password,
		DB:            rc.DB,
		IsClusterMode: rc.Cluster,
	}
	if rc.MasterName == "" && (len(rc.Addrs) > 1 || rc.Cluster) {
		// go-redis reloads a cluster's slot map on MOVED but not when a
		// dead master refuses the dial; its default of a minute between
		// reloads would outlast a failover by far.
		co := uo.Cluster()
		co.ClusterStateReloadInterval = clusterStateReload
		return redis.NewClusterClient(co), nil
	}
	return redis.NewUniversalClient(uo), nil
}

// clusterStateReload is how often a cluster client reloads the slot map
// while it is in use: how long after a failover a gateway keeps dialling
// the dead master (CLUSTER SLOTS, one small reply, a second per gateway).
const clusterStateReload = time.Second

// Addr returns the address the gateway listens on.
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// Handler returns the gateway's HTTP handler (for tests that serve it
// themselves).
func (g *Gateway) Handler() http.Handler { return g.srv.Handler }

// Policy returns the name of the routing policy in force.
func (g *Gateway) Policy() string { return g.router.Policy().Name }

// Registry returns the registry behind /metrics.
func (g *Gateway) Registry() *prometheus.Registry { return g.reg }

func (g *Gateway) close() {
	if g.metricsLn != nil {
		g.metricsLn.Close()
	}
	if g.upstream != nil {
		g.upstream.CloseIdleConnections()
	}
	if g.ownsRedis && g.rdb != nil {
		g.rdb.Close()
	}
	g.trace.shutdown(g.log)
}

// WaitReady blocks until at least one replica is healthy, or ctx ends.
func (g *Gateway) WaitReady(ctx context.Context) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		for _, r := range g.fleet.Snapshot().Replicas {
			if r.State().Healthy {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
