package vllmsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/warmpath/warmpath/kvevents"
)

// ReplicaInfo describes a replica's endpoints.
type ReplicaInfo struct {
	// Index is the replica's position in the fleet, from 0.
	Index int
	// Name is host:port of its HTTP endpoint, e.g. "127.0.0.1:8100".
	Name string
	// URL is its HTTP base URL, e.g. "http://127.0.0.1:8100".
	URL string
	// KVEndpoint is where to connect a SUB for its KV events, e.g.
	// "tcp://127.0.0.1:5557".
	KVEndpoint string
	// ReplayEndpoint is its replay ROUTER, or "" when disabled.
	ReplayEndpoint string
	// Topic is frame 0 of its KV-event messages: kv@<Name>@<Model>.
	Topic string
	// Model is the served model name.
	Model string
	// Ranks describes each data-parallel rank's KV-event endpoints, in
	// rank order; KVEndpoint and ReplayEndpoint are rank 0's.
	Ranks []RankInfo
}

// RankInfo describes the KV-event endpoints of one data-parallel rank.
type RankInfo struct {
	// Rank is the data-parallel rank, the data_parallel_rank of its
	// batches.
	Rank int
	// KVEndpoint and ReplayEndpoint are as in ReplicaInfo.
	KVEndpoint, ReplayEndpoint string
}

// Faults are failures injected into a replica. The zero value injects
// none.
type Faults struct {
	// ErrorRate is the fraction (0..1) of completion requests answered with
	// 500 in vLLM's error shape.
	ErrorRate float64
	// ExtraLatency is simulated time added before a completion request
	// enters the engine (slept as ExtraLatency/Speed) and included in the
	// X-Sim-Queue-Ms and X-Sim-TTFT-Ms headers.
	ExtraLatency time.Duration
	// Hang makes the replica stop answering: requests are accepted but get
	// no response (streams in flight stop too) until Hang is cleared or the
	// client gives up. The /sim/ admin endpoints keep answering.
	Hang bool
}

type faultState struct {
	Faults
	unhang chan struct{} // closed when a Hang ends; nil when not hanging
}

// Replica is one simulated vLLM server: one HTTP endpoint in front of
// Config.DataParallelSize engines. Its methods are safe for concurrent
// use.
type Replica struct {
	info    ReplicaInfo
	cfg     Config   // resolved fleet config
	ranks   []dpRank // one per data-parallel rank
	handler http.Handler
	logger  *slog.Logger
	created int64 // Unix seconds, for "created" fields

	faults atomic.Pointer[faultState]
	hung   atomic.Int64 // requests currently held by Hang
	ids    atomic.Uint64
	// traceparent is the last traceparent header an inference request
	// carried (LastTraceparent).
	traceparent atomic.Pointer[string]

	rngMu sync.Mutex // guards rng
	rng   *rand.Rand

	mu     sync.Mutex // guards srv, ln, served, closed
	srv    *http.Server
	ln     net.Listener
	served *http.Server  // the server serve is running (or ran)
	closed bool          // Run has ended
	up     chan struct{} // cap 1; signals serve that srv changed
}

// dpRank is one data-parallel rank of a replica: an engine and its
// KV-event publisher.
type dpRank struct {
	eng *engine
	pub *kvevents.Publisher
}

func newReplica(cfg Config, zctx *zmq.Context, i int) (*Replica, error) {
	ln, err := net.Listen("tcp", httpAddr(cfg, i))
	if err != nil {
		return nil, fmt.Errorf("vllmsim: replica %d: listen: %w", i, err)
	}
	name := net.JoinHostPort(cfg.Host, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	logger := cfg.Logger.With("replica", name)
	r := &Replica{
		info: ReplicaInfo{
			Index: i,
			Name:  name,
			URL:   "http://" + name,
			Topic: kvevents.Topic(name, cfg.Model),
			Model: cfg.Model,
		},
		cfg:     cfg,
		logger:  logger,
		created: cfg.Clock.Now().Unix(),
		rng:     newRand(cfg.Seed, 2*i),
		ln:      ln,
		up:      make(chan struct{}, 1),
	}
	r.faults.Store(&faultState{})
	for rank := range cfg.DataParallelSize {
		if err := r.addRank(zctx, i, rank); err != nil {
			r.closeUnstarted()
			return nil, fmt.Errorf("vllmsim: replica %d: %w", i, err)
		}
	}
	r.info.KVEndpoint, r.info.ReplayEndpoint = r.info.Ranks[0].KVEndpoint, r.info.Ranks[0].ReplayEndpoint
	engines := make([]*engine, len(r.ranks))
	for k, rk := range r.ranks {
		engines[k] = rk.eng
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(engines, cfg.Model, cfg.Profile.BlockSize, cfg.Profile.KVBlocks, cfg.CPUBlocks))
	r.handler = r.routes(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	r.srv = r.newServer()
	return r, nil
}

// addRank creates data-parallel rank rank of replica i: its publisher
// (bound or connected at the replica's ports + rank) and its engine.
func (r *Replica) addRank(zctx *zmq.Context, i, rank int) error {
	cfg := r.cfg
	pubEP, replayEP := kvEndpoints(cfg, i, rank)
	logger := r.logger
	if cfg.DataParallelSize > 1 {
		logger = logger.With("dp_rank", rank)
	}
	pub, err := kvevents.NewPublisher(zctx, kvevents.PublisherConfig{
		Endpoint:       pubEP,
		ReplayEndpoint: replayEP,
		Topic:          r.info.Topic,
		Format:         cfg.EventFormat,
		ReplayFraming:  cfg.ReplayFraming,
		FirstSeq:       cfg.FirstSeq,
		Logger:         logger,
	})
	if err != nil {
		return fmt.Errorf("rank %d: %w", rank, err)
	}
	ri := RankInfo{Rank: rank, KVEndpoint: hostEndpoint(cfg.Host, pub.Endpoint()), ReplayEndpoint: hostEndpoint(cfg.Host, pub.ReplayEndpoint())}
	if cfg.KVConnect != "" {
		ri.KVEndpoint = "" // the PUB connects; nothing to subscribe to here
	}
	r.info.Ranks = append(r.info.Ranks, ri)
	// Each rank is a process of its own: with Config.Seed its hash root is
	// the fleet's (PYTHONHASHSEED), without, a random one of its own.
	eng := newEngine(engineConfig{
		profile:      cfg.Profile,
		speed:        cfg.Speed,
		priority:     cfg.SchedulingPolicy == "priority",
		clock:        cfg.Clock,
		sink:         pub,
		newRoot:      rootSource(cfg.Seed, newRand(cfg.Seed, 2*i+1)),
		typedExtra:   cfg.EventFormat == kvevents.FormatMap,
		rank:         rank,
		promptOnly:   cfg.PromptBlocksOnly,
		cpuBlocks:    cfg.CPUBlocks,
		cpuStoreOnly: cfg.CPUStoreOnly,
		logger:       logger,
	})
	r.ranks = append(r.ranks, dpRank{eng: eng, pub: pub})
	return nil
}

func (r *Replica) closeUnstarted() {
	_ = r.ln.Close()
	for _, rk := range r.ranks {
		_ = rk.pub.Close()
	}
}

// Info returns the replica's endpoints.
func (r *Replica) Info() ReplicaInfo { return r.info }

// Stats returns a snapshot of the replica's engine counters, summed over
// its data-parallel ranks (KVUsage over all their blocks, SimTime the
// latest rank's clock).
func (r *Replica) Stats() Stats {
	var sum Stats
	for _, rk := range r.ranks {
		st, _ := rk.eng.snapshot()
		sum.add(st)
	}
	if sum.KVBlocks > 0 {
		sum.KVUsage = float64(sum.KVBlocksUsed) / float64(sum.KVBlocks)
	}
	return sum
}

// RankStats returns the engine counters of one data-parallel rank; it
// panics if rank is out of range.
func (r *Replica) RankStats(rank int) Stats {
	st, _ := r.ranks[rank].eng.snapshot()
	return st
}

// DropKVEvents makes data-parallel rank rank lose its next n KV-event
// batches on the live stream (they stay in the replay buffer), as libzmq
// drops messages for a slow subscriber past the high-water mark; it
// panics if rank is out of range.
func (r *Replica) DropKVEvents(rank, n int) { r.ranks[rank].pub.DropNext(n) }

// engineFor picks the rank that serves a request: the one named by its
// X-data-parallel-rank header, else the least loaded (vLLM's balancer).
func (r *Replica) engineFor(h http.Header) (*engine, int, error) {
	if v := h.Get("X-data-parallel-rank"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n >= len(r.ranks) {
			return nil, 0, badRequest("data_parallel_rank %q is out of range [0, %d)", v, len(r.ranks))
		}
		return r.ranks[n].eng, n, nil
	}
	best, bestScore := 0, -1
	for k, rk := range r.ranks {
		if len(r.ranks) == 1 {
			break
		}
		waiting, running := rk.eng.load()
		if score := 4*waiting + running; bestScore < 0 || score < bestScore {
			best, bestScore = k, score
		}
	}
	return r.ranks[best].eng, best, nil
}

// SetFaults replaces the injected faults. Clearing Hang releases the
// requests it held.
func (r *Replica) SetFaults(f Faults) {
	for {
		old := r.faults.Load()
		next := &faultState{Faults: f}
		if f.Hang {
			next.unhang = old.unhang
			if next.unhang == nil {
				next.unhang = make(chan struct{})
			}
		}
		if r.faults.CompareAndSwap(old, next) {
			if old.unhang != nil && next.unhang == nil {
				close(old.unhang)
			}
			return
		}
	}
}

// LastTraceparent returns the W3C traceparent header of the last chat or
// completion request that reached the replica, or "" if it carried none
// (or none came yet): tests check a gateway's trace propagation with it.
func (r *Replica) LastTraceparent() string {
	if p := r.traceparent.Load(); p != nil {
		return *p
	}
	return ""
}

// Faults returns the injected faults.
func (r *Replica) Faults() Faults { return r.faults.Load().Faults }

// waitHang blocks while the replica hangs, until ctx ends.
func (r *Replica) waitHang(ctx context.Context) error {
	for {
		fs := r.faults.Load()
		if fs.unhang == nil {
			return nil
		}
		r.hung.Add(1)
		select {
		case <-fs.unhang:
			r.hung.Add(-1)
		case <-ctx.Done():
			r.hung.Add(-1)
			return ctx.Err()
		}
	}
}

// Restart emulates a crash and restart of the vLLM process (every
// data-parallel rank, CPU tiers included): requests in flight fail (500, or an error event mid-stream), the KV cache is emptied
// without an AllBlocksCleared event, the block-hash root is re-drawn
// (unless Config.Seed is set), counters restart, and the next KV-event
// batch has sequence number Config.FirstSeq (0 by default). The HTTP
// listener stays up.
func (r *Replica) Restart() {
	for _, rk := range r.ranks {
		rk.eng.restart()
	}
}

// RestartRank restarts one data-parallel rank's engine as Restart restarts
// them all (its KV-event stream starts again from Config.FirstSeq), and
// leaves the other ranks alone; it panics if rank is out of range.
func (r *Replica) RestartRank(rank int) { r.ranks[rank].eng.restart() }

// SetDown closes (down true) or reopens (down false) the replica's HTTP
// listener on the same port. While down, connections are refused and open
// connections are closed, failing requests in flight; the engine and KV
// events keep running.
func (r *Replica) SetDown(down bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("vllmsim: replica stopped")
	}
	if down {
		if r.srv == nil {
			return nil
		}
		srv, ln := r.srv, r.ln
		r.srv, r.ln = nil, nil
		if r.served != srv {
			_ = ln.Close() // not handed to Serve yet
		}
		err := srv.Close()
		r.signalUp()
		if err != nil {
			return fmt.Errorf("vllmsim: replica %s down: %w", r.info.Name, err)
		}
		return nil
	}
	if r.srv != nil {
		return nil
	}
	ln, err := net.Listen("tcp", r.info.Name)
	if err != nil {
		return fmt.Errorf("vllmsim: replica %s up: %w", r.info.Name, err)
	}
	r.srv, r.ln = r.newServer(), ln
	r.signalUp()
	return nil
}

func (r *Replica) signalUp() {
	select {
	case r.up <- struct{}{}:
	default:
	}
}

func (r *Replica) newServer() *http.Server {
	return &http.Server{
		Handler:           r.handler,
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(r.logger.Handler(), slog.LevelDebug),
	}
}

// serve runs the HTTP server across SetDown cycles until ctx ends.
func (r *Replica) serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.closed = true
		if r.srv != nil {
			if r.served != r.srv {
				_ = r.ln.Close()
			}
			_ = r.srv.Close()
		}
		r.signalUp()
	})
	defer stop()
	for {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return nil
		}
		srv, ln := r.srv, r.ln
		fresh := srv != nil && r.served != srv
		if fresh {
			r.served = srv
			srv.BaseContext = func(net.Listener) context.Context { return ctx }
		}
		r.mu.Unlock()
		if !fresh {
			select {
			case <-r.up:
			case <-ctx.Done():
			}
			continue
		}
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("vllmsim: replica %s: serve: %w", r.info.Name, err)
		}
	}
}

// draw returns a uniform float in [0,1).
func (r *Replica) draw() float64 {
	r.rngMu.Lock()
	defer r.rngMu.Unlock()
	return r.rng.Float64()
}

// newID returns a request ID such as "chatcmpl-3f…".
func (r *Replica) newID(prefix string) string {
	r.rngMu.Lock()
	x := r.rng.Uint64()
	r.rngMu.Unlock()
	return fmt.Sprintf("%s%016x%08x", prefix, x, uint32(r.ids.Add(1)))
}
