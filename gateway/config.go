package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/warmpath/warmpath/gateway/admission"
	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/proxy"
	"github.com/warmpath/warmpath/gateway/routing"
	"github.com/warmpath/warmpath/record"
	"github.com/warmpath/warmpath/responses"
	"github.com/warmpath/warmpath/tenancy"
)

// Config is the gateway's configuration. Build it with LoadConfig (YAML
// file, then environment), or as a literal in tests; New fills defaults and
// validates it. The zero value runs the embedded development setup: an
// in-process Redis-compatible store and a simulated fleet of four replicas.
type Config struct {
	// Listen is the HTTP listen address; default "127.0.0.1:8080".
	Listen string `yaml:"listen"`
	// MetricsListen, when set, serves /metrics on its own address (and
	// not on Listen), so it can stay inside the cluster network.
	MetricsListen string `yaml:"metrics_listen"`
	// Redis is where session bindings live; empty means an embedded,
	// in-process store (development only: it dies with the process).
	Redis RedisConfig `yaml:"redis"`
	// Replicas is the static list of vLLM replicas (see fleet.ReplicaSpec
	// for each field and its default).
	Replicas []fleet.ReplicaSpec `yaml:"replicas"`
	// Discovery lists DNS names re-resolved periodically, e.g. a
	// Kubernetes headless Service; each address becomes a replica (see
	// fleet.DNSSpec).
	Discovery []fleet.DNSSpec `yaml:"discovery"`
	// KVEvents chooses how the gateway receives vLLM KV-cache events.
	KVEvents KVEventsConfig `yaml:"kv_events"`
	// Routing chooses the policy and its knobs (see routing.Config).
	Routing routing.Config `yaml:"routing"`
	// Health configures active health checks and metrics scraping (see
	// fleet.HealthConfig).
	Health fleet.HealthConfig `yaml:"health"`
	// Server bounds what clients can hold of the HTTP server, and how it
	// drains on SIGTERM.
	Server ServerConfig `yaml:"server"`
	// Upstream bounds every call to a replica.
	Upstream proxy.Config `yaml:"upstream"`
	// Queue configures the admission queue: per-tenant fair queues in
	// front of a saturated fleet (see admission.Config).
	Queue admission.Config `yaml:"queue"`
	// Responses tunes the Responses and Conversations API (see
	// responses.Config).
	Responses responses.Config `yaml:"responses"`
	// MaxBodyBytes bounds request bodies; default 32 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// Debug adds response headers naming the chosen replica and its score
	// breakdown.
	Debug bool `yaml:"debug"`
	// Auth configures tenants, API keys and JWTs (see tenancy.Config). A
	// configuration with replicas must set auth.mode (keys, jwt,
	// keys+jwt, or none to run open, which warns at every start).
	Auth tenancy.Config `yaml:"auth"`
	// DevKey, when set, is imported as the key of the "dev" tenant, and
	// implies auth.mode keys (with a per-process salt secret) when no mode
	// is set. The embedded development setup always sets one.
	DevKey string `yaml:"dev_key"`
	// Sim configures the embedded simulated fleet used when no replica and
	// no discovery is configured.
	Sim SimConfig `yaml:"sim"`
	// Tracing turns on OpenTelemetry tracing over OTLP; off by default
	// (see TracingConfig and tracing.go).
	Tracing TracingConfig `yaml:"tracing"`
	// Record writes each answered request as one JSON line for offline
	// replay (warmpath analyze); off unless record.dir is set (see
	// record.Config).
	Record record.Config `yaml:"record"`
}

// RedisConfig names a Redis deployment. Set URL for one server, Addrs with
// MasterName for Sentinel, or several Addrs for Cluster.
type RedisConfig struct {
	// URL is a redis:// or rediss:// URL.
	URL string `yaml:"url"`
	// Addrs are host:port seeds for Sentinel or Cluster.
	Addrs []string `yaml:"addrs"`
	// MasterName selects Sentinel mode.
	MasterName string `yaml:"master_name"`
	// Cluster selects Cluster mode with a single address (a managed
	// cluster's configuration endpoint); two or more addrs without
	// master_name select it anyway.
	Cluster bool `yaml:"cluster"`
	// Username and Password authenticate to Redis (ACL user, or the
	// password alone for requirepass); with Sentinel they are the data
	// nodes' credentials.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// DB selects the database of a single server or Sentinel's master;
	// a Cluster has only database 0.
	DB int `yaml:"db"`
	// KeyPrefix is prepended to every key warmpath writes; default "wp:".
	// It may not contain '{' or '}': on a Cluster the keys that change
	// together share a hash tag after the prefix, and a brace in the
	// prefix would become every key's tag (one slot for everything) or
	// split a tenant's keys.
	KeyPrefix string `yaml:"key_prefix"`
	// Timeout bounds each Redis call on the request path; default 250ms.
	// Past it the gateway routes without the session binding (counted in
	// warmpath_redis_errors_total) rather than wait.
	Timeout time.Duration `yaml:"timeout"`
	// Tracking is "on" (default) or "off": with a single Redis server
	// (url, or one addr without master_name) that supports client-side
	// caching (Redis 6 or later), the gateway subscribes to changes of
	// the session bindings (CLIENT TRACKING in broadcasting mode) and
	// answers a sticky turn's lookup from memory while no other gateway
	// has changed the binding, instead of a GET per turn. Sentinel,
	// Cluster and servers without tracking fall back to the GET. Set it
	// off when url reaches several servers through a proxy: notices come
	// only from the server the gateway subscribed on.
	Tracking string `yaml:"tracking"`
}

func (r RedisConfig) embedded() bool { return r.URL == "" && len(r.Addrs) == 0 }

// KV-event topologies.
const (
	TopologyPerReplica = "per-replica"
	TopologyCentral    = "central"
)

// KVEventsConfig chooses the KV-event topology.
type KVEventsConfig struct {
	// Topology is "per-replica" (default: connect one SUB to each
	// replica's kv_events endpoint) or "central" (one SUB that engines'
	// PUB sockets reach, naming themselves in the topic).
	Topology string `yaml:"topology"`
	// Bind is the address the central topology's SUB binds, for engines
	// to connect to; default tcp://*:5557 unless Connect is set. With
	// data-parallel engines it binds one port per rank (Bind's port +
	// rank, up to the largest data_parallel_size), as each rank dials
	// its endpoint's port + rank.
	Bind string `yaml:"bind"`
	// Connect, instead of Bind, makes the central topology's SUB connect
	// to a `warmpath kv-relay`'s publish address: the relay binds the
	// address engines dial, and any number of gateways connect to it.
	// Set at most one of Bind and Connect.
	Connect string `yaml:"connect"`
}

// routing.tokenizer's values (see package routing).
const (
	TokenizerReplicas  = routing.TokenizerReplicas
	TokenizerSimulator = routing.TokenizerSimulator
	TokenizerHF        = routing.TokenizerHF
)

// SimConfig configures the embedded simulated fleet (package vllmsim,
// which the gateway does not import: warmpath serve builds the fleet).
type SimConfig struct {
	Replicas int     `yaml:"replicas"`  // default 4
	Speed    float64 `yaml:"speed"`     // default 1
	KVBlocks int     `yaml:"kv_blocks"` // each replica's KV cache in 16-token blocks; default the simulator's (19,208)
	Model    string  `yaml:"model"`     // default qwen3-32b
}

// WithDefaults returns s with every zero field but KVBlocks (which the
// simulator fills) at its default.
func (s SimConfig) WithDefaults() SimConfig {
	if s.Replicas == 0 {
		s.Replicas = 4
	}
	if s.Speed == 0 {
		s.Speed = 1
	}
	if s.Model == "" {
		s.Model = "qwen3-32b"
	}
	return s
}

// Embedded reports whether the configuration names no fleet, so New starts
// the simulated one.
func (c *Config) Embedded() bool { return len(c.Replicas) == 0 && len(c.Discovery) == 0 }

// LoadConfig reads the YAML file at path (skipped when path is "") and then
// applies environment overrides read through getenv (nil means none): see
// configenv.go and docs/reference/environment.md.
func LoadConfig(path string, getenv func(string) string) (Config, error) {
	var c Config
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return c, fmt.Errorf("config: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
			return c, fmt.Errorf("config %s: %w", path, err)
		}
	}
	if getenv == nil {
		return c, nil
	}
	return c, c.applyEnv(getenv)
}

// splitList splits a comma-separated list, trimming blanks and dropping
// empty entries.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// DefaultSessionTTL is how long a session binding outlives its turn
// (routing.DefaultSessionTTL).
const DefaultSessionTTL = routing.DefaultSessionTTL

// withDefaults returns c with every unset field at its default.
func (c Config) withDefaults() Config {
	def := func(p *time.Duration, d time.Duration) {
		if *p == 0 {
			*p = d
		}
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.Redis.KeyPrefix == "" {
		c.Redis.KeyPrefix = "wp:"
	}
	def(&c.Redis.Timeout, 250*time.Millisecond)
	if c.Redis.Tracking == "" {
		c.Redis.Tracking = "on"
	}
	if c.KVEvents.Topology == "" {
		c.KVEvents.Topology = TopologyPerReplica
	}
	if c.KVEvents.Topology == TopologyCentral && c.KVEvents.Bind == "" && c.KVEvents.Connect == "" {
		c.KVEvents.Bind = "tcp://*:5557"
	}
	c.Routing = c.Routing.WithDefaults()
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 32 << 20
	}
	c.Server.withDefaults()
	c.Upstream = c.Upstream.WithDefaults()
	c.Health = c.Health.WithDefaults()
	c.Queue = c.Queue.WithDefaults()
	c.Responses = c.Responses.WithDefaults()
	c.Record = c.Record.WithDefaults()
	c.Auth = c.Auth.WithDefaults()
	c.Sim = c.Sim.WithDefaults()
	return c
}

// validateFleet checks the replicas: and discovery: specs with the
// fleet's own checks (fleet.CheckSpecs), each error naming its spec's
// field.
func (c *Config) validateFleet() []error {
	var errs []error
	for _, err := range fleet.CheckSpecs(c.Replicas, c.Discovery) {
		errs = append(errs, fmt.Errorf("config: %w", err))
	}
	return errs
}

// kvRanks is the number of data-parallel ranks the central topology binds
// a port for: the largest data_parallel_size configured.
func (c *Config) kvRanks() int {
	n := 1
	for _, r := range c.Replicas {
		n = max(n, r.DataParallelSize)
	}
	for _, d := range c.Discovery {
		n = max(n, d.DataParallelSize)
	}
	return n
}

// validateKVEvents checks the KV-event topology and its addresses.
func (c *Config) validateKVEvents() []error {
	var errs []error
	k := &c.KVEvents
	switch k.Topology {
	case TopologyPerReplica:
		if k.Connect != "" {
			errs = append(errs, fmt.Errorf("config: kv_events.connect: only the %s topology connects to a relay", TopologyCentral))
		}
	case TopologyCentral:
		if k.Bind != "" && k.Connect != "" {
			errs = append(errs, errors.New("config: kv_events: set bind (engines connect to this gateway) or connect (to a kv-relay), not both"))
		}
		for _, f := range []struct{ field, ep string }{{"bind", k.Bind}, {"connect", k.Connect}} {
			if f.ep != "" && !strings.Contains(f.ep, "://") {
				errs = append(errs, fmt.Errorf("config: kv_events.%s: %q: want tcp://host:port, ipc://path or inproc://name", f.field, f.ep))
			}
		}
	default:
		errs = append(errs, fmt.Errorf("config: kv_events.topology: %q is not %s or %s", k.Topology, TopologyPerReplica, TopologyCentral))
	}
	return errs
}

// validate checks a defaulted configuration; errors name the field.
// validate checks the redis: block; errors name the field.
func (r *RedisConfig) validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("config: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	if r.URL != "" && len(r.Addrs) > 0 {
		bad("redis", "set url or addrs, not both")
	}
	if r.URL != "" {
		if u, err := url.Parse(r.URL); err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
			bad("redis.url", "%q is not a redis:// or rediss:// URL", r.URL)
		}
	}
	if strings.ContainsAny(r.KeyPrefix, "{}") {
		bad("redis.key_prefix", "%q contains a brace; hash tags are warmpath's own", r.KeyPrefix)
	}
	if r.Cluster && (len(r.Addrs) == 0 || r.MasterName != "") {
		bad("redis.cluster", "needs addrs and no master_name")
	}
	if t := r.Tracking; t != "on" && t != "off" {
		bad("redis.tracking", "%q is not %q (the default) or %q", t, "on", "off")
	}
	for i, a := range r.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			bad(fmt.Sprintf("redis.addrs[%d]", i), "%v", err)
		}
	}
	return errs
}

func (c *Config) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("config: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen", "%v", err)
	}
	if _, _, err := net.SplitHostPort(c.MetricsListen); c.MetricsListen != "" && err != nil {
		bad("metrics_listen", "%v", err)
	}
	errs = append(errs, c.Redis.validate()...)
	errs = append(errs, c.validateFleet()...)
	errs = append(errs, c.validateKVEvents()...)
	errs = append(errs, c.Routing.Validate()...)
	if c.DevKey != "" && (len(c.DevKey) < 8 || strings.ContainsFunc(c.DevKey, func(r rune) bool { return r <= ' ' || r > '~' })) {
		bad("dev_key", "must be 8 or more printable characters without spaces")
	}
	if strings.HasPrefix(c.DevKey, "wp-") {
		bad("dev_key", "a key of the wp- form cannot be imported: unset it to have one issued, or choose another form (such as sk-dev-…)")
	}
	if c.MaxBodyBytes < 1024 {
		bad("max_body_bytes", "%d is below 1024", c.MaxBodyBytes)
	}
	errs = append(errs, c.Upstream.Validate()...)
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"server.header_timeout", c.Server.HeaderTimeout}, {"server.body_timeout", c.Server.BodyTimeout},
		{"server.idle_timeout", c.Server.IdleTimeout}, {"server.drain_timeout", c.Server.DrainTimeout},
	} {
		if d.v < 0 {
			bad(d.field, "%v is negative", d.v)
		}
	}
	errs = append(errs, c.Health.Validate()...)
	errs = append(errs, c.Queue.Validate()...)
	errs = append(errs, c.Responses.Validate()...)
	errs = append(errs, c.Record.Validate()...)
	errs = append(errs, c.Tracing.validate()...)
	if c.Server.MaxHeaderBytes < 4096 {
		bad("server.max_header_bytes", "%d is below 4096", c.Server.MaxHeaderBytes)
	}
	if c.Embedded() {
		if c.Sim.Replicas < 1 || c.Sim.Replicas > 64 {
			bad("sim.replicas", "%d is not in [1, 64]", c.Sim.Replicas)
		}
		if c.Sim.Speed <= 0 {
			bad("sim.speed", "%v is not positive", c.Sim.Speed)
		}
	}
	return errors.Join(errs...)
}

// warnDeprecated warns about settings that are accepted and ignored.
func (c *Config) warnDeprecated(log *slog.Logger) {
	if c.Routing.ClaimMinTokens != 0 {
		log.Warn("config: routing.claim_min_tokens is ignored: prefix claims between gateways were removed (their benefit was inside run-to-run noise); remove the setting")
	}
}
