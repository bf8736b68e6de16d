package kvevents

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Handler receives the decoded event stream. Subscriber and Central call
// it from their Run goroutine only, so an implementation shared by several
// of them must be safe for concurrent use, but sees each (replica,
// data-parallel rank) stream from one goroutine at a time. A Handler that
// also implements RankClearer is told to clear ranks apart.
type Handler interface {
	// Apply receives batches of one replica in sequence order per
	// data-parallel rank (Batch.Rank).
	Apply(replica string, b Batch)
	// Clear drops everything known about the replica (engine restart,
	// unrepairable gap). It is not called on a RankClearer.
	Clear(replica string)
}

// RankClearer is a Handler that keeps what each data-parallel rank of a
// replica contributed apart. When the Handler implements it, Subscriber
// and Central call ClearRank instead of Clear, so that a rank's restart,
// unrepairable gap or first batch drops only that rank's state, and the
// replica's other ranks keep theirs (and their sequence state).
type RankClearer interface {
	// ClearRank drops what the replica's rank contributed. rank is
	// Batch.Rank of that rank's batches (NoRank when they carry none).
	ClearRank(replica string, rank int)
}

// HandlerFuncs adapts a pair of functions to Handler; a nil function
// ignores its calls.
type HandlerFuncs struct {
	ApplyFunc func(replica string, b Batch)
	ClearFunc func(replica string)
}

// Apply calls h.ApplyFunc if it is set.
func (h HandlerFuncs) Apply(replica string, b Batch) {
	if h.ApplyFunc != nil {
		h.ApplyFunc(replica, b)
	}
}

// Clear calls h.ClearFunc if it is set.
func (h HandlerFuncs) Clear(replica string) {
	if h.ClearFunc != nil {
		h.ClearFunc(replica)
	}
}

var _ Handler = HandlerFuncs{}

// Defaults for the SubscriberConfig and CentralConfig fields left zero.
const (
	DefaultRecvHWM           = 100000
	DefaultReplayTimeout     = 30 * time.Second
	DefaultReplayIdleTimeout = 2 * time.Second
	DefaultMaxPending        = 10000
)

// pollInterval bounds how late a subscriber's loop notices an expired
// replay (it wakes this often while one runs, and for a socket readiness
// cannot watch), and how long the relay blocks in zmq_poll.
const pollInterval = 50 * time.Millisecond

// syncOptions are the settings Subscriber and Central share.
type syncOptions struct {
	replayTimeout time.Duration
	replayIdle    time.Duration
	maxPending    int
	recvHWM       int
}

func (o *syncOptions) fill() {
	if o.replayTimeout <= 0 {
		o.replayTimeout = DefaultReplayTimeout
	}
	if o.replayIdle <= 0 {
		o.replayIdle = DefaultReplayIdleTimeout
	}
	if o.maxPending <= 0 {
		o.maxPending = DefaultMaxPending
	}
	if o.recvHWM <= 0 {
		o.recvHWM = DefaultRecvHWM
	}
}

// sequencer turns live messages into an in-order, gap-free stream per
// source (replica and DP rank), replaying over DEALER sockets when it can
// and telling the handler to forget a replica when it cannot. It belongs to
// one Run goroutine, which also owns the DEALER sockets it creates.
type sequencer struct {
	zctx     *zmq.Context
	h        Handler
	rc       RankClearer // h, when it clears ranks apart; else nil
	m        *Metrics
	log      *slog.Logger
	opts     syncOptions
	replayEP func(replica string, dpRank *int) string // nil or "" = no replay

	replicas map[string]*replicaState
	replays  []*replay // in flight, in start order
	logLimit logLimiter
}

type replicaState struct {
	// joined is set at the replica's first message, when the handler is
	// told to drop whatever an earlier subscriber left for it. With a
	// RankClearer, each source joins on its own instead.
	joined bool
	// dirty is true when the handler may hold state for the replica that
	// a Clear would drop: initially (an earlier subscriber may have left
	// some) and after every Apply. With a RankClearer, each source keeps
	// its own.
	dirty   bool
	sources map[int]*source // by DP rank; NoRank for nil
}

// source is the sequence state of one (replica, DP rank) stream.
type source struct {
	replica string
	rank    *int
	joined  bool   // as replicaState.joined, per source (RankClearer only)
	dirty   bool   // as replicaState.dirty, per source (RankClearer only)
	synced  bool   // last is valid
	last    uint64 // seq of the last batch applied
	// haveLive and lastLive track the live stream alone: it never goes
	// backwards unless the engine restarted.
	haveLive bool
	lastLive uint64
	replay   *replay
	pending  []seqBatch // live batches that arrived during the replay
}

type seqBatch struct {
	seq uint64
	b   Batch
}

type replay struct {
	src      *source
	sock     *zmq.Socket
	endpoint string
	from     uint64 // requested start
	next     uint64 // next seq expected
	got      int    // batches applied
	lost     bool   // batches were missing; the handler was told to Clear
	// redo is set when a Clear of another rank of the replica wiped what
	// this replay applied; the source then resyncs from 0 afterwards.
	redo     bool
	deadline time.Time
	idle     time.Time
}

func newSequencer(zctx *zmq.Context, h Handler, m *Metrics, log *slog.Logger, opts syncOptions,
	replayEP func(replica string, dpRank *int) string) *sequencer {
	rc, _ := h.(RankClearer)
	return &sequencer{
		zctx: zctx, h: h, rc: rc, m: m, log: log, opts: opts, replayEP: replayEP,
		replicas: make(map[string]*replicaState),
	}
}

// message handles one live message [topic, seq, payload] of replica.
func (s *sequencer) message(replica string, frames [][]byte, now time.Time) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		s.m.malformedMsg(replica)
		s.logLimited(now, "kvevents: malformed message", "replica", replica, "frames", len(frames))
		return
	}
	seq, _ := ParseSeq(frames[1])
	b, st, err := Decode(frames[2])
	if err != nil {
		// The seq is not consumed: the next batch shows a gap, and the
		// replay (or the Clear) repairs it.
		s.m.decodeError(replica)
		s.logLimited(now, "kvevents: undecodable batch", "replica", replica, "seq", seq, "err", err)
		return
	}
	s.m.decoded(replica, st)
	s.live(s.source(replica, b.DPRank), seqBatch{seq, b}, now)
}

func (s *sequencer) source(replica string, rank *int) *source {
	rs := s.replicas[replica]
	if rs == nil {
		rs = &replicaState{dirty: true, sources: make(map[int]*source)}
		s.replicas[replica] = rs
	}
	k := NoRank
	if rank != nil {
		k = *rank
	}
	src := rs.sources[k]
	if src == nil {
		src = &source{replica: replica, dirty: true}
		if rank != nil {
			r := *rank
			src.rank = &r
		}
		rs.sources[k] = src
	}
	return src
}

// live handles one live batch of src.
func (s *sequencer) live(src *source, sb seqBatch, now time.Time) {
	if rp := src.replay; rp != nil {
		src.pending = append(src.pending, sb)
		if len(src.pending) > s.opts.maxPending {
			s.log.Warn("kvevents: too many batches buffered during replay", "replica", src.replica, "pending", len(src.pending))
			s.finishReplay(rp, ReplayFailed, now)
		}
		return
	}
	if !src.synced {
		// Joining the stream: mid-stream (seq > 0) replays from 0.
		if s.rc != nil {
			if !src.joined {
				src.joined = true
				s.clear(src, ClearJoin)
			}
		} else if rs := s.replicas[src.replica]; !rs.joined {
			rs.joined = true
			s.clear(src, ClearJoin)
		}
		if sb.seq > 0 && s.canReplay(src) {
			s.startReplay(src, 0, sb, now)
			return
		}
		src.haveLive, src.lastLive = true, sb.seq
		s.apply(src, sb, true, now)
		return
	}
	if src.haveLive {
		if sb.seq < src.lastLive {
			s.m.restart(src.replica)
			s.log.Info("kvevents: engine restart detected", "replica", src.replica, "dp_rank", rankLabel(src.rank),
				"seq", sb.seq, "last_live_seq", src.lastLive)
			s.clear(src, ClearRestart)
			src.synced, src.haveLive = false, false
			s.live(src, sb, now)
			return
		}
		if sb.seq == src.lastLive {
			s.m.duplicate(src.replica)
			return
		}
	}
	if sb.seq > src.last+1 {
		s.m.gap(src.replica)
		if s.canReplay(src) {
			s.log.Debug("kvevents: gap, replaying", "replica", src.replica, "from", src.last+1, "seq", sb.seq)
			s.startReplay(src, src.last+1, sb, now)
			return
		}
		s.log.Info("kvevents: gap without replay, forgetting replica", "replica", src.replica, "from", src.last+1, "seq", sb.seq)
		s.clear(src, ClearGap)
	}
	src.haveLive, src.lastLive = true, sb.seq
	if src.synced && sb.seq <= src.last {
		s.m.duplicate(src.replica) // already replayed
		return
	}
	s.apply(src, sb, true, now)
}

func (s *sequencer) apply(src *source, sb seqBatch, live bool, now time.Time) {
	s.h.Apply(src.replica, sb.b)
	s.replicas[src.replica].dirty = true
	src.dirty = true
	src.synced, src.last = true, sb.seq
	s.m.applied(src.replica, &sb.b, sb.seq, live, now)
}

// clear tells the handler to forget what src contributed, unless nothing
// was applied since the last clear. A RankClearer forgets src's rank
// alone. Otherwise the Clear also wipes what the replica's other DP ranks
// contributed, so they resync: from 0 on their next batch (with replay),
// or once their running replay ends.
func (s *sequencer) clear(src *source, reason string) {
	if s.rc != nil {
		if !src.dirty {
			return
		}
		rank := NoRank
		if src.rank != nil {
			rank = *src.rank
		}
		s.rc.ClearRank(src.replica, rank)
		src.dirty = false
		s.m.clear(src.replica, reason)
		return
	}
	rs := s.replicas[src.replica]
	if !rs.dirty {
		return
	}
	s.h.Clear(src.replica)
	rs.dirty = false
	s.m.clear(src.replica, reason)
	for _, o := range rs.sources {
		if o == src {
			continue
		}
		if o.replay != nil {
			o.replay.redo = true
		} else if o.synced {
			o.synced, o.haveLive = false, false
		}
	}
}

func (s *sequencer) canReplay(src *source) bool {
	return s.replayEP != nil && s.replayEP(src.replica, src.rank) != ""
}

// startReplay asks src's replay endpoint for every batch from seq from on,
// buffering trigger (and what arrives meanwhile) until the replay ends.
func (s *sequencer) startReplay(src *source, from uint64, trigger seqBatch, now time.Time) {
	rp := &replay{
		src: src, endpoint: s.replayEP(src.replica, src.rank), from: from, next: from,
		deadline: now.Add(s.opts.replayTimeout), idle: now.Add(s.opts.replayIdle),
	}
	src.replay = rp
	src.pending = append(src.pending, trigger)
	sock, err := s.dialReplay(rp.endpoint, from)
	if err != nil {
		s.log.Warn("kvevents: replay request failed", "replica", src.replica, "endpoint", rp.endpoint, "err", err)
		s.finishReplay(rp, ReplayFailed, now)
		return
	}
	rp.sock = sock
	s.replays = append(s.replays, rp)
}

func (s *sequencer) dialReplay(endpoint string, from uint64) (*zmq.Socket, error) {
	sock, _, err := openSocket(s.zctx, zmq.DEALER, endpoint, false, func(sk *zmq.Socket) error {
		return sk.SetRcvhwm(s.opts.recvHWM)
	})
	if err != nil {
		return nil, err
	}
	// A connecting DEALER queues the request until the connection is up.
	if _, err := sock.SendMessageDontwait([]byte{}, seqFrame(from)); err != nil {
		sock.Close()
		return nil, fmt.Errorf("send replay request: %w", err)
	}
	return sock, nil
}

// replayReadable drains the replies waiting on sock.
func (s *sequencer) replayReadable(sock *zmq.Socket, now time.Time) {
	i := slices.IndexFunc(s.replays, func(rp *replay) bool { return rp.sock == sock })
	if i < 0 {
		return // finished meanwhile
	}
	rp := s.replays[i]
	for rp.src.replay == rp {
		frames, err := sock.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			if isEAGAIN(err) {
				return
			}
			s.log.Warn("kvevents: replay receive failed", "replica", rp.src.replica, "err", err)
			s.finishReplay(rp, ReplayFailed, now)
			return
		}
		rp.idle = now.Add(s.opts.replayIdle)
		seq, payload, end, ok := parseReplayReply(frames)
		switch {
		case !ok:
			s.m.malformedMsg(rp.src.replica)
			s.logLimited(now, "kvevents: malformed replay reply", "replica", rp.src.replica, "frames", len(frames))
		case end:
			result := ReplayOK
			if rp.got == 0 || rp.lost {
				result = ReplayIncomplete
			}
			s.finishReplay(rp, result, now)
		default:
			s.replayed(rp, seq, payload, now)
		}
	}
}

// parseReplayReply reads a reply as a DEALER sees it: the empty delimiter,
// then [seq, payload] (vLLM ≤ 0.25) or [topic, seq, payload] (vLLM ≥ 0.26).
// The end marker has an empty payload (and seq EndSeq).
func parseReplayReply(frames [][]byte) (seq uint64, payload []byte, end, ok bool) {
	if len(frames) > 0 && len(frames[0]) == 0 {
		frames = frames[1:]
	}
	if len(frames) != 2 && len(frames) != 3 {
		return 0, nil, false, false
	}
	payload = frames[len(frames)-1]
	seq, err := ParseSeq(frames[len(frames)-2])
	if err != nil {
		return 0, nil, len(payload) == 0, len(payload) == 0
	}
	if len(payload) == 0 || seq == EndSeq {
		return seq, nil, true, true
	}
	return seq, payload, false, true
}

func (s *sequencer) replayed(rp *replay, seq uint64, payload []byte, now time.Time) {
	src := rp.src
	if seq < rp.next {
		return
	}
	if rp.got == 0 && rp.from == 0 && !rp.lost {
		// A replay from the start returns what the publisher still holds,
		// from its first retained batch: not every publisher numbers from
		// 0 (llm-d-inference-sim starts at 1), and a long-running one has
		// dropped its oldest batches. Both are all there is to have.
		rp.next = seq
	}
	if seq > rp.next {
		// Older batches are gone from the publisher's buffer, or a hole.
		s.log.Info("kvevents: replay incomplete, forgetting replica", "replica", src.replica,
			"want_seq", rp.next, "got_seq", seq)
		rp.lost = true
		s.clear(src, ClearReplayLoss)
	}
	rp.next = seq + 1
	b, st, err := Decode(payload)
	if err != nil {
		s.m.decodeError(src.replica)
		s.logLimited(now, "kvevents: undecodable replayed batch", "replica", src.replica, "seq", seq, "err", err)
		rp.lost = true
		s.clear(src, ClearReplayLoss)
		return
	}
	s.m.decoded(src.replica, st)
	rp.got++
	s.apply(src, seqBatch{seq, b}, false, now)
}

// finishReplay ends rp and feeds the batches buffered meanwhile through
// live, in order; those the replay covered are dropped there as
// duplicates.
func (s *sequencer) finishReplay(rp *replay, result string, now time.Time) {
	src := rp.src
	if rp.sock != nil {
		rp.sock.Close()
		rp.sock = nil
	}
	s.replays = slices.DeleteFunc(s.replays, func(r *replay) bool { return r == rp })
	src.replay = nil
	s.m.replay(src.replica, result)
	s.log.Debug("kvevents: replay finished", "replica", src.replica, "from", rp.from, "batches", rp.got, "result", result)

	pending := src.pending
	src.pending = nil
	switch {
	case result == ReplayFailed || rp.got == 0:
		// What was missing stays missing: forget the replica and go on
		// from the first buffered batch, without replaying again.
		s.clear(src, ClearReplayLoss)
		if len(pending) > 0 {
			if p0 := pending[0].seq; !src.synced || p0 > src.last+1 {
				src.synced, src.last = p0 > 0, p0-1
			}
		}
	case rp.redo:
		src.synced, src.haveLive = false, false
	}
	for i, sb := range pending {
		if s.covered(src, sb) {
			// Replayed already: the live copy is expected, not a duplicate.
			src.haveLive, src.lastLive = true, sb.seq
		} else {
			s.live(src, sb, now)
		}
		pending[i] = seqBatch{}
	}
}

// covered reports whether a live batch buffered during src's replay was
// applied by the replay: src is in sync past it, and it does not take the
// live stream backwards (which would be a restart).
func (s *sequencer) covered(src *source, sb seqBatch) bool {
	return src.replay == nil && src.synced && sb.seq <= src.last && (!src.haveLive || sb.seq > src.lastLive)
}

// expire fails replays past their overall or idle deadline.
func (s *sequencer) expire(now time.Time) {
	for _, rp := range slices.Clone(s.replays) {
		if now.After(rp.deadline) || now.After(rp.idle) {
			s.log.Warn("kvevents: replay timed out", "replica", rp.src.replica, "endpoint", rp.endpoint, "from", rp.from, "batches", rp.got)
			s.finishReplay(rp, ReplayFailed, now)
		}
	}
}

// sockets returns the replay sockets, in a new slice.
func (s *sequencer) sockets() []*zmq.Socket {
	out := make([]*zmq.Socket, 0, len(s.replays)+2)
	for _, rp := range s.replays {
		out = append(out, rp.sock)
	}
	return out
}

// close closes the replay sockets; the sequencer is done.
func (s *sequencer) close() {
	for _, rp := range s.replays {
		rp.sock.Close()
		rp.sock = nil
		rp.src.replay = nil
	}
	s.replays = nil
}

func (s *sequencer) logLimited(now time.Time, msg string, args ...any) {
	if n, ok := s.logLimit.allow(now); ok {
		if n > 0 {
			args = append(args, "suppressed", n)
		}
		s.log.Warn(msg, args...)
	}
}

// logLimiter lets one message through per interval and counts the rest.
type logLimiter struct {
	next       time.Time
	suppressed int
}

const logInterval = 5 * time.Second

func (l *logLimiter) allow(now time.Time) (suppressed int, ok bool) {
	if now.Before(l.next) {
		l.suppressed++
		return 0, false
	}
	n := l.suppressed
	l.suppressed = 0
	l.next = now.Add(logInterval)
	return n, true
}

func isEAGAIN(err error) bool {
	return zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN)
}

func isETERM(err error) bool {
	return zmq.AsErrno(err) == zmq.ETERM || errors.Is(err, zmq.ErrorContextClosed)
}
