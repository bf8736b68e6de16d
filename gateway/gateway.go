package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/proxy"
	"github.com/warmpath/warmpath/gateway/routing"
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
	cfg     Config
	log     *slog.Logger
	fleet   *fleet.Fleet
	router  *routing.Router // the routing stage: policy, indexes, tokenizer, session bindings
	tenants *tenants
	miss    *missTracker     // miss attribution and prefix-break diagnostics (misses.go)
	adm     *admitter        // admission: the fair queue, the backlog of waiting requests
	store   *store           // Redis (nil client: in process memory only) and its breaker
	fronts  fronts           // the Responses and Messages APIs over Do
	obs     *observability   // metrics, traces, the status page, the recording
	edge    *edge            // the HTTP servers and the drain
	fwd     *proxy.Forwarder // the forwarding stage: the upstream transport, attempts and retries
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
	g := &Gateway{cfg: cfg, log: log, obs: newObservability(cfg.Routing.Policy, o, log)}
	g.edge, g.adm = newEdge(cfg.Server, log), newAdmitter()
	for _, build := range []func(Options) error{g.buildTracing, g.buildStores, g.buildFleet, g.buildAdmission, g.buildRouting, g.buildFronts, g.buildServers} {
		if err := build(o); err != nil {
			g.close()
			return nil, err
		}
	}
	g.miss = newMissTracker(cfg.Routing.BlockSize, g.obs.wrapped, log, g.fleet, g.tenants.usage)
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
	if g.store, err = newStore(cfg.Redis, o.Redis, log, g.obs.wrapped); err != nil {
		return err
	}
	if g.tenants, err = newTenants(cfg, g.store.rdb, log); err != nil {
		return err
	}
	if g.obs.rec, err = newRecorder(cfg.Record, g.tenants.cfg.SaltSecret, log, g.obs.wrapped); err != nil {
		return err
	}
	return nil
}

// buildTracing starts tracing's exporter (when tracing is on).
func (g *Gateway) buildTracing(o Options) error {
	var err error
	g.obs.trace, err = newTracing(g.cfg.Tracing, o)
	return err
}

// buildFleet builds the fleet and the forwarding stage over it.
func (g *Gateway) buildFleet(o Options) error {
	cfg := &g.cfg
	var err error
	fc := cfg.fleetConfig(o, g.log, g.obs.wrapped)
	fc.OnUpdate = g.adm.replicaUpdated
	if g.fleet, err = fleet.New(fc); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	var tr proxy.Tracer
	if g.obs.trace.on() {
		tr = &g.obs.trace
	}
	g.fwd = proxy.New(cfg.Upstream, proxy.Deps{APIKey: o.UpstreamAPIKey, Drain: g.edge.drainCtx, Tracer: tr,
		UpstreamErrors: g.obs.m.upstreamErrors, Retries: g.obs.m.retries})
	return nil
}

// buildRouting builds the routing stage over the fleet and admission's
// judgment of room.
func (g *Gateway) buildRouting(Options) error {
	cfg := &g.cfg
	_, single := g.store.rdb.(*redis.Client)
	var err error
	g.router, err = routing.New(cfg.Routing, routing.Deps{Fleet: g.fleet, Capacity: g.adm.capacity(), Backlog: &g.adm.waiting,
		Redis: g.store.rdb, KeyPrefix: cfg.Redis.KeyPrefix, RedisTimeout: cfg.Redis.Timeout,
		Tracking: single && cfg.Redis.Tracking == "on" && cfg.Redis.MasterName == "",
		Tokenize: &http.Client{Transport: g.fwd.Transport(), Timeout: cfg.Upstream.TokenizeTimeout}, RedisErrors: g.obs.m.redisErrors,
		Decided: g.decided, TokenizeFailed: g.obs.tokenizeFailed, Logger: g.log, Registerer: g.obs.wrapped})
	return err
}

// buildAdmission builds the fair queue (unless queue.disabled) and, with
// Redis, the backlog exchange with the other gateways.
func (g *Gateway) buildAdmission(Options) error {
	return g.adm.build(&g.cfg, g.fleet, g.store.rdb, g.tenants.labels, g.obs.wrapped, g.obs.m.redisErrors, g.log)
}

// buildFronts builds the Responses and Messages APIs over Do.
func (g *Gateway) buildFronts(Options) error {
	var err error
	if g.fronts.responses, err = g.newResponses(); err != nil {
		return fmt.Errorf("config: responses: %w", err)
	}
	if g.fronts.messages, err = g.newMessages(); err != nil {
		return fmt.Errorf("config: messages: %w", err)
	}
	return nil
}

// buildServers binds the listeners (so Addr is known before Run) and
// builds the HTTP servers.
func (g *Gateway) buildServers(Options) error {
	if err := g.edge.listen(g.cfg.Listen, g.cfg.MetricsListen, g.obs.m.connsRejected, g.obs.reg); err != nil {
		return err
	}
	g.edge.handle(g.routes())
	return nil
}

// MetricsAddr returns the address /metrics is served on.
func (g *Gateway) MetricsAddr() string { return g.edge.metricsAddr() }

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
func (g *Gateway) Addr() string { return g.edge.addr() }

// Handler returns the gateway's HTTP handler (for tests that serve it
// themselves).
func (g *Gateway) Handler() http.Handler { return g.edge.srv.Handler }

// Policy returns the name of the routing policy in force.
func (g *Gateway) Policy() string { return g.router.Policy().Name }

// Registry returns the registry behind /metrics.
func (g *Gateway) Registry() *prometheus.Registry { return g.obs.reg }

func (g *Gateway) close() {
	g.edge.close()
	if g.fwd != nil {
		g.fwd.Close()
	}
	if g.store != nil {
		g.store.close()
	}
	g.obs.close()
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
