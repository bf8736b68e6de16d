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

// Replica is one simulated vLLM server. Its methods are safe for
// concurrent use.
type Replica struct {
	info    ReplicaInfo
	cfg     Config // resolved fleet config
	eng     *engine
	pub     *kvevents.Publisher
	handler http.Handler
	logger  *slog.Logger
	created int64 // Unix seconds, for "created" fields

	faults atomic.Pointer[faultState]
	hung   atomic.Int64 // requests currently held by Hang
	ids    atomic.Uint64

	rngMu sync.Mutex // guards rng
	rng   *rand.Rand

	mu     sync.Mutex // guards srv, ln, served, closed
	srv    *http.Server
	ln     net.Listener
	served *http.Server  // the server serve is running (or ran)
	closed bool          // Run has ended
	up     chan struct{} // cap 1; signals serve that srv changed
}

func newReplica(cfg Config, zctx *zmq.Context, i int) (*Replica, error) {
	httpAddr, pubEP, replayEP := endpoints(cfg, i)
	ln, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return nil, fmt.Errorf("vllmsim: replica %d: listen: %w", i, err)
	}
	name := net.JoinHostPort(cfg.Host, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	topic := kvevents.Topic(name, cfg.Model)
	logger := cfg.Logger.With("replica", name)
	pub, err := kvevents.NewPublisher(zctx, kvevents.PublisherConfig{
		Endpoint:       pubEP,
		ReplayEndpoint: replayEP,
		Topic:          topic,
		Format:         cfg.EventFormat,
		ReplayFraming:  cfg.ReplayFraming,
		FirstSeq:       cfg.FirstSeq,
		Logger:         logger,
	})
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("vllmsim: replica %d: %w", i, err)
	}
	kvEndpoint := hostEndpoint(cfg.Host, pub.Endpoint())
	if cfg.KVConnect != "" {
		kvEndpoint = "" // the PUB connects; nothing to subscribe to here
	}
	r := &Replica{
		info: ReplicaInfo{
			Index:          i,
			Name:           name,
			URL:            "http://" + name,
			KVEndpoint:     kvEndpoint,
			ReplayEndpoint: hostEndpoint(cfg.Host, pub.ReplayEndpoint()),
			Topic:          topic,
			Model:          cfg.Model,
		},
		cfg:     cfg,
		pub:     pub,
		logger:  logger,
		created: cfg.Clock.Now().Unix(),
		rng:     newRand(cfg.Seed, 2*i),
		ln:      ln,
		up:      make(chan struct{}, 1),
	}
	r.faults.Store(&faultState{})
	r.eng = newEngine(engineConfig{
		profile:    cfg.Profile,
		speed:      cfg.Speed,
		priority:   cfg.SchedulingPolicy == "priority",
		clock:      cfg.Clock,
		sink:       pub,
		newRoot:    rootSource(cfg.Seed, newRand(cfg.Seed, 2*i+1)),
		typedExtra: cfg.EventFormat == kvevents.FormatMap,
		logger:     logger,
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(r.eng, cfg.Model, cfg.Profile.BlockSize, cfg.Profile.KVBlocks))
	r.handler = r.routes(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	r.srv = r.newServer()
	return r, nil
}

func (r *Replica) closeUnstarted() {
	_ = r.ln.Close()
	_ = r.pub.Close()
}

// Info returns the replica's endpoints.
func (r *Replica) Info() ReplicaInfo { return r.info }

// Stats returns a snapshot of the replica's engine counters.
func (r *Replica) Stats() Stats {
	st, _ := r.eng.snapshot()
	return st
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

// Restart emulates a crash and restart of the vLLM process: requests in
// flight fail (500, or an error event mid-stream), the KV cache is emptied
// without an AllBlocksCleared event, the block-hash root is re-drawn
// (unless Config.Seed is set), counters restart, and the next KV-event
// batch has sequence number Config.FirstSeq (0 by default). The HTTP
// listener stays up.
func (r *Replica) Restart() { r.eng.restart() }

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
