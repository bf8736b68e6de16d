package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/warmpath/warmpath/internal/backoff"
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
	open := func(int) (*zmq.Socket, error) {
		sock, _, err := openSocket(s.zctx, zmq.SUB, s.cfg.Endpoint, false, func(sk *zmq.Socket) error {
			if err := sk.SetRcvhwm(s.opts.recvHWM); err != nil {
				return err
			}
			return sk.SetSubscribe(s.cfg.Topic)
		})
		return sock, err
	}
	replica := func([]byte, time.Time) (string, bool) { return s.cfg.Replica, true }
	return runLoop(ctx, s.log, 1, open, seq, replica)
}

// Reconnect backoff after a socket error (jittered, see backoff.Backoff).
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// maxDrain bounds the live messages read per poll and socket, so replay
// replies and ctx are serviced under a flood.
const maxDrain = 1024

// subSocket is one SUB socket of a runLoop, re-created after a failure.
type subSocket struct {
	sock    *zmq.Socket // nil while closed
	bo      backoff.Backoff
	retryAt time.Time
}

// runLoop serves n SUB sockets (socket i from open(i), opened again after
// a failure with a backoff) and the sequencer's replay sockets until ctx
// ends, waking when one of them may be readable (readiness), when a
// closed socket is due to be opened again or, while a replay runs, every
// pollInterval for its deadlines. replica names the source of a live
// message from its topic frame, or reports false to drop it.
func runLoop(ctx context.Context, log *slog.Logger, n int, open func(i int) (*zmq.Socket, error), seq *sequencer,
	replica func(topic []byte, now time.Time) (string, bool)) error {
	subs := make([]subSocket, n)
	for i := range subs {
		subs[i].bo = backoff.Backoff{Min: minBackoff, Max: maxBackoff, Jitter: true}
	}
	defer func() {
		for _, s := range subs {
			if s.sock != nil {
				s.sock.Close()
			}
		}
	}()
	rd, err := newReadiness(ctx)
	if err != nil {
		return err
	}
	defer rd.close()
	var watchErr error // the last watch failure logged
	for ctx.Err() == nil {
		now := time.Now()
		wake, err := openSubs(subs, open, log, now)
		if err != nil {
			return err
		}
		socks := seq.sockets()
		for i := range subs {
			if subs[i].sock != nil {
				socks = append(socks, subs[i].sock)
			}
		}
		if err := rd.sync(socks); err != nil {
			// Not watchable (not seen on Linux): look every pollInterval.
			if watchErr == nil {
				log.Warn("kvevents: cannot watch a socket's descriptor; checking it every poll interval instead", "err", err, "interval", pollInterval)
			}
			watchErr, wake = err, minTime(wake, now.Add(pollInterval))
		}
		served, err := serve(subs, seq, replica, log)
		if err != nil {
			return err
		}
		seq.expire(time.Now())
		if served {
			continue // look again before waiting: ZMQ_FD signals changes, not messages
		}
		if len(seq.replays) > 0 {
			wake = minTime(wake, now.Add(pollInterval))
		}
		if err := rd.wait(wake); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
	}
	return ctx.Err()
}

// openSubs opens the SUB sockets that are closed and due, and returns
// when the next closed one is due (the zero time when none is closed).
// It returns an error only when the zmq context is terminated.
func openSubs(subs []subSocket, open func(i int) (*zmq.Socket, error), log *slog.Logger, now time.Time) (time.Time, error) {
	var wake time.Time
	for i := range subs {
		s := &subs[i]
		if s.sock == nil && !now.Before(s.retryAt) {
			sock, err := open(i)
			if err != nil {
				if isETERM(err) {
					return wake, fmt.Errorf("kvevents: subscriber: %w", err)
				}
				log.Warn("kvevents: cannot open SUB socket", "err", err)
				s.fail(now)
			}
			s.sock = sock
		}
		if s.sock == nil {
			wake = minTime(wake, s.retryAt)
		}
	}
	return wake, nil
}

// serve reads what is waiting on the SUB sockets and the replay sockets,
// and reports whether there was anything. A SUB socket that fails is
// closed, to be opened again after its backoff; an error is returned only
// when the zmq context is terminated.
func serve(subs []subSocket, seq *sequencer, replica func([]byte, time.Time) (string, bool), log *slog.Logger) (bool, error) {
	// Live messages first, as a replay's end feeds those buffered while it
	// ran: a live copy of a replayed batch read after the end counts as a
	// duplicate.
	served := false
	for i := range subs {
		s := &subs[i]
		if s.sock == nil {
			continue
		}
		ok, err := readable(s.sock)
		if ok {
			served = true
			err = drain(s, seq, replica)
		}
		if err != nil {
			if isETERM(err) {
				return served, fmt.Errorf("kvevents: subscriber: receive: %w", err)
			}
			log.Warn("kvevents: receive failed, re-creating SUB socket", "err", err)
			s.fail(time.Now())
		}
	}
	for _, sock := range seq.sockets() {
		if ok, _ := readable(sock); ok {
			seq.replayReadable(sock, time.Now())
			served = true
		}
	}
	return served, nil
}

// readable reports whether sock has a message to read now (ZMQ_EVENTS).
func readable(sock *zmq.Socket) (bool, error) {
	ev, err := sock.GetEvents()
	return ev&zmq.POLLIN != 0, err
}

// fail closes s's socket and schedules the next attempt.
func (s *subSocket) fail(now time.Time) {
	if s.sock != nil {
		s.sock.Close()
		s.sock = nil
	}
	s.retryAt = now.Add(s.bo.Next())
}

// drain reads the messages waiting on s, at most maxDrain, and hands them
// to seq. It returns a receive error other than EAGAIN.
func drain(s *subSocket, seq *sequencer, replica func([]byte, time.Time) (string, bool)) error {
	for range maxDrain {
		frames, err := s.sock.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			if isEAGAIN(err) {
				return nil
			}
			return err
		}
		s.bo.Reset()
		var topic []byte
		if len(frames) > 0 {
			topic = frames[0]
		}
		now := time.Now()
		if name, ok := replica(topic, now); ok {
			seq.message(name, frames, now)
		}
	}
	return nil
}

// minTime returns the earlier of a and b, a zero time counting as none.
func minTime(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
