package fleet

import (
	"context"
	"errors"
	"fmt"
	"github.com/warmpath/warmpath/internal/confcheck"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/scoring"
)

// Defaults applied by [New] to zero-valued [Config] and [DNSSpec] fields
// (the saturation thresholds' are [scoring.Saturation]'s).
const (
	DefaultHealthInterval    = time.Second            // HealthConfig.Interval
	DefaultHealthTimeout     = time.Second            // HealthConfig.Timeout
	DefaultFailureThreshold  = 3                      // HealthConfig.Failures
	DefaultRecoveryThreshold = 2                      // Config.RecoveryThreshold
	DefaultScrapeInterval    = 250 * time.Millisecond // HealthConfig.ScrapeInterval
	DefaultStaleAfter        = time.Second            // HealthConfig.StaleAfter (and Config.ScrapeTimeout)
	DefaultModelsInterval    = 30 * time.Second       // Config.ModelsInterval
	DefaultDNSInterval       = 10 * time.Second       // DNSSpec.Interval
)

// maxDNSTimeout bounds one DNS lookup; shorter intervals bound it further.
const maxDNSTimeout = 5 * time.Second

// ReplicaSpec says where one vLLM replica is and what it serves. Two specs
// are equal (==) exactly when they describe the same member.
type ReplicaSpec struct {
	// Name is the replica's unique ID, used in metrics, routing decisions,
	// session bindings and KV-event topics. Default: host:port of URL
	// (the scheme's default port when URL has none).
	Name string `yaml:"name"`
	// URL is the replica's HTTP base URL without /v1, for example
	// http://10.0.0.7:8000. The scheme must be http or https. A path prefix
	// (a replica behind a path-routing proxy) is kept; a trailing slash is
	// dropped.
	URL string `yaml:"url"`
	// Model is the model the replica serves. Empty means discover the
	// served models from GET /v1/models (see [State.Models]).
	Model string `yaml:"model"`
	// KVEndpoint is the ZMQ endpoint of the replica's KV-event PUB socket to
	// connect a SUB to, for example tcp://10.0.0.7:5557. Empty means the
	// replica publishes no KV events (or publishes to a bound gateway SUB).
	KVEndpoint string `yaml:"kv_events"`
	// ReplayEndpoint is the ZMQ endpoint of the replica's KV-event replay
	// ROUTER, for example tcp://10.0.0.7:5558. Empty means none.
	ReplayEndpoint string `yaml:"kv_replay"`
	// DataParallelSize is the number of data-parallel ranks behind URL.
	// Each rank has its own KV cache and publishes on KVEndpoint's port +
	// rank (replay likewise); see [ReplicaSpec.KVSources]. 0 or 1 means a
	// single rank.
	DataParallelSize int `yaml:"data_parallel_size"`
	// KVTopic is how the replica's engine names itself in its KV-event
	// topic, for the central topology: the whole topic
	// (kv@10.0.0.7:8000@qwen3-32b) or its replica part (10.0.0.7:8000).
	// Set it when the engine names its pod IP while Name or URL use a DNS
	// name. Empty means the topic names the replica by Name or by URL's
	// host:port.
	KVTopic string `yaml:"kv_topic"`
}

// KVSource is one KV-event publisher of a replica: one data-parallel rank.
type KVSource struct {
	// Rank is the data-parallel rank, 0 for single-rank replicas.
	Rank int
	// Endpoint is the PUB endpoint to connect a SUB socket to.
	Endpoint string
	// ReplayEndpoint is the rank's replay ROUTER endpoint, "" when none.
	ReplayEndpoint string
}

// KVSources returns one [KVSource] per data-parallel rank, with the ports
// offset by the rank as vLLM does (tcp endpoints get port + rank, inproc
// endpoints the suffix _dp<rank>). It returns nil when KVEndpoint is empty.
// The gateway starts one KV-event subscriber per source.
func (s ReplicaSpec) KVSources() []KVSource {
	if s.KVEndpoint == "" {
		return nil
	}
	n := max(s.DataParallelSize, 1)
	out := make([]KVSource, n)
	for rank := range n {
		out[rank] = KVSource{
			Rank:           rank,
			Endpoint:       offsetEndpoint(s.KVEndpoint, rank),
			ReplayEndpoint: offsetEndpoint(s.ReplayEndpoint, rank),
		}
	}
	return out
}

// offsetEndpoint mirrors vLLM's offset_endpoint_port for validated
// endpoints.
func offsetEndpoint(ep string, rank int) string {
	if ep == "" || rank == 0 {
		return ep
	}
	if strings.HasPrefix(ep, "inproc://") {
		return ep + "_dp" + strconv.Itoa(rank)
	}
	i := strings.LastIndexByte(ep, ':')
	port, err := strconv.Atoi(ep[i+1:])
	if i < 0 || err != nil {
		return ep
	}
	return ep[:i+1] + strconv.Itoa(port+rank)
}

// DNSSpec describes replicas found by resolving a DNS name, typically a
// Kubernetes headless Service: every address the name resolves to becomes
// one replica named ip:Port with URL Scheme://ip:Port, KV endpoint
// tcp://ip:KVPort and replay endpoint tcp://ip:ReplayPort.
type DNSSpec struct {
	// Name is the host name to resolve (no scheme, no port).
	Name string `yaml:"dns"`
	// Port is the replicas' HTTP port, 1..65535.
	Port int `yaml:"port"`
	// Scheme is http or https. Default: http.
	Scheme string `yaml:"scheme"`
	// KVPort is the replicas' KV-event PUB port; 0 means none.
	KVPort int `yaml:"kv_port"`
	// ReplayPort is the replicas' KV-event replay ROUTER port; 0 means none.
	ReplayPort int `yaml:"replay_port"`
	// Model is the served model; empty means discover it per replica.
	Model string `yaml:"model"`
	// DataParallelSize is copied to each replica's spec; see
	// [ReplicaSpec.DataParallelSize].
	DataParallelSize int `yaml:"data_parallel_size"`
	// Interval is how often the name is re-resolved. Default: 10s.
	Interval time.Duration `yaml:"interval"`
}

// HealthConfig tunes the active health checks and the metrics scrapes
// (health: in the gateway's configuration file). Zero fields take the
// defaults ([HealthConfig.WithDefaults]); negative ones are errors.
type HealthConfig struct {
	// Interval is the period of active GET /health checks; default 1s.
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one health check, and one GET /v1/models; default
	// 1s.
	Timeout time.Duration `yaml:"timeout"`
	// Failures is the number of consecutive failures, active or passive,
	// after which a healthy replica becomes unhealthy; default 3.
	Failures int `yaml:"failures"`
	// ScrapeInterval is the period of GET /metrics scrapes; default
	// 250ms.
	ScrapeInterval time.Duration `yaml:"scrape_interval"`
	// StaleAfter is the age beyond which a replica's metrics are stale
	// (stale metrics make it count as saturated), and the bound of one
	// scrape; default 1s.
	StaleAfter time.Duration `yaml:"stale_after"`
}

// WithDefaults returns h with every zero field at its default.
func (h HealthConfig) WithDefaults() HealthConfig {
	for _, d := range []struct {
		p   *time.Duration
		def time.Duration
	}{{&h.Interval, DefaultHealthInterval}, {&h.Timeout, DefaultHealthTimeout}, {&h.ScrapeInterval, DefaultScrapeInterval}, {&h.StaleAfter, DefaultStaleAfter}} {
		if *d.p == 0 {
			*d.p = d.def
		}
	}
	if h.Failures == 0 {
		h.Failures = DefaultFailureThreshold
	}
	return h
}

// Validate checks h; its errors name the field by its yaml path
// (health.interval, …).
func (h HealthConfig) Validate() []error {
	errs := confcheck.NonNegative("health", confcheck.Field("interval", h.Interval), confcheck.Field("timeout", h.Timeout),
		confcheck.Field("scrape_interval", h.ScrapeInterval), confcheck.Field("stale_after", h.StaleAfter))
	if h.Failures < 0 {
		errs = append(errs, fmt.Errorf("config: health.failures: %d is negative", h.Failures))
	}
	return errs
}

// Resolver resolves host names; *net.Resolver satisfies it.
type Resolver interface {
	// LookupHost returns the addresses of host.
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// Config configures a [Fleet]. The zero value is not valid: set at least one
// of Replicas or Discovery. Zero durations and thresholds take the documented
// defaults; negative ones are errors.
type Config struct {
	// Replicas lists fixed replicas.
	Replicas []ReplicaSpec
	// Discovery lists names whose addresses are replicas, re-resolved
	// periodically. A DNS-found replica whose name equals a configured
	// replica's (or an earlier DNS spec's) is skipped.
	Discovery []DNSSpec

	// Health tunes the active checks and the metrics scrapes; zero
	// fields take its defaults (see [HealthConfig]).
	Health HealthConfig
	// RecoveryThreshold is the number of consecutive successful active
	// checks after which an unhealthy replica becomes healthy again.
	// Default: 2. A replica that has never been healthy becomes healthy on
	// its first successful check.
	RecoveryThreshold int
	// ScrapeTimeout bounds one scrape. Default: Health.StaleAfter.
	ScrapeTimeout time.Duration
	// ModelsInterval is how often replicas without a configured Model are
	// asked GET /v1/models (also on becoming healthy). Default: 30s.
	ModelsInterval time.Duration
	// Saturation holds the saturation thresholds; zero fields take
	// scoring's defaults (see [scoring.Saturation]).
	Saturation scoring.Saturation

	// Client sends health checks, scrapes and model discovery. Nil means a
	// client owned by the fleet with dial and header timeouts, whose idle
	// connections Run closes on return.
	Client *http.Client
	// Header is added to every request the fleet sends, for example an
	// Authorization header when vLLM runs with --api-key (which guards
	// /v1/models). Nil means none.
	Header http.Header
	// Resolver resolves DNS names. Nil means net.DefaultResolver.
	Resolver Resolver
	// Now returns the current time for timestamps in [State]. Nil means
	// time.Now. Timers always use the runtime's clock.
	Now func() time.Time
	// Logger receives membership changes, health transitions and errors.
	// Nil means discard.
	Logger *slog.Logger
	// Registerer receives the fleet's Prometheus metrics. Nil means no
	// metrics. Never the global registry unless the caller passes it.
	Registerer prometheus.Registerer
	// OnUpdate, when set, is called after each successful scrape of a
	// replica and when a replica becomes healthy, on that replica's
	// goroutine (the gateway's admission queue re-checks capacity then).
	// It must be fast and must not block. Nil means none.
	OnUpdate func(*Replica)
}

// Check validates c as [New] does, without building anything. Its errors
// name the offending field (replicas[i].url, discovery[i].port, …).
func (c Config) Check() error {
	_, err := c.normalize()
	return err
}

// normalize validates c and returns a copy with defaults filled in, static
// specs normalized (Name and URL) and DNS specs defaulted.
func (c Config) normalize() (Config, error) {
	if len(c.Replicas) == 0 && len(c.Discovery) == 0 {
		return c, errors.New("fleet: config: no replicas: set replicas or discovery")
	}
	durations := []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{
		{"healthInterval", &c.Health.Interval, DefaultHealthInterval},
		{"healthTimeout", &c.Health.Timeout, DefaultHealthTimeout},
		{"scrapeInterval", &c.Health.ScrapeInterval, DefaultScrapeInterval},
		{"staleAfter", &c.Health.StaleAfter, DefaultStaleAfter},
		{"modelsInterval", &c.ModelsInterval, DefaultModelsInterval},
		{"scrapeTimeout", &c.ScrapeTimeout, 0}, // defaulted below
	}
	for _, d := range durations {
		if *d.d < 0 {
			return c, fmt.Errorf("fleet: %s: negative duration %v", d.name, *d.d)
		}
		if *d.d == 0 {
			*d.d = d.def
		}
	}
	if c.ScrapeTimeout == 0 {
		c.ScrapeTimeout = c.Health.StaleAfter
	}
	ints := []struct {
		name string
		v    *int
		def  int
	}{
		{"failureThreshold", &c.Health.Failures, DefaultFailureThreshold},
		{"recoveryThreshold", &c.RecoveryThreshold, DefaultRecoveryThreshold},
	}
	for _, i := range ints {
		if *i.v < 0 {
			return c, fmt.Errorf("fleet: %s: negative value %d", i.name, *i.v)
		}
		if *i.v == 0 {
			*i.v = i.def
		}
	}
	c.Saturation = c.Saturation.WithDefaults()

	static := make([]ReplicaSpec, len(c.Replicas))
	seen := make(map[string]int, len(c.Replicas))
	for i, rs := range c.Replicas {
		ns, err := CheckReplica(rs)
		if err != nil {
			return c, fmt.Errorf("fleet: replicas[%d].%w", i, err)
		}
		if j, dup := seen[ns.Name]; dup {
			return c, fmt.Errorf("fleet: replicas[%d].name: duplicate %q (also replicas[%d])", i, ns.Name, j)
		}
		seen[ns.Name] = i
		static[i] = ns
	}
	c.Replicas = static

	dns := make([]DNSSpec, len(c.Discovery))
	for i, d := range c.Discovery {
		nd, err := CheckDNS(d)
		if err != nil {
			var errs []error
			for _, e := range Each(err) {
				errs = append(errs, fmt.Errorf("fleet: discovery[%d].%w", i, e))
			}
			return c, errors.Join(errs...)
		}
		dns[i] = nd
	}
	c.Discovery = dns
	return c, nil
}

// CheckReplica validates a replica spec and returns it normalized (Name
// and URL defaulted and cleaned), as [New] does. Its errors start with the
// YAML field name so callers can prefix where the spec came from.
func CheckReplica(s ReplicaSpec) (ReplicaSpec, error) {
	u, err := url.Parse(s.URL)
	if err != nil {
		return s, fmt.Errorf("url: %q is not an http(s) URL with a host", s.URL)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return s, fmt.Errorf("url: %q: scheme must be http or https", s.URL)
	}
	if u.Hostname() == "" {
		return s, fmt.Errorf("url: %q: missing host", s.URL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return s, fmt.Errorf("url: %q: must not have a query or fragment", s.URL)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	if strings.HasSuffix(u.Path, "/v1") {
		return s, fmt.Errorf("url: %q: give the base URL without /v1", s.URL)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	} else if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return s, fmt.Errorf("url: %q: port out of range", s.URL)
	}
	s.URL = u.String()
	if s.Name == "" {
		s.Name = net.JoinHostPort(u.Hostname(), port)
	}
	if strings.ContainsFunc(s.Name, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return s, fmt.Errorf("name: %q: must not contain spaces or control characters", s.Name)
	}
	if strings.ContainsFunc(s.KVTopic, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return s, fmt.Errorf("kv_topic: %q: must not contain spaces or control characters", s.KVTopic)
	}
	if s.DataParallelSize < 0 {
		return s, fmt.Errorf("data_parallel_size: negative value %d", s.DataParallelSize)
	}
	if err := validateZMQ(s.KVEndpoint, s.DataParallelSize); err != nil {
		return s, fmt.Errorf("kv_events: %w", err)
	}
	if err := validateZMQ(s.ReplayEndpoint, s.DataParallelSize); err != nil {
		return s, fmt.Errorf("kv_replay: %w", err)
	}
	// A replay endpoint without a KV endpoint is the central topology: the
	// engine's PUB connects to the gateway, its replay ROUTER still binds.
	if kh, kp, ok := tcpHostPort(s.KVEndpoint); ok {
		if rh, rp, ok := tcpHostPort(s.ReplayEndpoint); ok && kh == rh && portsOverlap(kp, rp, s.DataParallelSize) {
			return s, fmt.Errorf("kv_replay: %q overlaps the KV endpoints of %d data-parallel ranks", s.ReplayEndpoint, max(s.DataParallelSize, 1))
		}
	}
	return s, nil
}

// validateZMQ checks a ZMQ endpoint the gateway will connect to.
func validateZMQ(ep string, dp int) error {
	if ep == "" {
		return nil
	}
	scheme, addr, ok := strings.Cut(ep, "://")
	if !ok || addr == "" {
		return fmt.Errorf("%q: want tcp://host:port, ipc://path or inproc://name", ep)
	}
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return fmt.Errorf("%q: %w", ep, err)
		}
		if host == "" || host == "*" {
			return fmt.Errorf("%q: need a host to connect to, not a bind address", ep)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p+max(dp-1, 0) > 65535 {
			return fmt.Errorf("%q: port out of range", ep)
		}
	case "inproc":
	case "ipc":
		if dp > 1 {
			return fmt.Errorf("%q: vLLM cannot offset ipc endpoints per data-parallel rank", ep)
		}
	default:
		return fmt.Errorf("%q: unsupported scheme %q", ep, scheme)
	}
	return nil
}

// tcpHostPort splits a validated tcp:// endpoint.
func tcpHostPort(ep string) (string, int, bool) {
	addr, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", 0, false
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, false
	}
	p, err := strconv.Atoi(port)
	return host, p, err == nil
}

// portsOverlap reports whether the replay ports replay..replay+dp-1 collide
// with the KV ports kv..kv+dp-1 (vLLM offsets both by the rank).
func portsOverlap(kv, replay, dp int) bool {
	n := max(dp, 1)
	return replay < kv+n && kv < replay+n
}

// Each splits an error that joins several (errors.Join) into them, and
// returns any other error alone.
func Each(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// CheckDNS validates a DNS spec and returns it with its defaults filled
// in, as [New] does. Its errors start with the YAML field name.
func CheckDNS(d DNSSpec) (DNSSpec, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch {
	case d.Name == "":
		bad("dns: empty")
	case strings.ContainsAny(d.Name, ":/ "):
		bad("dns: %q: want a bare host name (no scheme or port)", d.Name)
	}
	if d.Port < 1 || d.Port > 65535 {
		bad("port: %d out of range 1..65535", d.Port)
	}
	span := max(d.DataParallelSize-1, 0)
	switch {
	case d.DataParallelSize < 0:
		bad("data_parallel_size: negative value %d", d.DataParallelSize)
	case d.KVPort < 0 || d.KVPort+span > 65535:
		bad("kv_port: %d out of range 0..65535", d.KVPort)
	case d.ReplayPort < 0 || d.ReplayPort+span > 65535:
		bad("replay_port: %d out of range 0..65535", d.ReplayPort)
	case d.ReplayPort != 0 && d.KVPort != 0 && portsOverlap(d.KVPort, d.ReplayPort, d.DataParallelSize):
		// A replay port without a KV port is the central topology (engines
		// connect to the gateway's bound SUB; replay still binds per pod).
		bad("replay_port: %d overlaps the KV ports %d..%d of %d data-parallel ranks",
			d.ReplayPort, d.KVPort, d.KVPort+span, max(d.DataParallelSize, 1))
	}
	switch d.Scheme {
	case "":
		d.Scheme = "http"
	case "http", "https":
	default:
		bad("scheme: %q: must be http or https", d.Scheme)
	}
	if d.Interval < 0 {
		bad("interval: negative duration %v", d.Interval)
	}
	if d.Interval == 0 {
		d.Interval = DefaultDNSInterval
	}
	return d, errors.Join(errs...)
}

// specFor returns the replica spec for one resolved address of d.
func (d DNSSpec) specFor(ip string) ReplicaSpec {
	hp := net.JoinHostPort(ip, strconv.Itoa(d.Port))
	s := ReplicaSpec{
		Name:             hp,
		URL:              d.Scheme + "://" + hp,
		Model:            d.Model,
		DataParallelSize: d.DataParallelSize,
	}
	if d.KVPort != 0 {
		s.KVEndpoint = "tcp://" + net.JoinHostPort(ip, strconv.Itoa(d.KVPort))
	}
	if d.ReplayPort != 0 {
		s.ReplayEndpoint = "tcp://" + net.JoinHostPort(ip, strconv.Itoa(d.ReplayPort))
	}
	return s
}
