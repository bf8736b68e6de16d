package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// SubscriberConfig configures a Subscriber. Replica, Endpoint and Handler
// are required.
type SubscriberConfig struct {
	// Replica names the replica to the Handler and in metrics.
	Replica string
	// Endpoint is the replica's PUB address; the SUB socket connects to
	// it (and libzmq reconnects by itself).
	Endpoint string
	// ReplayEndpoint is the replica's replay ROUTER; empty means none, in
	// which case a sequence gap makes the handler forget the replica.
	ReplayEndpoint string
	// Topic is the subscription prefix; empty subscribes to everything.
	// Topic frames are not otherwise interpreted: Replica names the source.
	Topic string
	// Handler receives the batches; required.
	Handler Handler
	// Metrics records counters; nil records nothing.
	Metrics *Metrics
	// Logger receives warnings and debug output; nil discards them.
	Logger *slog.Logger
	// RecvHWM is the receive high-water mark of the SUB and replay
	// sockets; zero or less means DefaultRecvHWM.
	RecvHWM int
	// ReplayTimeout bounds a whole replay; zero or less means
	// DefaultReplayTimeout.
	ReplayTimeout time.Duration
	// ReplayIdleTimeout bounds the wait for the next replay reply; zero or
	// less means DefaultReplayIdleTimeout.
	ReplayIdleTimeout time.Duration
	// MaxPending bounds the live batches buffered per source while a
	// replay runs (the replay fails beyond it); zero or less means
	// DefaultMaxPending.
	MaxPending int
}

// Subscriber follows one replica's KV events in the per-replica topology:
// its SUB socket connects to the replica's PUB endpoint. The gateway runs
// one per replica and cancels its context when the replica leaves.
//
// Sequence numbers are tracked per data-parallel rank of the batches. The
// first batch seen makes the handler Clear the replica (dropping what an
// earlier subscriber may have left); joining mid-stream (first seq > 0)
// replays from 0. A gap replays the missing batches, and the handler then
// sees every batch once, in order. A seq going backwards means the engine
// restarted: Clear, then a replay from 0 unless the new stream's seq 0
// itself arrived. A gap that cannot be replayed (no ReplayEndpoint, a
// failed replay, or batches gone from the publisher's buffer) makes the
// handler Clear the replica, and delivery goes on from the next batch.
// Known limit: a restart whose new stream already passed the old seq when
// it reaches us looks like a gap, not a restart.
type Subscriber struct {
	zctx    *zmq.Context
	cfg     SubscriberConfig
	log     *slog.Logger
	opts    syncOptions
	running atomic.Bool
}

// NewSubscriber validates cfg and fills in defaults. It creates no socket
// and starts no goroutine; Run does both. zctx must not be nil and must
// outlive Run.
func NewSubscriber(zctx *zmq.Context, cfg SubscriberConfig) (*Subscriber, error) {
	switch {
	case zctx == nil:
		return nil, errors.New("kvevents: new subscriber: nil zmq context")
	case cfg.Replica == "":
		return nil, errors.New("kvevents: new subscriber: empty replica")
	case cfg.Endpoint == "":
		return nil, errors.New("kvevents: new subscriber: empty endpoint")
	case cfg.Handler == nil:
		return nil, errors.New("kvevents: new subscriber: nil handler")
	}
	s := &Subscriber{
		zctx: zctx, cfg: cfg, log: loggerOrDiscard(cfg.Logger).With("replica", cfg.Replica),
		opts: syncOptions{
			replayTimeout: cfg.ReplayTimeout, replayIdle: cfg.ReplayIdleTimeout,
			maxPending: cfg.MaxPending, recvHWM: cfg.RecvHWM,
		},
	}
	s.opts.fill()
	return s, nil
}

// Run receives and applies events until ctx ends, then returns ctx.Err().
// It is the only goroutine touching the subscriber's sockets (the SUB and
// the DEALERs it opens for replays) and the only caller of the Handler. A
// failing SUB socket is closed and re-created after a short backoff; Run
// returns another error only when the zmq context is terminated. When it
// returns it has closed its sockets and, if it was the replica's last
// running Subscriber on its Metrics (a data-parallel engine has one per
// rank), deleted the replica's metric series. Run may be called once.
func (s *Subscriber) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("kvevents: subscriber: Run called twice")
	}
	s.cfg.Metrics.acquire(s.cfg.Replica)
	defer s.cfg.Metrics.release(s.cfg.Replica)
	var replayEP func(string, *int) string
	if ep := s.cfg.ReplayEndpoint; ep != "" {
		replayEP = func(string, *int) string { return ep }
	}
	seq := newSequencer(s.zctx, s.cfg.Handler, s.cfg.Metrics, s.log, s.opts, replayEP)
	defer seq.close()
	open := func() (*zmq.Socket, error) {
		sock, _, err := openSocket(s.zctx, zmq.SUB, s.cfg.Endpoint, false, func(sk *zmq.Socket) error {
			if err := sk.SetRcvhwm(s.opts.recvHWM); err != nil {
				return err
			}
			return sk.SetSubscribe(s.cfg.Topic)
		})
		return sock, err
	}
	replica := func([]byte) string { return s.cfg.Replica }
	return runLoop(ctx, s.log, open, seq, replica)
}

// CentralConfig configures a Central. Bind and Handler are required.
type CentralConfig struct {
	// Bind is the address the SUB socket binds, e.g. "tcp://*:5557";
	// engines' PUB sockets connect to it.
	Bind string
	// Subscribe is the topic prefix to accept; empty means "kv@".
	Subscribe string
	// ReplayEndpoint, when set, returns the replay ROUTER of a replica
	// ("" for none). For batches of data-parallel rank r > 0 the endpoint
	// is offset as vLLM offsets its ranks' endpoints (see OffsetEndpoint).
	// Nil means no replays: gaps make the handler forget the replica.
	ReplayEndpoint func(replica string) string
	// Handler receives the batches; required.
	Handler Handler
	// Metrics records counters; nil records nothing.
	Metrics *Metrics
	// Logger receives warnings and debug output; nil discards them.
	Logger *slog.Logger
	// RecvHWM, ReplayTimeout, ReplayIdleTimeout and MaxPending are as in
	// SubscriberConfig.
	RecvHWM           int
	ReplayTimeout     time.Duration
	ReplayIdleTimeout time.Duration
	MaxPending        int
}

// Central receives the KV events of many replicas on one bound SUB socket
// (llm-d's central topology): engines' PUB sockets connect to it and name
// themselves in the topic kv@<replica>@<model> (see ParseTopic; another
// topic names the replica whole). Sequence state is kept per replica and
// data-parallel rank, with the same gap, replay and restart handling as
// Subscriber. Replicas are never forgotten by Central itself: the block
// index ages out those that stop publishing.
type Central struct {
	zctx     *zmq.Context
	cfg      CentralConfig
	log      *slog.Logger
	opts     syncOptions
	endpoint string

	mu    sync.Mutex  // guards sock and state until Run takes over
	sock  *zmq.Socket // owned by Run once it starts
	state pubState
}

// NewCentral validates cfg, fills in defaults and binds the SUB socket now,
// so address errors surface here and Endpoint knows an ephemeral port. It
// starts no goroutine: call Run, or Close if Run will never be called.
// zctx must not be nil and must outlive Run.
func NewCentral(zctx *zmq.Context, cfg CentralConfig) (*Central, error) {
	switch {
	case zctx == nil:
		return nil, errors.New("kvevents: new central: nil zmq context")
	case cfg.Bind == "":
		return nil, errors.New("kvevents: new central: empty bind address")
	case cfg.Handler == nil:
		return nil, errors.New("kvevents: new central: nil handler")
	}
	if cfg.Subscribe == "" {
		cfg.Subscribe = "kv@"
	}
	c := &Central{
		zctx: zctx, cfg: cfg, log: loggerOrDiscard(cfg.Logger),
		opts: syncOptions{
			replayTimeout: cfg.ReplayTimeout, replayIdle: cfg.ReplayIdleTimeout,
			maxPending: cfg.MaxPending, recvHWM: cfg.RecvHWM,
		},
	}
	c.opts.fill()
	var err error
	c.sock, c.endpoint, err = c.bind(cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("kvevents: new central: %w", err)
	}
	return c, nil
}

func (c *Central) bind(endpoint string) (*zmq.Socket, string, error) {
	return openSocket(c.zctx, zmq.SUB, endpoint, true, func(sk *zmq.Socket) error {
		if err := sk.SetRcvhwm(c.opts.recvHWM); err != nil {
			return err
		}
		return sk.SetSubscribe(c.cfg.Subscribe)
	})
}

// Endpoint returns the bound address as libzmq reports it (ephemeral
// ports resolved; a wildcard host reads 0.0.0.0).
func (c *Central) Endpoint() string { return c.endpoint }

// Close releases the socket of a Central whose Run was never called; it
// is a no-op once Run has started. It is safe for concurrent use.
func (c *Central) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != pubNew {
		return nil
	}
	c.state = pubClosed
	if err := c.sock.Close(); err != nil {
		return fmt.Errorf("kvevents: central close: %w", err)
	}
	return nil
}

// Run receives and applies events until ctx ends, then returns ctx.Err().
// It is the only goroutine touching the central's sockets (the bound SUB
// and the DEALERs it opens for replays) and the only caller of the
// Handler. A failing SUB socket is closed and bound again to the same
// address after a short backoff; Run returns another error only when the
// zmq context is terminated. It closes its sockets before returning. Run
// may be called once, and not after Close.
func (c *Central) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.state != pubNew {
		c.mu.Unlock()
		return errors.New("kvevents: central: Run called twice or after Close")
	}
	c.state = pubRunning
	first := c.sock
	c.sock = nil
	c.mu.Unlock()

	var replayEP func(string, *int) string
	if f := c.cfg.ReplayEndpoint; f != nil {
		replayEP = func(replica string, rank *int) string {
			ep := f(replica)
			if ep != "" && rank != nil {
				ep = OffsetEndpoint(ep, *rank)
			}
			return ep
		}
	}
	seq := newSequencer(c.zctx, c.cfg.Handler, c.cfg.Metrics, c.log, c.opts, replayEP)
	defer seq.close()
	open := func() (*zmq.Socket, error) {
		if first != nil {
			s := first
			first = nil
			return s, nil
		}
		s, _, err := c.bind(c.endpoint)
		return s, err
	}
	replica := func(topic []byte) string {
		r, _ := ParseTopic(string(topic))
		return r
	}
	return runLoop(ctx, c.log, open, seq, replica)
}

// Reconnect backoff after a socket error.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// maxDrain bounds the live messages read per poll, so replay replies and
// ctx are serviced under a flood.
const maxDrain = 1024

// runLoop polls the SUB socket from open and the sequencer's replay
// sockets until ctx ends. replica names the source of a live message from
// its topic frame.
func runLoop(ctx context.Context, log *slog.Logger, open func() (*zmq.Socket, error), seq *sequencer,
	replica func(topic []byte) string) error {
	var sub *zmq.Socket
	defer func() {
		if sub != nil {
			sub.Close()
		}
	}()
	backoff := minBackoff
	wait := func() error {
		t := time.NewTimer(backoff)
		defer t.Stop()
		backoff = min(2*backoff, maxBackoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
	for ctx.Err() == nil {
		if sub == nil {
			var err error
			if sub, err = open(); err != nil {
				if isETERM(err) {
					return fmt.Errorf("kvevents: subscriber: %w", err)
				}
				log.Warn("kvevents: cannot open SUB socket", "err", err)
				if err := wait(); err != nil {
					return err
				}
				continue
			}
		}
		poller := zmq.NewPoller()
		poller.Add(sub, zmq.POLLIN)
		seq.addSockets(poller)
		polled, err := poller.Poll(pollInterval)
		if err != nil {
			if isETERM(err) {
				return fmt.Errorf("kvevents: subscriber: poll: %w", err)
			}
			log.Warn("kvevents: poll failed, re-creating SUB socket", "err", err)
			sub.Close()
			sub = nil
			if err := wait(); err != nil {
				return err
			}
			continue
		}
		now := time.Now()
		for _, p := range polled {
			if p.Socket != sub {
				seq.replayReadable(p.Socket, now)
				continue
			}
			for range maxDrain {
				frames, err := sub.RecvMessageBytes(zmq.DONTWAIT)
				if err != nil {
					if isEAGAIN(err) {
						break
					}
					if isETERM(err) {
						return fmt.Errorf("kvevents: subscriber: receive: %w", err)
					}
					log.Warn("kvevents: receive failed, re-creating SUB socket", "err", err)
					sub.Close()
					sub = nil
					break
				}
				backoff = minBackoff
				var topic []byte
				if len(frames) > 0 {
					topic = frames[0]
				}
				seq.message(replica(topic), frames, time.Now())
			}
			if sub == nil {
				break
			}
		}
		seq.expire(time.Now())
		if sub == nil {
			if err := wait(); err != nil {
				return err
			}
		}
	}
	return ctx.Err()
}
