package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/internal/backoff"
)

// RelayConfig configures a Relay. Bind and Publish are required.
type RelayConfig struct {
	// Bind is the address the relay's SUB socket binds and engines' PUB
	// sockets connect to (the endpoint in their --kv-events-config), e.g.
	// "tcp://*:5557".
	Bind string
	// Ranks is the number of addresses bound, for data-parallel engines,
	// whose rank r dials the configured port + r: the relay binds Bind
	// offset by 0…Ranks−1 (see OffsetEndpoint). Zero or less means 1.
	Ranks int
	// Publish is the address the relay's XPUB socket binds and subscribers
	// (gateways' Centrals with CentralConfig.Connect) connect to, e.g.
	// "tcp://*:5560".
	Publish string
	// Subscribe is the topic prefix relayed; empty relays every message.
	Subscribe string
	// RecvHWM is the receive high-water mark of the SUB sockets; zero or
	// less means DefaultRecvHWM.
	RecvHWM int
	// SendHWM is the send high-water mark of the XPUB socket, per
	// subscriber (beyond it libzmq drops messages for that subscriber,
	// which it sees as a sequence gap and repairs by a replay); zero or
	// less means DefaultSendHWM.
	SendHWM int
	// Metrics records counters; nil records nothing.
	Metrics *RelayMetrics
	// Logger receives warnings; nil discards them.
	Logger *slog.Logger
}

// Relay lets any number of subscribers follow engines whose PUB sockets
// connect (llm-d-inference-sim always, vLLM for a non-wildcard endpoint):
// only one process can bind the address they dial, so the relay binds it
// with a SUB socket and republishes every message unchanged (topic,
// sequence and payload frames) on an XPUB socket that subscribers connect
// to. It does not decode, reorder or buffer: subscribers track sequence
// numbers themselves, and their replays go straight to each engine's
// ROUTER, which the relay never sees. A subscriber the XPUB drops
// messages for (past SendHWM) sees a gap and replays it.
//
// NewRelay binds the sockets; Run is the one goroutine that uses them.
type Relay struct {
	zctx    *zmq.Context
	cfg     RelayConfig
	log     *slog.Logger
	binds   []string
	publish string

	mu    sync.Mutex // guards subs, pub and state until Run takes over
	subs  []*zmq.Socket
	pub   *zmq.Socket
	state pubState
}

// NewRelay validates cfg and binds the SUB sockets and the XPUB socket,
// so address errors surface here and ephemeral ports are known. It starts
// no goroutine: call Run, or Close if Run will never be called. zctx must
// not be nil and must outlive Run.
func NewRelay(zctx *zmq.Context, cfg RelayConfig) (*Relay, error) {
	switch {
	case zctx == nil:
		return nil, errors.New("kvevents: new relay: nil zmq context")
	case cfg.Bind == "" || cfg.Publish == "":
		return nil, errors.New("kvevents: new relay: want a bind and a publish address")
	}
	if cfg.Ranks < 1 {
		cfg.Ranks = 1
	}
	if cfg.RecvHWM <= 0 {
		cfg.RecvHWM = DefaultRecvHWM
	}
	if cfg.SendHWM <= 0 {
		cfg.SendHWM = DefaultSendHWM
	}
	r := &Relay{zctx: zctx, cfg: cfg, log: loggerOrDiscard(cfg.Logger)}
	var err error
	r.pub, r.publish, err = openSocket(zctx, zmq.XPUB, cfg.Publish, true, func(s *zmq.Socket) error {
		if err := s.SetSndhwm(cfg.SendHWM); err != nil {
			return err
		}
		return s.SetXpubVerboser(1) // every (un)subscription, for the subscriber gauge
	})
	if err != nil {
		return nil, fmt.Errorf("kvevents: new relay: publish: %w", err)
	}
	for rank := range cfg.Ranks {
		sock, ep, err := r.openSub(OffsetEndpoint(cfg.Bind, rank))
		if err != nil {
			r.closeSockets()
			return nil, fmt.Errorf("kvevents: new relay: rank %d: %w", rank, err)
		}
		r.subs = append(r.subs, sock)
		r.binds = append(r.binds, ep)
	}
	return r, nil
}

func (r *Relay) openSub(endpoint string) (*zmq.Socket, string, error) {
	return openSocket(r.zctx, zmq.SUB, endpoint, true, func(s *zmq.Socket) error {
		if err := s.SetRcvhwm(r.cfg.RecvHWM); err != nil {
			return err
		}
		return s.SetSubscribe(r.cfg.Subscribe)
	})
}

// Endpoints returns the bound SUB addresses, in rank order, as libzmq
// reports them (ephemeral ports resolved; a wildcard host reads 0.0.0.0).
func (r *Relay) Endpoints() []string { return r.binds }

// PublishEndpoint returns the bound XPUB address, resolved like Endpoints.
func (r *Relay) PublishEndpoint() string { return r.publish }

// Close releases the sockets of a Relay whose Run was never called; it is
// a no-op once Run has started. It is safe for concurrent use.
func (r *Relay) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != pubNew {
		return nil
	}
	r.state = pubClosed
	if err := r.closeSockets(); err != nil {
		return fmt.Errorf("kvevents: relay close: %w", err)
	}
	return nil
}

func (r *Relay) closeSockets() error {
	var err error
	for _, s := range r.subs {
		if s != nil {
			err = errors.Join(err, s.Close())
		}
	}
	if r.pub != nil {
		err = errors.Join(err, r.pub.Close())
	}
	r.subs, r.pub = nil, nil
	return err
}

// Run relays messages until ctx ends, then returns ctx.Err(). It is the
// only goroutine touching the relay's sockets. A SUB socket that fails is
// closed and bound again after a short backoff; Run returns another error
// when the XPUB socket fails or the zmq context is terminated. It closes
// its sockets before returning. Run may be called once, and not after
// Close.
func (r *Relay) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.state != pubNew {
		r.mu.Unlock()
		return errors.New("kvevents: relay: Run called twice or after Close")
	}
	r.state = pubRunning
	r.mu.Unlock()
	defer func() {
		if err := r.closeSockets(); err != nil {
			r.log.Warn("kvevents: relay close", "err", err)
		}
	}()
	retryAt := make([]time.Time, len(r.subs))
	bos := make([]backoff.Backoff, len(r.subs))
	for i := range bos {
		bos[i] = backoff.Backoff{Min: minBackoff, Max: maxBackoff, Jitter: true}
	}
	for ctx.Err() == nil {
		now := time.Now()
		poller := zmq.NewPoller()
		poller.Add(r.pub, zmq.POLLIN)
		for i, s := range r.subs {
			if s == nil && !now.Before(retryAt[i]) {
				s, _, err := r.openSub(r.binds[i])
				if err != nil {
					if isETERM(err) {
						return fmt.Errorf("kvevents: relay: %w", err)
					}
					r.log.Warn("kvevents: relay cannot bind SUB socket", "endpoint", r.binds[i], "err", err)
					retryAt[i] = now.Add(bos[i].Next())
				}
				r.subs[i] = s
			}
			if r.subs[i] != nil {
				poller.Add(r.subs[i], zmq.POLLIN)
			}
		}
		polled, err := poller.Poll(pollInterval)
		if err != nil {
			return fmt.Errorf("kvevents: relay: poll: %w", err)
		}
		for _, p := range polled {
			if p.Socket == r.pub {
				if err := r.subscriptions(); err != nil {
					return err
				}
				continue
			}
			for i, s := range r.subs {
				if s != p.Socket {
					continue
				}
				if err := r.forward(s); err != nil {
					if isETERM(err) {
						return fmt.Errorf("kvevents: relay: %w", err)
					}
					r.log.Warn("kvevents: relay receive failed, binding the SUB socket again", "endpoint", r.binds[i], "err", err)
					s.Close()
					r.subs[i] = nil
					retryAt[i] = time.Now().Add(bos[i].Next())
				} else {
					bos[i].Reset()
				}
			}
		}
	}
	return ctx.Err()
}

// forward republishes the messages waiting on sub, at most maxDrain, and
// returns a receive error other than EAGAIN. A failed send is counted and
// dropped: an XPUB drops rather than blocks, and subscribers repair gaps.
func (r *Relay) forward(sub *zmq.Socket) error {
	m := r.cfg.Metrics
	for range maxDrain {
		frames, err := sub.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			if isEAGAIN(err) {
				return nil
			}
			return err
		}
		if _, err := r.pub.SendMessageDontwait(frames); err != nil {
			m.dropped()
			if isETERM(err) {
				return err
			}
			continue
		}
		m.relayed(frames)
	}
	return nil
}

// subscriptions reads the XPUB's (un)subscription messages: a first byte
// of 1 subscribes, 0 unsubscribes (also sent for a subscriber that goes
// away).
func (r *Relay) subscriptions() error {
	for range maxDrain {
		msg, err := r.pub.RecvBytes(zmq.DONTWAIT)
		if err != nil {
			if isEAGAIN(err) {
				return nil
			}
			return fmt.Errorf("kvevents: relay: XPUB receive: %w", err)
		}
		if len(msg) > 0 {
			r.cfg.Metrics.subscription(msg[0] == 1)
		}
	}
	return nil
}

// RelayMetrics holds a Relay's Prometheus metrics, named warmpath_kvrelay_*.
// A nil *RelayMetrics records nothing; its methods are safe for concurrent
// use.
type RelayMetrics struct {
	messages      prometheus.Counter
	bytes         prometheus.Counter
	malformed     prometheus.Counter
	drops         prometheus.Counter
	subscriptions prometheus.Gauge
	last          prometheus.Gauge
}

// NewRelayMetrics creates the metrics and registers them on reg, which may
// be nil to leave them unregistered; collectors already registered there
// are reused. It panics if reg holds a different collector under one of
// these names.
func NewRelayMetrics(reg prometheus.Registerer) *RelayMetrics {
	counter := func(name, help string) prometheus.Counter {
		return register(reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: "warmpath", Subsystem: "kvrelay", Name: name, Help: help}))
	}
	gauge := func(name, help string) prometheus.Gauge {
		return register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "warmpath", Subsystem: "kvrelay", Name: name, Help: help}))
	}
	return &RelayMetrics{
		messages:      counter("messages_total", "KV-event messages republished."),
		bytes:         counter("bytes_total", "Bytes of the KV-event messages republished, all frames."),
		malformed:     counter("malformed_messages_total", "Republished messages without 3 frames and an 8-byte sequence number (subscribers drop them)."),
		drops:         counter("send_errors_total", "Messages the XPUB socket refused to send (dropped)."),
		subscriptions: gauge("subscriptions", "Topic subscriptions of the connected subscribers (one per subscriber and prefix)."),
		last:          gauge("last_message_timestamp_seconds", "Unix time of the last message republished."),
	}
}

func (m *RelayMetrics) relayed(frames [][]byte) {
	if m == nil {
		return
	}
	m.messages.Inc()
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	m.bytes.Add(float64(n))
	if len(frames) != 3 || len(frames[1]) != 8 {
		m.malformed.Inc()
	}
	m.last.Set(float64(time.Now().UnixNano()) / 1e9)
}

func (m *RelayMetrics) dropped() {
	if m != nil {
		m.drops.Inc()
	}
}

func (m *RelayMetrics) subscription(subscribe bool) {
	if m == nil {
		return
	}
	if subscribe {
		m.subscriptions.Inc()
	} else {
		m.subscriptions.Dec()
	}
}
