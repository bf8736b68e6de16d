package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// CentralConfig configures a Central. Handler and exactly one of Bind and
// Connect are required.
type CentralConfig struct {
	// Bind is the address the SUB socket binds, e.g. "tcp://*:5557";
	// engines' PUB sockets connect to it.
	Bind string
	// Ranks is the number of addresses bound, for data-parallel engines:
	// vLLM's rank r of an engine configured to connect to
	// tcp://gateway:5557 dials port 5557+r, so the central binds Bind
	// offset by 0…Ranks−1 (see OffsetEndpoint). Zero or less means 1. It
	// is ignored with Connect: a relay binds the ranks' ports (RelayConfig).
	Ranks int
	// Connect, instead of Bind, makes the SUB socket connect to a relay's
	// publish address (see Relay), which any number of centrals may
	// subscribe to: the way several gateways share engines whose PUB
	// sockets connect. Topics are read as with Bind.
	Connect string
	// Subscribe is the topic prefix to accept; empty means "kv@".
	Subscribe string
	// Resolve maps the replica a topic names (its ParseTopic replica,
	// e.g. "10.0.0.7:8000") to the replica name the Handler, metrics and
	// ReplayEndpoint use, or reports false for a replica that is not in
	// the fleet: its batches are dropped, counted by topic
	// (warmpath_kvevents_unknown_replica_batches_total) and logged once
	// per name with a hint. Nil takes every topic's replica as it is. It
	// is called from Run's goroutine for every message, so it must be
	// cheap and safe for concurrent use with whatever updates it.
	Resolve func(topicReplica string) (replica string, ok bool)
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

// Central receives the KV events of many replicas on one SUB socket
// (llm-d's central topology): bound, engines' PUB sockets connect to it
// (one bound address per data-parallel rank), or connected to a Relay that
// does the binding. Engines name themselves in the topic
// kv@<replica>@<model> (see ParseTopic; another topic names the replica
// whole), which CentralConfig.Resolve maps to fleet names. Sequence state
// is kept per replica and data-parallel rank, with the same gap, replay
// and restart handling as Subscriber. Replicas are never forgotten by
// Central itself: the block index ages out those that stop publishing.
type Central struct {
	zctx      *zmq.Context
	cfg       CentralConfig
	log       *slog.Logger
	opts      syncOptions
	endpoints []string

	mu    sync.Mutex    // guards socks and state until Run takes over
	socks []*zmq.Socket // owned by Run once it starts
	state pubState
}

// NewCentral validates cfg, fills in defaults and binds (or connects) the
// SUB sockets now, so address errors surface here and Endpoints knows
// ephemeral ports. It starts no goroutine: call Run, or Close if Run will
// never be called. zctx must not be nil and must outlive Run.
func NewCentral(zctx *zmq.Context, cfg CentralConfig) (*Central, error) {
	switch {
	case zctx == nil:
		return nil, errors.New("kvevents: new central: nil zmq context")
	case (cfg.Bind == "") == (cfg.Connect == ""):
		return nil, errors.New("kvevents: new central: want exactly one of a bind and a connect address")
	case cfg.Handler == nil:
		return nil, errors.New("kvevents: new central: nil handler")
	}
	if cfg.Subscribe == "" {
		cfg.Subscribe = "kv@"
	}
	if cfg.Ranks < 1 || cfg.Connect != "" {
		cfg.Ranks = 1
	}
	c := &Central{
		zctx: zctx, cfg: cfg, log: loggerOrDiscard(cfg.Logger),
		opts: syncOptions{
			replayTimeout: cfg.ReplayTimeout, replayIdle: cfg.ReplayIdleTimeout,
			maxPending: cfg.MaxPending, recvHWM: cfg.RecvHWM,
		},
	}
	c.opts.fill()
	for r := range cfg.Ranks {
		ep := cfg.Connect
		if ep == "" {
			ep = OffsetEndpoint(cfg.Bind, r)
		}
		sock, actual, err := c.open(ep)
		if err != nil {
			c.closeAll()
			return nil, fmt.Errorf("kvevents: new central: rank %d: %w", r, err)
		}
		c.socks = append(c.socks, sock)
		c.endpoints = append(c.endpoints, actual)
	}
	return c, nil
}

func (c *Central) open(endpoint string) (*zmq.Socket, string, error) {
	return openSocket(c.zctx, zmq.SUB, endpoint, c.cfg.Connect == "", func(sk *zmq.Socket) error {
		if err := sk.SetRcvhwm(c.opts.recvHWM); err != nil {
			return err
		}
		return sk.SetSubscribe(c.cfg.Subscribe)
	})
}

func (c *Central) closeAll() {
	for _, s := range c.socks {
		s.Close()
	}
	c.socks = nil
}

// Endpoint returns the address of rank 0's socket: bound as libzmq reports
// it (ephemeral ports resolved; a wildcard host reads 0.0.0.0), or the
// connect address.
func (c *Central) Endpoint() string { return c.endpoints[0] }

// Endpoints returns every socket's address, in rank order.
func (c *Central) Endpoints() []string { return c.endpoints }

// Close releases the sockets of a Central whose Run was never called; it
// is a no-op once Run has started. It is safe for concurrent use.
func (c *Central) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != pubNew {
		return nil
	}
	c.state = pubClosed
	var err error
	for _, s := range c.socks {
		err = errors.Join(err, s.Close())
	}
	c.socks = nil
	if err != nil {
		return fmt.Errorf("kvevents: central close: %w", err)
	}
	return nil
}

// Run receives and applies events until ctx ends, then returns ctx.Err().
// It is the only goroutine touching the central's sockets (the SUB sockets
// and the DEALERs it opens for replays) and the only caller of the Handler
// and of Resolve. A failing SUB socket is closed and bound (or connected)
// again to the same address after a short backoff; Run returns another
// error only when the zmq context is terminated. It closes its sockets
// before returning. Run may be called once, and not after Close.
func (c *Central) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.state != pubNew {
		c.mu.Unlock()
		return errors.New("kvevents: central: Run called twice or after Close")
	}
	c.state = pubRunning
	first := c.socks
	c.socks = nil
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
	open := func(i int) (*zmq.Socket, error) {
		if s := first[i]; s != nil {
			first[i] = nil
			return s, nil
		}
		s, _, err := c.open(c.endpoints[i])
		return s, err
	}
	defer func() {
		for _, s := range first {
			if s != nil {
				s.Close()
			}
		}
	}()
	u := unknownReplicas{m: c.cfg.Metrics, log: c.log}
	replica := func(topic []byte, now time.Time) (string, bool) {
		r, _ := ParseTopic(string(topic))
		if c.cfg.Resolve == nil {
			return r, true
		}
		name, ok := c.cfg.Resolve(r)
		if !ok {
			u.seen(string(topic), r)
		}
		return name, ok
	}
	return runLoop(ctx, c.log, len(c.endpoints), open, seq, replica)
}

// maxWarnedReplicas bounds the unknown replica names a Central remembers
// having warned about; beyond it, it warns once more and then only counts.
const maxWarnedReplicas = 1024

// unknownReplicas counts and warns about batches whose topic names a
// replica Resolve does not know. It belongs to one Run goroutine.
type unknownReplicas struct {
	m      *Metrics
	log    *slog.Logger
	warned map[string]bool
}

func (u *unknownReplicas) seen(topic, replica string) {
	u.m.unknownReplica(topic)
	if u.warned == nil {
		u.warned = map[string]bool{}
	}
	if u.warned[replica] || len(u.warned) > maxWarnedReplicas {
		return
	}
	if len(u.warned) == maxWarnedReplicas {
		u.warned[""] = true // past the bound: one last warning, then counting only
		u.log.Warn("kvevents: too many unknown replicas named in KV-event topics; no more warnings, see warmpath_kvevents_unknown_replica_batches_total")
		return
	}
	u.warned[replica] = true
	u.log.Warn("kvevents: KV events for a replica that is not in the fleet; dropping them",
		"topic", topic, "replica", replica, "hint", unknownHint(replica))
}

// unknownHint suggests why a topic's replica matched nothing.
func unknownHint(replica string) string {
	host, _, err := net.SplitHostPort(replica)
	if err == nil && net.ParseIP(host) != nil {
		return "the engine names itself by IP address (kv@$(POD_IP):port@model); if the fleet names this replica " +
			"by a DNS name, set the replica's kv_topic to \"" + replica + "\" or name it by this host:port"
	}
	return "no replica's name, kv_topic or URL host:port is \"" + replica + "\"; set the replica's kv_topic " +
		"to it, or change the engine's --kv-events-config topic to kv@<replica host:port>@<model>"
}
