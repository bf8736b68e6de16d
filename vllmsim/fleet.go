package vllmsim

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	zmq "github.com/pebbe/zmq4"

	"github.com/warmpath/warmpath/kvevents"
)

// Config configures a simulated fleet. The zero value is valid: one replica
// of the default profile on ephemeral loopback ports.
type Config struct {
	// Replicas is the number of replicas; default 1.
	Replicas int
	// Host is the address every listener binds; default "127.0.0.1".
	Host string
	// HTTPPort: replica i serves http://Host:(HTTPPort+i); 0 picks
	// ephemeral ports.
	HTTPPort int
	// KVPort: replica i binds its KV-event PUB socket at tcp://*:(KVPort+i)
	// (all interfaces, as vLLM's default tcp://*:5557); 0 binds ephemeral
	// ports on Host. With DataParallelSize N, rank r of replica i binds
	// KVPort+i×N+r: each replica's ranks sit at its base port + rank, as
	// vLLM offsets them.
	KVPort int
	// KVConnect, when set, makes every replica's PUB socket connect to this
	// endpoint instead of binding one (llm-d's central topology: the router
	// binds one SUB and the engines name themselves in the topic); KVPort
	// is then unused and ReplicaInfo.KVEndpoint is empty. Rank r dials
	// KVConnect's port + r, as vLLM does for connecting endpoints, so the
	// subscriber must bind one port per rank.
	KVConnect string
	// ReplayPort: replica i binds its replay ROUTER at tcp://Host:(ReplayPort+i)
	// (rank r of N: ReplayPort+i×N+r); 0 means KVPort+100 (ephemeral when
	// KVPort is 0); -1 means no replay endpoint.
	ReplayPort int
	// DataParallelSize is the number of data-parallel ranks of each
	// replica, as vLLM's --data-parallel-size; default 1. Each rank is an
	// engine of its own (scheduler, KV cache of KVBlocks blocks, CPU tier)
	// with its own KV-event publisher and replay ROUTER at the replica's
	// ports + rank, publishing batches with data_parallel_rank set. The
	// replica's HTTP endpoint sends a request to the rank named by its
	// X-data-parallel-rank header, else to the least loaded rank (vLLM's
	// balancer: lowest 4 × waiting + running, lowest rank on ties).
	DataParallelSize int
	// FirstSeq is the sequence number of a replica's first KV-event batch,
	// at start and after a restart; default 0, as vLLM. 1 mimics
	// llm-d-inference-sim.
	FirstSeq uint64
	// NoTokenize makes POST /tokenize and /detokenize answer 404, as an
	// engine behind a proxy that does not expose them.
	NoTokenize bool
	// PromptBlocksOnly caches (and reports) only blocks made entirely of
	// prompt tokens, as llm-d-inference-sim does: blocks holding generated
	// tokens are never cached, so a follow-up turn hits only up to the end
	// of the previous prompt's last full block.
	PromptBlocksOnly bool
	// CPUBlocks is the size, in blocks, of each rank's CPU offload tier
	// (vLLM's native offloading connector); 0, the default, means none.
	// Every block the GPU caches is also offloaded (one BlockStored with
	// medium "CPU", the GPU hashes and no tokens, after the GPU's); the
	// tier evicts its least recently used block when full (a BlockRemoved
	// with medium "CPU" unless CPUStoreOnly). A request whose prefix
	// continues on CPU past its GPU hit loads those blocks instead of
	// computing them, at Profile.CPULoadPerToken, and they count as cached
	// tokens.
	CPUBlocks int
	// CPUStoreOnly makes the CPU tier publish no removals, as LMCache.
	CPUStoreOnly bool
	// Model is the served model name; default "qwen3-32b".
	Model string
	// Speed runs simulated time Speed times faster than real time (each
	// step's simulated duration d is slept as d/Speed); default 1.
	Speed float64
	// KVBlocks overrides the profile's KV-cache size in blocks; 0 keeps it
	// (19,208 in the default profile).
	KVBlocks int
	// BlockSize overrides the profile's block size in tokens; 0 keeps it
	// (16).
	BlockSize int
	// Profile is the simulated hardware; zero fields take DefaultProfile
	// values.
	Profile Profile
	// EventFormat is the KV-event layout: kvevents.FormatMap (zero, vLLM
	// ≥ 0.26) or kvevents.FormatArray (≤ 0.23).
	EventFormat kvevents.Format
	// ReplayFraming selects the replay reply framing (zero: with topic).
	ReplayFraming kvevents.ReplayFraming
	// SchedulingPolicy is "fcfs" (default) or "priority" (lower priority
	// values are scheduled first; with "fcfs" a non-zero priority is
	// rejected with 400, as vLLM does).
	SchedulingPolicy string
	// Seed, when non-zero, fixes the block-hash root (the same on every
	// replica and across restarts, like vLLM with PYTHONHASHSEED) and the
	// replicas' random sources. 0 means a random root per replica and per
	// restart, like vLLM without PYTHONHASHSEED. Output text is
	// deterministic either way.
	Seed int64
	// StreamInterval is the least real time between two chunks of one
	// streamed response; tokens generated meanwhile go out together. 0
	// sends each step's tokens as soon as they exist. A few milliseconds
	// cut the CPU spent on streaming when Speed is high.
	StreamInterval time.Duration
	// Clock is the source of real time for step sleeps; nil means the
	// system clock.
	Clock Clock
	// Logger receives the fleet's logs; nil discards them.
	Logger *slog.Logger
}

// Defaults of Config.
const (
	// DefaultModel is the served model name when Config.Model is empty.
	DefaultModel = "qwen3-32b"
	// DefaultHost is the bind address when Config.Host is empty.
	DefaultHost = "127.0.0.1"
)

func (cfg Config) resolve() (Config, error) {
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Replicas < 0 {
		return cfg, fmt.Errorf("vllmsim: %d replicas", cfg.Replicas)
	}
	if cfg.Host == "" {
		cfg.Host = DefaultHost
	}
	if cfg.Model == "" {
		cfg.Model = DefaultModel
	}
	if cfg.Speed == 0 {
		cfg.Speed = 1
	}
	if cfg.StreamInterval < 0 {
		return cfg, fmt.Errorf("vllmsim: negative stream interval %v", cfg.StreamInterval)
	}
	if cfg.Speed < 0 {
		return cfg, fmt.Errorf("vllmsim: negative speed %g", cfg.Speed)
	}
	if cfg.DataParallelSize == 0 {
		cfg.DataParallelSize = 1
	}
	if cfg.DataParallelSize < 0 || cfg.CPUBlocks < 0 {
		return cfg, fmt.Errorf("vllmsim: data-parallel size %d, CPU blocks %d: must not be negative", cfg.DataParallelSize, cfg.CPUBlocks)
	}
	if err := cfg.checkPorts(); err != nil {
		return cfg, err
	}
	switch cfg.SchedulingPolicy {
	case "":
		cfg.SchedulingPolicy = "fcfs"
	case "fcfs", "priority":
	default:
		return cfg, fmt.Errorf("vllmsim: unknown scheduling policy %q (want fcfs or priority)", cfg.SchedulingPolicy)
	}
	cfg.Profile = cfg.Profile.withDefaults()
	if cfg.KVBlocks != 0 {
		cfg.Profile.KVBlocks = cfg.KVBlocks
	}
	if cfg.BlockSize != 0 {
		cfg.Profile.BlockSize = cfg.BlockSize
	}
	cfg.KVBlocks, cfg.BlockSize = cfg.Profile.KVBlocks, cfg.Profile.BlockSize
	if err := cfg.Profile.validate(); err != nil {
		return cfg, err
	}
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

// checkPorts checks that the port ranges of every replica and rank fit
// and do not overlap.
func (cfg Config) checkPorts() error {
	last := cfg.Replicas - 1
	lastRank := cfg.Replicas*cfg.DataParallelSize - 1
	replayBase := cfg.ReplayPort
	if replayBase == 0 && cfg.KVPort > 0 {
		replayBase = cfg.KVPort + 100
	}
	for _, p := range []struct {
		name           string
		v, floor, last int
	}{{"http port", cfg.HTTPPort, 0, last}, {"kv port", cfg.KVPort, 0, lastRank}, {"replay port", replayBase, -1, lastRank}} {
		if p.v < p.floor || p.v+p.last > 65535 {
			return fmt.Errorf("vllmsim: %s %d out of range for %d replicas of %d ranks", p.name, p.v, cfg.Replicas, cfg.DataParallelSize)
		}
	}
	if cfg.KVPort > 0 && replayBase > 0 && cfg.KVConnect == "" && cfg.KVPort <= replayBase+lastRank && replayBase <= cfg.KVPort+lastRank {
		return fmt.Errorf("vllmsim: KV-event ports %d-%d and replay ports %d-%d overlap", cfg.KVPort, cfg.KVPort+lastRank, replayBase, replayBase+lastRank)
	}
	return nil
}

// Fleet is a set of simulated vLLM replicas served from one process.
type Fleet struct {
	cfg      Config
	zctx     *zmq.Context
	replicas []*Replica

	mu      sync.Mutex // guards started
	started bool
}

// NewFleet validates cfg and creates every replica, binding its HTTP
// listener, KV-event PUB socket and replay ROUTER now (so ephemeral
// endpoints are known from Info). It starts no goroutine; call Run.
func NewFleet(cfg Config) (*Fleet, error) {
	cfg, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("vllmsim: zmq context: %w", err)
	}
	f := &Fleet{cfg: cfg, zctx: zctx}
	for i := range cfg.Replicas {
		r, err := newReplica(cfg, zctx, i)
		if err != nil {
			f.closeUnstarted()
			return nil, err
		}
		f.replicas = append(f.replicas, r)
	}
	return f, nil
}

// closeUnstarted releases what NewFleet bound when it fails.
func (f *Fleet) closeUnstarted() {
	for _, r := range f.replicas {
		r.closeUnstarted()
	}
	_ = f.zctx.Term()
}

// Replicas returns the replicas in index order. The slice must not be
// modified.
func (f *Fleet) Replicas() []*Replica { return f.replicas }

// Run serves every replica (HTTP, engine loop, KV-event publisher) until
// ctx ends, then shuts everything down and returns nil. It returns an error
// if a replica fails or when called twice.
func (f *Fleet) Run(ctx context.Context) error {
	f.mu.Lock()
	if f.started {
		f.mu.Unlock()
		return errors.New("vllmsim: fleet Run called twice")
	}
	f.started = true
	f.mu.Unlock()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	fail := func(err error) {
		if err != nil && ctx.Err() == nil {
			cancel(err)
		}
	}
	for _, r := range f.replicas {
		for _, rk := range r.ranks {
			wg.Go(func() { fail(rk.eng.Run(ctx)) })
			wg.Go(func() {
				if err := rk.pub.Run(ctx); !errors.Is(err, context.Canceled) {
					fail(err)
				}
			})
		}
		wg.Go(func() { fail(r.serve(ctx)) })
	}
	wg.Wait()
	if err := f.zctx.Term(); err != nil {
		f.cfg.Logger.Warn("vllmsim: zmq term", "err", err)
	}
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("vllmsim: fleet: %w", err)
	}
	return nil
}

// Run is what `warmpath sim` runs: it creates the fleet, prints one line per
// replica with its endpoints to out (one per data-parallel rank, comma
// separated, in rank order), and serves until ctx ends (returning nil
// then).
func Run(ctx context.Context, cfg Config, out io.Writer) error {
	f, err := NewFleet(cfg)
	if err != nil {
		return err
	}
	for _, r := range f.Replicas() {
		in := r.Info()
		var kv, replay []string
		for _, rk := range in.Ranks {
			ep := rk.KVEndpoint
			if cfg.KVConnect != "" {
				ep = "connect:" + kvevents.OffsetEndpoint(cfg.KVConnect, rk.Rank)
			}
			kv = append(kv, ep)
			if rk.ReplayEndpoint != "" {
				replay = append(replay, rk.ReplayEndpoint)
			}
		}
		if len(replay) == 0 {
			replay = []string{"none"}
		}
		fmt.Fprintf(out, "replica %d  http=%s  kv=%s  replay=%s  topic=%s\n", in.Index, in.URL,
			strings.Join(kv, ","), strings.Join(replay, ","), in.Topic)
	}
	return f.Run(ctx)
}

// httpAddr computes replica i's HTTP listen address.
func httpAddr(cfg Config, i int) string {
	return net.JoinHostPort(cfg.Host, strconv.Itoa(portOr0(cfg.HTTPPort, i)))
}

// kvEndpoints computes the KV-event addresses of rank rank of replica i:
// the replica's base ports (by index) offset by the rank, as vLLM offsets
// a data-parallel engine's endpoints.
func kvEndpoints(cfg Config, i, rank int) (pubEP, replayEP string) {
	slot := i*cfg.DataParallelSize + rank
	switch {
	case cfg.KVConnect != "":
		pubEP = kvevents.OffsetEndpoint(cfg.KVConnect, rank)
	case cfg.KVPort == 0:
		pubEP = "tcp://" + net.JoinHostPort(cfg.Host, "*")
	default:
		pubEP = "tcp://*:" + strconv.Itoa(cfg.KVPort+slot)
	}
	switch {
	case cfg.ReplayPort < 0:
	case cfg.ReplayPort > 0:
		replayEP = "tcp://" + net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.ReplayPort+slot))
	case cfg.KVPort == 0:
		replayEP = "tcp://" + net.JoinHostPort(cfg.Host, "*")
	default:
		replayEP = "tcp://" + net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.KVPort+100+slot))
	}
	return pubEP, replayEP
}

func portOr0(base, i int) int {
	if base == 0 {
		return 0
	}
	return base + i
}

// hostEndpoint rewrites a bound ZMQ endpoint ("tcp://0.0.0.0:5557") as
// tcp://host:port for clients.
func hostEndpoint(host, bound string) string {
	if bound == "" {
		return ""
	}
	i := strings.LastIndexByte(bound, ':')
	if i < 0 {
		return bound
	}
	return "tcp://" + net.JoinHostPort(host, bound[i+1:])
}

// rootSource returns the hash-root generator of replica i: fixed from the
// seed, or fresh random bits per (re)start.
func rootSource(seed int64, rng *rand.Rand) func() uint64 {
	if seed != 0 {
		root := xxhash.Sum64String("vllmsim/none-hash/" + strconv.FormatInt(seed, 10))
		return func() uint64 { return root }
	}
	return rng.Uint64
}

// newRand returns replica i's random source.
func newRand(seed int64, i int) *rand.Rand {
	if seed != 0 {
		return rand.New(rand.NewPCG(uint64(seed), uint64(i)))
	}
	var b [32]byte
	_, _ = crand.Read(b[:])
	return rand.New(rand.NewChaCha8(b))
}
