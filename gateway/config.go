package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/scoring"
)

// Config is the gateway's configuration. Build it with LoadConfig (YAML
// file, then environment), or as a literal in tests; New fills defaults and
// validates it. The zero value runs the embedded development setup: an
// in-process Redis-compatible store and a simulated fleet of four replicas.
type Config struct {
	// Listen is the HTTP listen address; default "127.0.0.1:8080".
	Listen string `yaml:"listen"`
	// Redis is where session bindings live; empty means an embedded,
	// in-process store (development only: it dies with the process).
	Redis RedisConfig `yaml:"redis"`
	// Replicas is the static list of vLLM replicas.
	Replicas []ReplicaConfig `yaml:"replicas"`
	// Discovery lists DNS names re-resolved periodically, e.g. a
	// Kubernetes headless Service; each address becomes a replica.
	Discovery []DiscoveryConfig `yaml:"discovery"`
	// KVEvents chooses how the gateway receives vLLM KV-cache events.
	KVEvents KVEventsConfig `yaml:"kv_events"`
	// Routing chooses the policy and its knobs.
	Routing RoutingConfig `yaml:"routing"`
	// Health configures active health checks and metrics scraping.
	Health HealthConfig `yaml:"health"`
	// MaxBodyBytes bounds request bodies; default 32 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// Debug adds response headers naming the chosen replica and its score
	// breakdown.
	Debug bool `yaml:"debug"`
	// DevKey, when set, is the API key every request must present as
	// "Authorization: Bearer <key>". Empty in production configuration
	// means requests are not authenticated (until tenancy lands); the
	// embedded development setup always sets one.
	DevKey string `yaml:"dev_key"`
	// Sim configures the embedded simulated fleet used when no replica and
	// no discovery is configured.
	Sim SimConfig `yaml:"sim"`
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
	Username   string `yaml:"username"`
	Password   string `yaml:"password"`
	DB         int    `yaml:"db"`
	// KeyPrefix is prepended to every key warmpath writes; default "wp:".
	KeyPrefix string `yaml:"key_prefix"`
	// Timeout bounds each Redis call on the request path; default 250ms.
	// Past it the gateway routes without the session binding (counted in
	// warmpath_redis_errors_total) rather than wait.
	Timeout time.Duration `yaml:"timeout"`
}

func (r RedisConfig) embedded() bool { return r.URL == "" && len(r.Addrs) == 0 }

// ReplicaConfig is one statically configured vLLM replica.
type ReplicaConfig struct {
	// Name identifies the replica; default host:port of URL. With the
	// central KV-event topology it must match the replica part of the
	// engine's topic kv@<name>@<model>.
	Name string `yaml:"name"`
	// URL is the replica's HTTP base URL, e.g. http://10.0.0.7:8000.
	URL string `yaml:"url"`
	// Model is the served model; empty means discover it from /v1/models.
	Model string `yaml:"model"`
	// KVEvents is the replica's KV-event PUB endpoint to connect to, e.g.
	// tcp://10.0.0.7:5557 (per-replica topology).
	KVEvents string `yaml:"kv_events"`
	// KVReplay is the replica's replay endpoint, e.g. tcp://10.0.0.7:5558.
	KVReplay string `yaml:"kv_replay"`
}

// DiscoveryConfig is a DNS name whose addresses are replicas.
type DiscoveryConfig struct {
	DNS    string `yaml:"dns"`
	Port   int    `yaml:"port"`
	Scheme string `yaml:"scheme"` // default http
	// KVPort and ReplayPort give each address's KV-event and replay
	// endpoints; 0 means none.
	KVPort     int           `yaml:"kv_port"`
	ReplayPort int           `yaml:"replay_port"`
	Model      string        `yaml:"model"`
	Interval   time.Duration `yaml:"interval"` // default 10s
}

// KV-event topologies.
const (
	TopologyPerReplica = "per-replica"
	TopologyCentral    = "central"
)

// KVEventsConfig chooses the KV-event topology.
type KVEventsConfig struct {
	// Topology is "per-replica" (default: connect one SUB to each
	// replica's kv_events endpoint) or "central" (bind one SUB at Bind;
	// engines connect and name themselves in the topic).
	Topology string `yaml:"topology"`
	// Bind is the central topology's endpoint; default tcp://*:5557.
	Bind string `yaml:"bind"`
}

// RoutingConfig chooses and tunes the routing policy.
type RoutingConfig struct {
	// Policy is one of round-robin, least-load, session-hash,
	// approx-prefix, precise-prefix, warmpath (default).
	Policy string `yaml:"policy"`
	// Weights overrides scorer weights by name: prefix, session, queue,
	// kv, inflight, prefill-cost.
	Weights map[string]float64 `yaml:"weights"`
	// BlockSize is the prefix index's block size in tokens; default 16.
	// It need not equal the engines' block size.
	BlockSize int `yaml:"block_size"`
	// SessionTTL is how long a session binding outlives its last turn;
	// default 30m.
	SessionTTL time.Duration `yaml:"session_ttl"`
	// SpeculativeTTL is how long a routing decision's predicted blocks
	// count as cached before the engine's events confirm them; default 2s,
	// negative disables speculative entries.
	SpeculativeTTL time.Duration `yaml:"speculative_ttl"`
	// MaxWaiting and MaxKVUsage mark a replica saturated: a sticky session
	// moves off it and affinity scores on it are zeroed (unless every
	// replica is saturated). Defaults DefaultMaxWaiting (32) and
	// DefaultMaxKVUsage (1.0, a completely full cache).
	MaxWaiting int     `yaml:"max_waiting"`
	MaxKVUsage float64 `yaml:"max_kv_usage"`
	// MaxInflightPrefillTokens marks a replica saturated when this gateway
	// has that many uncached prompt tokens in flight to it; default
	// DefaultMaxInflightPrefillTokens (262,144), negative disables.
	MaxInflightPrefillTokens int64 `yaml:"max_inflight_prefill_tokens"`
	// TokenizeCacheSize bounds the cache of tokenized prompts; default 4096.
	TokenizeCacheSize int `yaml:"tokenize_cache_size"`
	// IndexMaxEntries bounds the precise index in (block, replica)
	// entries; default 50,000,000.
	IndexMaxEntries int `yaml:"index_max_entries"`
	// ApproxChunkBytes is the approximate index's chunk size; default 256.
	ApproxChunkBytes int `yaml:"approx_chunk_bytes"`
}

// HealthConfig tunes active checks and metrics scraping.
type HealthConfig struct {
	Interval       time.Duration `yaml:"interval"`        // default 1s
	Timeout        time.Duration `yaml:"timeout"`         // default 1s
	Failures       int           `yaml:"failures"`        // default 3
	ScrapeInterval time.Duration `yaml:"scrape_interval"` // default 250ms
	StaleAfter     time.Duration `yaml:"stale_after"`     // default 1s
}

// SimConfig configures the embedded simulated fleet.
type SimConfig struct {
	Replicas int     `yaml:"replicas"` // default 4
	Speed    float64 `yaml:"speed"`    // default 1
	KVBlocks int     `yaml:"kv_blocks"`
	Model    string  `yaml:"model"` // default qwen3-32b
}

// Embedded reports whether the configuration names no fleet, so New starts
// the simulated one.
func (c *Config) Embedded() bool { return len(c.Replicas) == 0 && len(c.Discovery) == 0 }

// LoadConfig reads the YAML file at path (skipped when path is "") and then
// applies environment overrides read through getenv (nil means none). See
// the README for every variable.
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

func (c *Config) applyEnv(getenv func(string) string) error {
	str := func(name string, dst *string) {
		if v := getenv(name); v != "" {
			*dst = v
		}
	}
	str("WARMPATH_LISTEN", &c.Listen)
	str("WARMPATH_REDIS_URL", &c.Redis.URL)
	str("WARMPATH_REDIS_KEY_PREFIX", &c.Redis.KeyPrefix)
	str("WARMPATH_POLICY", &c.Routing.Policy)
	str("WARMPATH_KV_TOPOLOGY", &c.KVEvents.Topology)
	str("WARMPATH_KV_BIND", &c.KVEvents.Bind)
	str("WARMPATH_DEV_KEY", &c.DevKey)
	if v := getenv("WARMPATH_REDIS_ADDRS"); v != "" {
		c.Redis.Addrs = splitList(v)
	}
	str("WARMPATH_REDIS_MASTER", &c.Redis.MasterName)
	if v := getenv("WARMPATH_DEBUG"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("config: WARMPATH_DEBUG: %w", err)
		}
		c.Debug = b
	}
	// WARMPATH_REPLICAS: comma-separated entries, each
	// url[|kv_events[|kv_replay]], e.g.
	// http://10.0.0.7:8000|tcp://10.0.0.7:5557|tcp://10.0.0.7:5558
	if v := getenv("WARMPATH_REPLICAS"); v != "" {
		c.Replicas = nil
		for _, entry := range splitList(v) {
			f := strings.Split(entry, "|")
			r := ReplicaConfig{URL: f[0]}
			if len(f) > 1 {
				r.KVEvents = f[1]
			}
			if len(f) > 2 {
				r.KVReplay = f[2]
			}
			if len(f) > 3 {
				return fmt.Errorf("config: WARMPATH_REPLICAS: entry %q has more than 3 fields", entry)
			}
			c.Replicas = append(c.Replicas, r)
		}
	}
	if v := getenv("WARMPATH_SIM_REPLICAS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("config: WARMPATH_SIM_REPLICAS: %w", err)
		}
		c.Sim.Replicas = n
	}
	if v := getenv("WARMPATH_SIM_SPEED"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Errorf("config: WARMPATH_SIM_SPEED: %w", err)
		}
		c.Sim.Speed = f
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// Saturation defaults. A busy vLLM keeps its KV cache nearly full of running
// sequences and a short queue, so lower thresholds trip on every replica
// during a burst (bench, shared-prefix, tuned on seeds 2 and 3: p99 TTFT
// 35–41 s at 8 waiting and 0.95 KV use, about 1 s at these).
const (
	DefaultMaxWaiting = fleet.DefaultMaxWaiting
	DefaultMaxKVUsage = fleet.DefaultMaxKVUsage
	// DefaultMaxInflightPrefillTokens is about 17 s of prefill at 15,000
	// tokens/s.
	DefaultMaxInflightPrefillTokens = 262144
	// DefaultSessionTTL is how long a session binding outlives its turn.
	DefaultSessionTTL = 30 * time.Minute
)

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
	if c.KVEvents.Topology == "" {
		c.KVEvents.Topology = TopologyPerReplica
	}
	if c.KVEvents.Topology == TopologyCentral && c.KVEvents.Bind == "" {
		c.KVEvents.Bind = "tcp://*:5557"
	}
	r := &c.Routing
	if r.Policy == "" {
		r.Policy = scoring.PolicyWarmpath
	}
	if r.BlockSize == 0 {
		r.BlockSize = 16
	}
	def(&r.SessionTTL, DefaultSessionTTL)
	def(&r.SpeculativeTTL, 2*time.Second)
	if r.MaxWaiting == 0 {
		r.MaxWaiting = DefaultMaxWaiting
	}
	if r.MaxKVUsage == 0 {
		r.MaxKVUsage = DefaultMaxKVUsage
	}
	if r.MaxInflightPrefillTokens == 0 {
		r.MaxInflightPrefillTokens = DefaultMaxInflightPrefillTokens
	}
	if r.TokenizeCacheSize == 0 {
		r.TokenizeCacheSize = 4096
	}
	if r.IndexMaxEntries == 0 {
		r.IndexMaxEntries = 50_000_000
	}
	if r.ApproxChunkBytes == 0 {
		r.ApproxChunkBytes = 256
	}
	h := &c.Health
	def(&h.Interval, time.Second)
	def(&h.Timeout, time.Second)
	if h.Failures == 0 {
		h.Failures = 3
	}
	def(&h.ScrapeInterval, 250*time.Millisecond)
	def(&h.StaleAfter, time.Second)
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 32 << 20
	}
	for i := range c.Discovery {
		d := &c.Discovery[i]
		if d.Scheme == "" {
			d.Scheme = "http"
		}
		def(&d.Interval, 10*time.Second)
	}
	if c.Sim.Replicas == 0 {
		c.Sim.Replicas = 4
	}
	if c.Sim.Speed == 0 {
		c.Sim.Speed = 1
	}
	if c.Sim.Model == "" {
		c.Sim.Model = "qwen3-32b"
	}
	return c
}

// validate checks a defaulted configuration; errors name the field.
func (c *Config) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("config: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen", "%v", err)
	}
	if c.Redis.URL != "" && len(c.Redis.Addrs) > 0 {
		bad("redis", "set url or addrs, not both")
	}
	if c.Redis.URL != "" {
		if u, err := url.Parse(c.Redis.URL); err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
			bad("redis.url", "%q is not a redis:// or rediss:// URL", c.Redis.URL)
		}
	}
	for i, a := range c.Redis.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			bad(fmt.Sprintf("redis.addrs[%d]", i), "%v", err)
		}
	}
	names := map[string]bool{}
	for i, r := range c.Replicas {
		field := fmt.Sprintf("replicas[%d]", i)
		u, err := url.Parse(r.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad(field+".url", "%q is not an http(s) URL with a host", r.URL)
			continue
		}
		name := r.Name
		if name == "" {
			name = u.Host
		}
		if names[name] {
			bad(field+".name", "duplicate replica name %q", name)
		}
		names[name] = true
		for _, ep := range []struct{ f, v string }{{"kv_events", r.KVEvents}, {"kv_replay", r.KVReplay}} {
			if ep.v != "" && !strings.HasPrefix(ep.v, "tcp://") && !strings.HasPrefix(ep.v, "ipc://") {
				bad(field+"."+ep.f, "%q is not a tcp:// or ipc:// ZMQ endpoint", ep.v)
			}
		}
	}
	for i, d := range c.Discovery {
		field := fmt.Sprintf("discovery[%d]", i)
		if d.DNS == "" {
			bad(field+".dns", "required")
		}
		if d.Port <= 0 || d.Port > 65535 {
			bad(field+".port", "%d is not a port", d.Port)
		}
		if d.Scheme != "http" && d.Scheme != "https" {
			bad(field+".scheme", "%q is not http or https", d.Scheme)
		}
		if d.KVPort < 0 || d.KVPort > 65535 || d.ReplayPort < 0 || d.ReplayPort > 65535 {
			bad(field, "kv_port and replay_port must be ports or 0")
		}
	}
	switch c.KVEvents.Topology {
	case TopologyPerReplica, TopologyCentral:
	default:
		bad("kv_events.topology", "%q is not %s or %s", c.KVEvents.Topology, TopologyPerReplica, TopologyCentral)
	}
	if !slices.Contains(scoring.Policies(), c.Routing.Policy) {
		bad("routing.policy", "%q is not one of %s", c.Routing.Policy, strings.Join(scoring.Policies(), ", "))
	} else if _, err := scoring.NewPolicy(c.Routing.Policy, c.Routing.Weights); err != nil {
		bad("routing.weights", "%v", err)
	}
	if c.Routing.BlockSize < 1 || c.Routing.BlockSize > 4096 {
		bad("routing.block_size", "%d is not in [1, 4096]", c.Routing.BlockSize)
	}
	if c.Routing.MaxKVUsage <= 0 || c.Routing.MaxKVUsage > 1 {
		bad("routing.max_kv_usage", "%v is not in (0, 1]", c.Routing.MaxKVUsage)
	}
	if c.Routing.MaxWaiting < 0 {
		bad("routing.max_waiting", "%d is negative", c.Routing.MaxWaiting)
	}
	if c.MaxBodyBytes < 1024 {
		bad("max_body_bytes", "%d is below 1024", c.MaxBodyBytes)
	}
	if c.Health.Failures < 1 {
		bad("health.failures", "%d is below 1", c.Health.Failures)
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
