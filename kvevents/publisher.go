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

// ReplayFraming selects how the publisher's replay endpoint frames replies.
type ReplayFraming int

const (
	// ReplayWithTopic frames replies like live messages, [topic, seq,
	// payload] after the delimiter, as vLLM ≥ 0.26 does. It is the zero
	// value.
	ReplayWithTopic ReplayFraming = iota
	// ReplayLegacy frames replies as [seq, payload] after the delimiter, as
	// vLLM ≤ 0.25 does.
	ReplayLegacy
)

// Defaults for the PublisherConfig fields left zero.
const (
	DefaultBufferSteps = 10000
	DefaultSendHWM     = 100000
	DefaultQueueSize   = 100000
)

// replayPollInterval bounds how long a replay request waits for the
// publisher goroutine when no batch is being published.
const replayPollInterval = 20 * time.Millisecond

// Sentinel errors of Publisher.Publish.
var (
	// ErrQueueFull reports a batch dropped because QueueSize batches are
	// already waiting for the socket goroutine.
	ErrQueueFull = errors.New("kvevents: publish queue full, batch dropped")
	// ErrClosed reports a Publish after Run returned or Close was called.
	ErrClosed = errors.New("kvevents: publisher closed")
)

// PublisherConfig configures a Publisher. Only Endpoint is required.
type PublisherConfig struct {
	// Endpoint is the PUB address. The socket binds when the endpoint
	// contains "*" or "::" or is ipc:// or inproc:// (vLLM's rule) and
	// connects otherwise (e.g. to a gateway's bound SUB, see Central).
	Endpoint string
	// ReplayEndpoint is the ROUTER address of the replay service; it
	// always binds. Empty means no replay endpoint.
	ReplayEndpoint string
	// Topic is frame 0 of every live message; it may be empty. See Topic.
	Topic string
	// BufferSteps is the number of past batches kept for replay; zero or
	// less means DefaultBufferSteps.
	BufferSteps int
	// Format is the event layout of payloads; the zero value is FormatMap.
	Format Format
	// ReplayFraming selects the framing of replay replies; the zero value
	// is ReplayWithTopic.
	ReplayFraming ReplayFraming
	// SendHWM is the send high-water mark of the PUB socket (beyond it
	// libzmq drops messages for a slow subscriber) and of the ROUTER; zero
	// or less means DefaultSendHWM.
	SendHWM int
	// QueueSize bounds the batches queued in front of the socket goroutine;
	// when it is full Publish drops the batch and counts it. Zero or less
	// means DefaultQueueSize.
	QueueSize int
	// FirstSeq is the sequence number of the first batch after Run starts
	// and after each Reset. vLLM numbers from 0, the default;
	// llm-d-inference-sim numbers from 1.
	FirstSeq uint64
	// Logger receives warnings (malformed replay requests, send errors);
	// nil discards them.
	Logger *slog.Logger
}

// Publisher publishes KV-event batches the way a vLLM engine does: live on
// a PUB socket as [topic, seq, payload] with seq counting from 0, and, when
// configured, replayed on request from a bounded ring buffer over a ROUTER
// socket. The simulator uses it. PublisherConfig.FirstSeq moves the first
// sequence number, as some publishers other than vLLM do.
//
// NewPublisher creates, binds or connects the sockets; Run is the one
// goroutine that uses them from then on (starting it is the happens-before
// edge that hands them over). Publish, Reset, DropNext, Dropped, Endpoint
// and ReplayEndpoint are safe for concurrent use, also with Run.
type Publisher struct {
	cfg            PublisherConfig
	log            *slog.Logger
	topic          []byte
	endpoint       string
	replayEndpoint string

	// pub and router belong to the goroutine running Run once it started,
	// before that to NewPublisher and Close.
	pub    *zmq.Socket
	router *zmq.Socket

	mu      sync.Mutex // guards nextSeq, queue, state
	nextSeq uint64     // sequence number of the next published batch
	queue   []pubItem  // batches and resets waiting for Run
	state   pubState
	wake    chan struct{} // capacity 1; signals queue activity to Run

	dropped  atomic.Uint64
	sent     atomic.Uint64 // live batches handed to the PUB socket (or skipped); read by tests
	dropNext atomic.Int64  // live sends still to skip, see DropNext

	// skipLive, when set before Run, makes Run buffer but not send the
	// batches for which it returns true (tests simulate loss with it).
	skipLive func(seq uint64) bool
}

type pubState int

const (
	pubNew pubState = iota
	pubRunning
	pubClosed
)

type pubItem struct {
	seq     uint64
	payload []byte
	reset   bool
}

// NewPublisher validates cfg, fills in defaults, and creates the PUB socket
// (bound or connected) and the ROUTER socket (bound) in zctx, so that
// address errors surface here and ephemeral ports are known. It starts no
// goroutine: call Run, or Close if Run will never be called. zctx must not
// be nil; terminate it only after Run returned or Close was called.
func NewPublisher(zctx *zmq.Context, cfg PublisherConfig) (*Publisher, error) {
	if zctx == nil {
		return nil, errors.New("kvevents: new publisher: nil zmq context")
	}
	if cfg.Endpoint == "" {
		return nil, errors.New("kvevents: new publisher: empty endpoint")
	}
	if cfg.Format != FormatMap && cfg.Format != FormatArray {
		return nil, fmt.Errorf("kvevents: new publisher: unknown format %d", int(cfg.Format))
	}
	if cfg.ReplayFraming != ReplayWithTopic && cfg.ReplayFraming != ReplayLegacy {
		return nil, fmt.Errorf("kvevents: new publisher: unknown replay framing %d", int(cfg.ReplayFraming))
	}
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = DefaultBufferSteps
	}
	if cfg.SendHWM <= 0 {
		cfg.SendHWM = DefaultSendHWM
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	p := &Publisher{
		cfg:     cfg,
		log:     loggerOrDiscard(cfg.Logger),
		topic:   []byte(cfg.Topic),
		wake:    make(chan struct{}, 1),
		nextSeq: cfg.FirstSeq,
	}
	var err error
	p.pub, p.endpoint, err = openSocket(zctx, zmq.PUB, cfg.Endpoint, bindsEndpoint(cfg.Endpoint), func(s *zmq.Socket) error {
		return s.SetSndhwm(cfg.SendHWM)
	})
	if err != nil {
		return nil, fmt.Errorf("kvevents: new publisher: %w", err)
	}
	if cfg.ReplayEndpoint != "" {
		p.router, p.replayEndpoint, err = openSocket(zctx, zmq.ROUTER, cfg.ReplayEndpoint, true, func(s *zmq.Socket) error {
			return s.SetSndhwm(cfg.SendHWM)
		})
		if err != nil {
			p.pub.Close()
			return nil, fmt.Errorf("kvevents: new publisher: replay: %w", err)
		}
	}
	return p, nil
}

// openSocket creates a socket with linger 0, applies opts, then binds or
// connects it. It returns the actual endpoint: what libzmq reports as
// ZMQ_LAST_ENDPOINT after a bind (so "tcp://127.0.0.1:*" resolves to the
// chosen port and "tcp://*:5557" reads "tcp://0.0.0.0:5557"), or endpoint
// itself after a connect.
func openSocket(zctx *zmq.Context, typ zmq.Type, endpoint string, bind bool, opts func(*zmq.Socket) error) (*zmq.Socket, string, error) {
	s, err := zctx.NewSocket(typ)
	if err != nil {
		return nil, "", fmt.Errorf("new %v socket: %w", typ, err)
	}
	if err := s.SetLinger(0); err != nil {
		s.Close()
		return nil, "", fmt.Errorf("set linger: %w", err)
	}
	if opts != nil {
		if err := opts(s); err != nil {
			s.Close()
			return nil, "", fmt.Errorf("set %v socket options: %w", typ, err)
		}
	}
	if !bind {
		if err := s.Connect(endpoint); err != nil {
			s.Close()
			return nil, "", fmt.Errorf("connect %v to %s: %w", typ, endpoint, err)
		}
		return s, endpoint, nil
	}
	if err := s.Bind(endpoint); err != nil {
		s.Close()
		return nil, "", fmt.Errorf("bind %v to %s: %w", typ, endpoint, err)
	}
	actual, err := s.GetLastEndpoint()
	if err != nil || actual == "" {
		actual = endpoint
	}
	return s, actual, nil
}

// Endpoint returns the PUB socket's address: after a bind, the address
// libzmq reports (ephemeral ports resolved; a wildcard host reads
// 0.0.0.0), after a connect, the configured endpoint.
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint returns the bound address of the replay ROUTER, resolved
// like Endpoint, or "" when there is none.
func (p *Publisher) ReplayEndpoint() string { return p.replayEndpoint }

// Dropped returns the number of batches Publish dropped because the queue
// was full.
func (p *Publisher) Dropped() uint64 { return p.dropped.Load() }

// Publish encodes b and queues it for the socket goroutine. Sequence
// numbers are assigned in the order of Publish calls (a dropped batch takes
// none, as in vLLM, where the sending thread numbers batches). It never
// blocks: when QueueSize batches are waiting it drops b and returns
// ErrQueueFull. It returns ErrClosed after Run returned or Close was
// called. Batches queued before Run starts are sent once it does. Publish
// is safe for concurrent use.
func (p *Publisher) Publish(b Batch) error {
	payload, err := Encode(b, p.cfg.Format)
	if err != nil {
		return fmt.Errorf("kvevents: publish: %w", err)
	}
	p.mu.Lock()
	if p.state == pubClosed {
		p.mu.Unlock()
		return ErrClosed
	}
	if len(p.queue) >= p.cfg.QueueSize {
		p.mu.Unlock()
		p.dropped.Add(1)
		return ErrQueueFull
	}
	p.queue = append(p.queue, pubItem{seq: p.nextSeq, payload: payload})
	p.nextSeq++
	p.mu.Unlock()
	p.notify()
	return nil
}

// Reset simulates an engine restart: the next published batch gets
// sequence number FirstSeq (0 by default) and the replay buffer is
// emptied. It is ordered with
// respect to Publish: batches published before Reset keep their numbers
// and are still sent; they are gone from the replay buffer once the socket
// goroutine reaches the reset. Reset never blocks and is safe for
// concurrent use.
func (p *Publisher) Reset() {
	p.mu.Lock()
	p.nextSeq = p.cfg.FirstSeq
	if p.state != pubClosed {
		p.queue = append(p.queue, pubItem{reset: true})
	}
	p.mu.Unlock()
	p.notify()
}

func (p *Publisher) notify() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Close releases the sockets of a Publisher whose Run was never called.
// It is a no-op once Run has started (Run closes the sockets when it
// returns). Close is safe for concurrent use.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != pubNew {
		return nil
	}
	p.state = pubClosed
	p.queue = nil
	return p.closeSockets()
}

func (p *Publisher) closeSockets() error {
	err := p.pub.Close()
	if p.router != nil {
		err = errors.Join(err, p.router.Close())
	}
	if err != nil {
		return fmt.Errorf("kvevents: publisher close: %w", err)
	}
	return nil
}

// Run is the goroutine that owns the publisher's sockets. It sends queued
// batches as [topic, seq (8 bytes, big-endian), payload], keeps the last
// BufferSteps of them, and answers replay requests on the ROUTER (checked
// after every send and at least every 20 ms): a request [identity, "",
// start_seq (8 bytes, big-endian)] gets one reply per buffered batch with
// seq ≥ start_seq, in order, framed per ReplayFraming, then the end marker
// (seq EndSeq, empty payload; with ReplayWithTopic an empty topic frame
// too). Requests of any other shape are logged and ignored.
//
// Run returns ctx.Err() when ctx ends, discarding batches still queued, or
// an error when the PUB socket fails; either way it closes both sockets.
// Run may be called once, and not after Close.
func (p *Publisher) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.state != pubNew {
		p.mu.Unlock()
		return errors.New("kvevents: publisher: Run called twice or after Close")
	}
	p.state = pubRunning
	p.mu.Unlock()

	defer func() {
		p.mu.Lock()
		p.state = pubClosed
		p.queue = nil
		p.mu.Unlock()
		if err := p.closeSockets(); err != nil {
			p.log.Warn("kvevents: publisher close", "err", err)
		}
	}()

	ring := newRing(p.cfg.BufferSteps)
	var poller *zmq.Poller
	if p.router != nil {
		poller = zmq.NewPoller()
		poller.Add(p.router, zmq.POLLIN)
	}
	var tick <-chan time.Time // replay requests have no wake-up of their own
	if p.router != nil {
		ticker := time.NewTicker(replayPollInterval)
		defer ticker.Stop()
		tick = ticker.C
	}
	var batch []pubItem
	for {
		p.mu.Lock()
		batch, p.queue = p.queue, batch[:0]
		p.mu.Unlock()
		for i, it := range batch {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if it.reset {
				ring.clear()
			} else {
				if err := p.send(it); err != nil {
					return err
				}
				ring.push(it)
				p.sent.Add(1)
			}
			batch[i] = pubItem{} // drop the payload reference
		}
		if poller != nil {
			p.serveReplays(poller, ring)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.wake:
		case <-tick:
		}
	}
}

// DropNext makes Run keep the next n batches it sends for replay without
// sending them live, as libzmq drops messages for a subscriber past the
// send high-water mark: subscribers see a sequence gap. It simulates loss
// (for the simulator and tests); n ≤ 0 cancels drops still pending.
func (p *Publisher) DropNext(n int) { p.dropNext.Store(int64(max(n, 0))) }

// skipSend reports whether the live send of seq is dropped.
func (p *Publisher) skipSend(seq uint64) bool {
	if p.skipLive != nil && p.skipLive(seq) {
		return true
	}
	for {
		n := p.dropNext.Load()
		if n <= 0 {
			return false
		}
		if p.dropNext.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// send writes one live message.
func (p *Publisher) send(it pubItem) error {
	if p.skipSend(it.seq) {
		return nil
	}
	if _, err := p.pub.SendMessage(p.topic, seqFrame(it.seq), it.payload); err != nil {
		if zmq.AsErrno(err) == zmq.ETERM {
			return fmt.Errorf("kvevents: publisher: send: %w", err)
		}
		// PUB sockets drop rather than block; anything else is transient.
		p.log.Warn("kvevents: publisher send failed", "seq", it.seq, "err", err)
	}
	return nil
}

// serveReplays answers the replay requests waiting on the ROUTER, a bounded
// number per call so live sends are not starved.
func (p *Publisher) serveReplays(poller *zmq.Poller, ring *ring) {
	for range 16 {
		polled, err := poller.Poll(0)
		if err != nil || len(polled) == 0 {
			if err != nil {
				p.log.Warn("kvevents: replay poll failed", "err", err)
			}
			return
		}
		frames, err := p.router.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			if zmq.AsErrno(err) != zmq.Errno(11) { // EAGAIN
				p.log.Warn("kvevents: replay receive failed", "err", err)
			}
			return
		}
		if len(frames) != 3 || len(frames[2]) != 8 {
			p.log.Warn("kvevents: ignoring malformed replay request", "frames", len(frames))
			continue
		}
		id := frames[0]
		start, _ := ParseSeq(frames[2])
		n := 0
		ring.from(start, func(it pubItem) {
			p.replyReplay(id, it.seq, it.payload)
			n++
		})
		p.replyReplay(id, EndSeq, nil)
		p.log.Debug("kvevents: served replay", "start", start, "batches", n)
	}
}

func (p *Publisher) replyReplay(id []byte, seq uint64, payload []byte) {
	var err error
	if payload == nil {
		payload = []byte{}
	}
	if p.cfg.ReplayFraming == ReplayLegacy {
		_, err = p.router.SendMessage(id, []byte{}, seqFrame(seq), payload)
	} else {
		topic := p.topic
		if seq == EndSeq {
			topic = []byte{}
		}
		_, err = p.router.SendMessage(id, []byte{}, topic, seqFrame(seq), payload)
	}
	if err != nil {
		p.log.Warn("kvevents: replay reply failed", "seq", seq, "err", err)
	}
}

// ring is a bounded buffer of the last published batches, oldest first.
type ring struct {
	items []pubItem
	start int // index of the oldest item
	n     int
}

func newRing(size int) *ring { return &ring{items: make([]pubItem, size)} }

func (r *ring) push(it pubItem) {
	it.reset = false
	if r.n < len(r.items) {
		r.items[(r.start+r.n)%len(r.items)] = it
		r.n++
		return
	}
	r.items[r.start] = it
	r.start = (r.start + 1) % len(r.items)
}

func (r *ring) clear() {
	clear(r.items)
	r.start, r.n = 0, 0
}

// from calls fn for each buffered item with seq ≥ start, oldest first.
// Sequence numbers in the ring are consecutive, so it starts at an offset.
func (r *ring) from(start uint64, fn func(pubItem)) {
	if r.n == 0 {
		return
	}
	first := r.items[r.start].seq
	skip := 0
	if start > first {
		if start-first >= uint64(r.n) {
			return
		}
		skip = int(start - first)
	}
	for i := skip; i < r.n; i++ {
		fn(r.items[(r.start+i)%len(r.items)])
	}
}

func loggerOrDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
