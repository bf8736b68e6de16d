package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmpath/warmpath/internal/testrun"
)

// waitFor bounds every wait-for-condition in these tests. It is generous:
// the CI box has two shared cores and runs with -race.
const waitFor = 15 * time.Second

// newZCtx returns a private zmq context, terminated when the test ends
// (after the Run goroutines registered later have returned).
func newZCtx(t *testing.T) *zmq.Context {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := zctx.Term(); err != nil {
			t.Errorf("zmq context term: %v", err)
		}
	})
	return zctx
}

// op is one handler call.
type op struct {
	clear   bool
	replica string
	id      uint64 // the batch's first block hash: its index in the test
}

func (o op) String() string {
	if o.clear {
		return "clear(" + o.replica + ")"
	}
	return fmt.Sprintf("%s:%d", o.replica, o.id)
}

// recorder is a Handler that logs every call.
type recorder struct {
	mu  sync.Mutex
	ops []op
	// arrived gets a token at every call, without blocking: what
	// publishUntil waits on. It is made by arrivals.
	arrived chan struct{}
}

func (r *recorder) Apply(replica string, b Batch) {
	id := uint64(1 << 62) // marks a batch without a BlockStored
	if len(b.Events) > 0 {
		if e, ok := b.Events[0].(*BlockStored); ok && len(e.BlockHashes) > 0 {
			id = e.BlockHashes[0]
		}
	}
	r.add(op{replica: replica, id: id})
}

func (r *recorder) Clear(replica string) {
	r.add(op{clear: true, replica: replica})
}

// add logs o and signals its arrival.
func (r *recorder) add(o op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, o)
	if r.arrived == nil {
		return
	}
	select {
	case r.arrived <- struct{}{}:
	default: // a token is already waiting
	}
}

// seen reports whether a batch with id was applied, for any replica.
func (r *recorder) seen(id uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range r.ops {
		if !o.clear && o.id == id {
			return true
		}
	}
	return false
}

// arrivals returns a channel that gets a token when the handler is called
// (one token for several calls while nobody takes it).
func (r *recorder) arrivals() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.arrived == nil {
		r.arrived = make(chan struct{}, 1)
	}
	return r.arrived
}

func (r *recorder) snapshot() []op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// applied returns the ids applied for replica, and how many clears it saw.
func (r *recorder) applied(replica string) (ids []uint64, clears int) {
	for _, o := range r.snapshot() {
		if o.replica != replica {
			continue
		}
		if o.clear {
			clears++
		} else {
			ids = append(ids, o.id)
		}
	}
	return ids, clears
}

// countRange returns how many batches with ids in [lo, hi) replica got.
func (r *recorder) countRange(replica string, lo, hi uint64) int {
	ids, _ := r.applied(replica)
	n := 0
	for _, id := range ids {
		if id >= lo && id < hi {
			n++
		}
	}
	return n
}

// has reports whether replica had id applied.
func (r *recorder) has(replica string, id uint64) bool {
	ids, _ := r.applied(replica)
	return slices.Contains(ids, id)
}

// testBatch is batch number id of a test: one BlockStored whose hash is id.
func testBatch(id uint64) Batch { return testBatchRank(id, 0) }

func testBatchRank(id uint64, rank int) Batch {
	return Batch{
		TS:     float64(time.Now().UnixNano()) / 1e9,
		DPRank: ptr(rank),
		Events: []Event{&BlockStored{BlockHashes: []uint64{id}, TokenIDs: tokens(int(id%1000)*16, 16),
			BlockSize: 16, Medium: MediumGPU}},
	}
}

// feeder publishes test batches with increasing ids.
type feeder struct {
	t    *testing.T
	p    *Publisher
	next uint64
	rank int // DPRank of the batches
	// rec is the handler the batches reach, whose receipt publishUntil
	// waits for; nil when they reach none (only metrics count them).
	rec *recorder
}

// publishGone publishes n batches and waits until the publisher sent
// them, so that a subscriber started afterwards cannot receive them live.
func (f *feeder) publishGone(n int) {
	f.t.Helper()
	want := f.p.sent.Load() + uint64(n)
	f.publish(n)
	testrun.Eventually(f.t, waitFor, func() bool { return f.p.sent.Load() >= want }, "batches sent")
}

func (f *feeder) publish(n int) {
	f.t.Helper()
	for range n {
		if err := f.p.Publish(testBatchRank(f.next, f.rank)); err != nil {
			f.t.Fatalf("Publish: %v", err)
		}
		f.next++
	}
}

// until publishes batches until cond holds (see publishUntil).
func (f *feeder) until(what string, cond func() bool) {
	f.t.Helper()
	publishUntil(f.t, what, cond, f)
}

// settle waits until the metric name{labels} has reached want: the
// subscriber counts what it applied just after the handler returns.
func settle(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string, want float64) {
	t.Helper()
	testrun.Eventually(t, waitFor, func() bool { return metricValue(t, reg, name, labels) >= want }, name)
}

// resend is how long publishUntil waits for a probe to arrive before it
// sends the next one.
const resend = 20 * time.Millisecond

// publishUntil is these tests' subscribe handshake: it publishes one batch
// (a probe) from each feeder, waits until each probe has reached its
// feeder's handler, and repeats until cond holds.
//
// A ZMQ SUB has no handshake that tells when its subscription took effect
// (the slow joiner): the subscription travels to the PUB as a message after
// the connection is up, and whatever the PUB sends before it has arrived
// is dropped without a trace. Neither of the other signals says when that
// is: the socket monitor's EVENT_HANDSHAKE_SUCCEEDED marks the end of the
// ZMTP greeting, which comes before the subscription message, so a batch
// sent right after it can still be lost; and only an XPUB sees
// subscriptions, while Publisher is a PUB as vLLM's is. A replay does not
// help either: the subscriber asks for one only once a live batch has
// reached it. What is reliable is receipt itself, and live traffic is also
// what makes a subscriber notice that it joined late, a gap or a restart.
//
// Waiting for each probe keeps the test in lockstep with delivery: when
// cond holds, no batch is still on its way, so the handler calls the test
// reads next are settled (the metrics of the last one follow just after
// it: see settle). resend only re-sends when a probe
// did not arrive: dropped before the subscription took effect, dropped by
// the test on purpose, or sent by a feeder whose batches reach no handler.
func publishUntil(t testing.TB, what string, cond func() bool, feeders ...*feeder) {
	t.Helper()
	deadline := time.NewTimer(waitFor)
	defer deadline.Stop()
	retry := time.NewTimer(resend)
	defer retry.Stop()
	for !cond() {
		retry.Reset(resend)
		type probe struct {
			rec *recorder
			id  uint64
		}
		var wait []probe
		for _, f := range feeders {
			if f.rec != nil {
				wait = append(wait, probe{f.rec, f.next})
			}
			f.publish(1)
		}
	probes:
		for _, p := range wait {
			for !p.rec.seen(p.id) {
				select {
				case <-p.rec.arrivals():
				case <-retry.C:
					break probes
				case <-deadline.C:
					t.Fatalf("timed out after %v waiting for %s", waitFor, what)
				}
			}
		}
		if len(wait) == 0 {
			select {
			case <-retry.C:
			case <-deadline.C:
				t.Fatalf("timed out after %v waiting for %s", waitFor, what)
			}
		}
	}
}

func newTestPublisher(t *testing.T, zctx *zmq.Context, cfg PublisherConfig, skip func(uint64) bool) *Publisher {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:*"
	}
	p, err := NewPublisher(zctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.skipLive = skip
	testrun.Start(t, "publisher", p.Run)
	return p
}

func newTestSubscriber(t *testing.T, zctx *zmq.Context, cfg SubscriberConfig) (stop func()) {
	t.Helper()
	if cfg.Replica == "" {
		cfg.Replica = "r1"
	}
	if cfg.ReplayIdleTimeout == 0 {
		cfg.ReplayIdleTimeout = 5 * time.Second
	}
	s, err := NewSubscriber(zctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return testrun.Start(t, "subscriber", s.Run)
}

// checkConsecutive fails unless ids are from, from+1, … in order.
func checkConsecutive(t *testing.T, what string, ids []uint64, from uint64) {
	t.Helper()
	for i, id := range ids {
		if id != from+uint64(i) {
			t.Fatalf("%s: batch %d has id %d; want %d (ids %v)", what, i, id, from+uint64(i), ids)
		}
	}
}

// metricValue sums the samples of the named metric whose labels include
// labels.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue metrics
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func TestSubscriberDelivery(t *testing.T) {
	for _, format := range []Format{FormatMap, FormatArray} {
		for _, framing := range []ReplayFraming{ReplayWithTopic, ReplayLegacy} {
			t.Run(fmt.Sprintf("%s/framing%d", format, framing), func(t *testing.T) {
				zctx := newZCtx(t)
				var skip atomic.Int64
				skip.Store(-1)
				p := newTestPublisher(t, zctx, PublisherConfig{
					ReplayEndpoint: "tcp://127.0.0.1:*", Topic: Topic("r1", "m"), Format: format, ReplayFraming: framing,
				}, func(seq uint64) bool { return int64(seq) == skip.Load() })
				reg := prometheus.NewRegistry()
				rec := &recorder{}
				f := &feeder{t: t, p: p, rec: rec}

				// Join mid-stream: these batches go out before anyone listens.
				f.publishGone(10)
				newTestSubscriber(t, zctx, SubscriberConfig{
					Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Topic: "kv@",
					Handler: rec, Metrics: NewMetrics(reg),
				})
				f.until("batch 12 delivered", func() bool { return rec.has("r1", 12) })

				// Lose one live batch: the subscriber replays it.
				lost := f.next + 2
				skip.Store(int64(lost))
				f.until("batches after the lost one", func() bool { return rec.has("r1", lost+3) })

				ids, clears := rec.applied("r1")
				checkConsecutive(t, "delivery", ids, 0)
				if ops := rec.snapshot(); !ops[0].clear || clears != 1 {
					t.Errorf("got %d clears, first op %v; want exactly one clear, first (join)", clears, ops[0])
				}
				if got := metricValue(t, reg, "warmpath_kvevents_gaps_total", nil); got != 1 {
					t.Errorf("gaps_total = %v; want 1", got)
				}
				// Run counts a batch just after the handler has it.
				settle(t, reg, "warmpath_kvevents_events_total", map[string]string{"type": TypeBlockStored}, float64(len(ids)))
				if got := metricValue(t, reg, "warmpath_kvevents_replays_total", map[string]string{"result": ReplayOK}); got != 2 {
					t.Errorf("replays_total{result=ok} = %v; want 2 (join, gap)", got)
				}
				if got := metricValue(t, reg, "warmpath_kvevents_events_total", map[string]string{"type": TypeBlockStored}); got != float64(len(ids)) {
					t.Errorf("events_total = %v; want %d", got, len(ids))
				}
				if got := metricValue(t, reg, "warmpath_kvevents_lag_seconds", nil); got == 0 {
					t.Error("lag_seconds has no samples")
				}
			})
		}
	}
}

func TestSubscriberRestart(t *testing.T) {
	for _, tt := range []struct {
		name     string
		loseZero bool // the new stream's seq 0 never arrives live
	}{{"seq 0 live", false}, {"seq 0 lost", true}} {
		t.Run(tt.name, func(t *testing.T) {
			zctx := newZCtx(t)
			var armed atomic.Bool
			p := newTestPublisher(t, zctx, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"},
				func(seq uint64) bool { return seq == 0 && armed.Load() })
			reg := prometheus.NewRegistry()
			rec := &recorder{}
			newTestSubscriber(t, zctx, SubscriberConfig{
				Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Handler: rec, Metrics: NewMetrics(reg),
			})
			f := &feeder{t: t, p: p, rec: rec}
			f.until("first batches", func() bool { return rec.has("r1", 5) })
			before := len(rec.snapshot())

			armed.Store(tt.loseZero)
			p.Reset()
			const restartBase = 1000
			f.next = restartBase
			f.until("batches after the restart", func() bool { return rec.has("r1", restartBase+5) })

			ops := rec.snapshot()
			var pre, post []uint64
			clearAt := -1
			for i, o := range ops {
				switch {
				case i == 0 || (o.clear && clearAt < 0 && i >= before):
					if !o.clear {
						t.Fatalf("op %d is %v; want a clear", i, o)
					}
					if i > 0 {
						clearAt = i
					}
				case o.clear:
					t.Fatalf("unexpected clear at op %d: %v", i, ops)
				case clearAt < 0:
					pre = append(pre, o.id)
				default:
					post = append(post, o.id)
				}
			}
			if clearAt < 0 {
				t.Fatalf("no clear after the restart: %v", ops)
			}
			checkConsecutive(t, "before restart", pre, 0)
			checkConsecutive(t, "after restart", post, restartBase)
			if got := metricValue(t, reg, "warmpath_kvevents_restarts_total", nil); got != 1 {
				t.Errorf("restarts_total = %v; want 1", got)
			}
		})
	}
}

func TestSubscriberGapWithoutReplay(t *testing.T) {
	zctx := newZCtx(t)
	var skip atomic.Int64
	skip.Store(-1)
	p := newTestPublisher(t, zctx, PublisherConfig{}, func(seq uint64) bool { return int64(seq) == skip.Load() })
	reg := prometheus.NewRegistry()
	rec := &recorder{}
	newTestSubscriber(t, zctx, SubscriberConfig{Endpoint: p.Endpoint(), Handler: rec, Metrics: NewMetrics(reg)})
	f := &feeder{t: t, p: p, rec: rec}
	var first uint64
	f.until("first batch", func() bool {
		ids, _ := rec.applied("r1")
		if len(ids) > 0 {
			first = ids[0]
		}
		return len(ids) > 0
	})
	lost := f.next + 2
	skip.Store(int64(lost))
	f.until("batches after the gap", func() bool { return rec.has("r1", lost+3) })

	var segs [][]uint64
	for _, o := range rec.snapshot() {
		if o.clear {
			segs = append(segs, nil)
			continue
		}
		if len(segs) == 0 {
			t.Fatal("batch applied before the join clear")
		}
		segs[len(segs)-1] = append(segs[len(segs)-1], o.id)
	}
	if len(segs) != 2 {
		t.Fatalf("%d clears; want 2 (join, gap): %v", len(segs), rec.snapshot())
	}
	checkConsecutive(t, "before gap", segs[0], first)
	if want := lost - 1; segs[0][len(segs[0])-1] != want {
		t.Errorf("last batch before the gap %d; want %d", segs[0][len(segs[0])-1], want)
	}
	checkConsecutive(t, "after gap", segs[1], lost+1)
	if got := metricValue(t, reg, "warmpath_kvevents_clears_total", map[string]string{"reason": ClearGap}); got != 1 {
		t.Errorf("clears_total{reason=gap} = %v; want 1", got)
	}
}

// TestSubscriberReplayBufferOverrun joins a publisher whose replay buffer
// no longer holds batch 0, then loses more live batches than the buffer
// holds. The join replay returns everything the publisher still has and is
// complete; the gap replay cannot fill the gap and is incomplete, so the
// replica is forgotten and delivery goes on.
func TestSubscriberReplayBufferOverrun(t *testing.T) {
	zctx := newZCtx(t)
	var lose atomic.Bool
	p := newTestPublisher(t, zctx, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*", BufferSteps: 5},
		func(uint64) bool { return lose.Load() })
	reg := prometheus.NewRegistry()
	rec := &recorder{}
	f := &feeder{t: t, p: p, rec: rec}
	f.publishGone(20)
	newTestSubscriber(t, zctx, SubscriberConfig{
		Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Handler: rec, Metrics: NewMetrics(reg),
	})
	replaysOK := func() float64 {
		return metricValue(t, reg, "warmpath_kvevents_replays_total", map[string]string{"result": ReplayOK})
	}
	// The replay's batches reach the handler before Run counts the replay.
	f.until("live batches", func() bool {
		ids, _ := rec.applied("r1")
		return len(ids) >= 5 && replaysOK() >= 1
	})
	ids, _ := rec.applied("r1")
	if ids[0] == 0 {
		t.Fatalf("first batch 0, but the buffer held only 5")
	}
	checkConsecutive(t, "delivery", ids, ids[0])
	if got := replaysOK(); got != 1 {
		t.Errorf("replays_total{result=ok} = %v; want 1 (the join)", got)
	}
	if ops := rec.snapshot(); !ops[0].clear {
		t.Errorf("first op %v; want clear", ops[0])
	}

	lose.Store(true)
	f.publishGone(10)
	lose.Store(false)
	resumed := f.next
	f.until("delivery after the gap", func() bool { return rec.has("r1", resumed+2) })
	if got := metricValue(t, reg, "warmpath_kvevents_replays_total", map[string]string{"result": ReplayIncomplete}); got != 1 {
		t.Errorf("replays_total{result=incomplete} = %v; want 1 (the gap)", got)
	}
	if got := metricValue(t, reg, "warmpath_kvevents_clears_total", map[string]string{"reason": ClearReplayLoss}); got != 1 {
		t.Errorf("clears_total{reason=replay_loss} = %v; want 1", got)
	}
}

// TestSubscriberEmptyReplay serves replays from a scripted ROUTER that
// answers with the end marker alone: the subscriber must clear and go on
// from the live stream.
func TestSubscriberEmptyReplay(t *testing.T) {
	for _, framing := range []ReplayFraming{ReplayWithTopic, ReplayLegacy} {
		t.Run(fmt.Sprintf("framing%d", framing), func(t *testing.T) {
			zctx := newZCtx(t)
			router, replayEP, err := openSocket(zctx, zmq.ROUTER, "tcp://127.0.0.1:*", true, nil)
			if err != nil {
				t.Fatal(err)
			}
			var requests atomic.Int32
			testrun.Start(t, "router", func(ctx context.Context) error {
				defer router.Close()
				poller := zmq.NewPoller()
				poller.Add(router, zmq.POLLIN)
				for ctx.Err() == nil {
					if polled, _ := poller.Poll(20 * time.Millisecond); len(polled) == 0 {
						continue
					}
					req, err := router.RecvMessageBytes(0)
					if err != nil || len(req) != 3 || len(req[2]) != 8 {
						t.Errorf("bad replay request %q: %v", req, err)
						continue
					}
					requests.Add(1)
					if framing == ReplayLegacy {
						router.SendMessage(req[0], "", seqFrame(EndSeq), "")
					} else {
						router.SendMessage(req[0], "", "", seqFrame(EndSeq), "")
					}
				}
				return ctx.Err()
			})
			p := newTestPublisher(t, zctx, PublisherConfig{}, nil)
			reg := prometheus.NewRegistry()
			rec := &recorder{}
			f := &feeder{t: t, p: p, rec: rec}
			f.publishGone(3) // lost: joining later makes the subscriber ask for a replay
			newTestSubscriber(t, zctx, SubscriberConfig{
				Endpoint: p.Endpoint(), ReplayEndpoint: replayEP, Handler: rec, Metrics: NewMetrics(reg),
			})
			f.until("live delivery", func() bool {
				ids, _ := rec.applied("r1")
				return len(ids) >= 5
			})
			ids, _ := rec.applied("r1")
			checkConsecutive(t, "delivery", ids, ids[0])
			if requests.Load() != 1 {
				t.Errorf("%d replay requests; want 1", requests.Load())
			}
			if got := metricValue(t, reg, "warmpath_kvevents_replays_total", map[string]string{"result": ReplayIncomplete}); got != 1 {
				t.Errorf("replays_total{result=incomplete} = %v; want 1", got)
			}
		})
	}
}

func TestSubscriberReplayTimeout(t *testing.T) {
	zctx := newZCtx(t)
	// A bound ROUTER that never answers.
	router, replayEP, err := openSocket(zctx, zmq.ROUTER, "tcp://127.0.0.1:*", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { router.Close() })
	p := newTestPublisher(t, zctx, PublisherConfig{}, nil)
	reg := prometheus.NewRegistry()
	rec := &recorder{}
	f := &feeder{t: t, p: p, rec: rec}
	f.publishGone(3)
	newTestSubscriber(t, zctx, SubscriberConfig{
		Endpoint: p.Endpoint(), ReplayEndpoint: replayEP, Handler: rec, Metrics: NewMetrics(reg),
		ReplayIdleTimeout: 200 * time.Millisecond,
	})
	f.until("delivery after the failed replay", func() bool {
		ids, _ := rec.applied("r1")
		return len(ids) >= 5
	})
	ids, _ := rec.applied("r1")
	checkConsecutive(t, "delivery", ids, ids[0])
	if got := metricValue(t, reg, "warmpath_kvevents_replays_total", map[string]string{"result": ReplayFailed}); got != 1 {
		t.Errorf("replays_total{result=failed} = %v; want 1", got)
	}
}

func TestCentral(t *testing.T) {
	zctx := newZCtx(t)
	rec := &recorder{}
	reg := prometheus.NewRegistry()
	var pubs sync.Map // replica → *Publisher
	c, err := NewCentral(zctx, CentralConfig{
		Bind:    "tcp://127.0.0.1:*",
		Handler: rec, Metrics: NewMetrics(reg),
		ReplayEndpoint: func(replica string) string {
			if p, ok := pubs.Load(replica); ok {
				return p.(*Publisher).ReplayEndpoint()
			}
			return ""
		},
		ReplayIdleTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(c.Endpoint(), ":*") {
		t.Fatalf("Endpoint() = %q; want a resolved port", c.Endpoint())
	}
	testrun.Start(t, "central", c.Run)

	var feeders []*feeder
	for _, replica := range []string{"10.0.0.1:8000", "10.0.0.2:8000"} {
		p := newTestPublisher(t, zctx, PublisherConfig{
			Endpoint: c.Endpoint(), ReplayEndpoint: "tcp://127.0.0.1:*", Topic: Topic(replica, "qwen3"),
		}, nil)
		if p.Endpoint() != c.Endpoint() {
			t.Errorf("connecting publisher Endpoint() = %q; want %q", p.Endpoint(), c.Endpoint())
		}
		pubs.Store(replica, p)
		f := &feeder{t: t, p: p, next: 0, rec: rec}
		f.publish(5)
		feeders = append(feeders, f)
	}
	publishUntil(t, "batch 20 of both replicas", func() bool {
		return rec.has("10.0.0.1:8000", 20) && rec.has("10.0.0.2:8000", 20)
	}, feeders...)
	for _, replica := range []string{"10.0.0.1:8000", "10.0.0.2:8000"} {
		ids, clears := rec.applied(replica)
		checkConsecutive(t, replica, ids, 0)
		if clears != 1 {
			t.Errorf("%s: %d clears; want 1 (join)", replica, clears)
		}
	}
}

func TestCentralGapWithoutReplay(t *testing.T) {
	zctx := newZCtx(t)
	rec := &recorder{}
	c, err := NewCentral(zctx, CentralConfig{Bind: "tcp://127.0.0.1:*", Handler: rec})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "central", c.Run)
	var skip atomic.Int64
	skip.Store(-1)
	p := newTestPublisher(t, zctx, PublisherConfig{Endpoint: c.Endpoint(), Topic: Topic("a", "m")},
		func(seq uint64) bool { return int64(seq) == skip.Load() })
	// A publisher with another topic prefix is not heard.
	other := newTestPublisher(t, zctx, PublisherConfig{Endpoint: c.Endpoint(), Topic: "other"}, nil)
	f := &feeder{t: t, p: p, rec: rec}
	f.until("first batch", func() bool {
		(&feeder{t: t, p: other}).publish(1)
		ids, _ := rec.applied("a")
		return len(ids) > 0
	})
	lost := f.next + 2
	skip.Store(int64(lost))
	f.until("batches after the gap", func() bool { return rec.has("a", lost+2) })
	if _, clears := rec.applied("a"); clears != 2 {
		t.Errorf("%d clears; want 2 (join, gap)", clears)
	}
	for _, o := range rec.snapshot() {
		if o.replica != "a" {
			t.Fatalf("handler saw replica %q", o.replica)
		}
	}
}

// TestCentralDPRanks runs two data-parallel ranks of one replica under one
// topic: their sequence numbers are tracked apart, and a restart of one
// rank clears the replica without disturbing the other's delivery.
func TestCentralDPRanks(t *testing.T) {
	// Batch ids tell the streams apart: rank 0 from 0, rank 1 from
	// rank1Base, rank 1 after its restart from restartBase.
	const rank1Base, restartBase, end = 1 << 20, 2 << 20, 3 << 20
	zctx := newZCtx(t)
	rec := &recorder{}
	reg := prometheus.NewRegistry()
	c, err := NewCentral(zctx, CentralConfig{Bind: "tcp://127.0.0.1:*", Handler: rec, Metrics: NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "central", c.Run)
	var feeders []*feeder
	for rank := range 2 {
		p := newTestPublisher(t, zctx, PublisherConfig{Endpoint: c.Endpoint(), Topic: Topic("a", "m")}, nil)
		feeders = append(feeders, &feeder{t: t, p: p, next: uint64(rank) * rank1Base, rank: rank, rec: rec})
	}
	publishUntil := func(what string, cond func() bool) {
		t.Helper()
		publishUntil(t, what, cond, feeders...)
	}
	publishUntil("both ranks", func() bool {
		return rec.countRange("a", 0, rank1Base) >= 3 && rec.countRange("a", rank1Base, restartBase) >= 3
	})
	if got := metricValue(t, reg, "warmpath_kvevents_restarts_total", nil); got != 0 {
		t.Fatalf("restarts_total = %v with two ranks interleaved; want 0", got)
	}
	feeders[1].p.Reset()
	feeders[1].next = restartBase
	publishUntil("rank 1 after its restart", func() bool { return rec.countRange("a", restartBase, end) >= 3 })
	n0 := rec.countRange("a", 0, rank1Base)
	publishUntil("rank 0 after the clear", func() bool { return rec.countRange("a", 0, rank1Base) >= n0+3 })
	if _, clears := rec.applied("a"); clears != 2 {
		t.Errorf("%d clears; want 2 (join, restart)", clears)
	}
	if got := metricValue(t, reg, "warmpath_kvevents_restarts_total", nil); got != 1 {
		t.Errorf("restarts_total = %v; want 1", got)
	}
	// Each stream's batches stay in order.
	var r0, r1, r1b []uint64
	for _, o := range rec.snapshot() {
		switch {
		case o.clear:
		case o.id < rank1Base:
			r0 = append(r0, o.id)
		case o.id < restartBase:
			r1 = append(r1, o.id)
		default:
			r1b = append(r1b, o.id)
		}
	}
	checkConsecutive(t, "rank 0", r0, r0[0])
	checkConsecutive(t, "rank 1", r1, r1[0])
	checkConsecutive(t, "rank 1 after restart", r1b, r1b[0])
	if got := metricValue(t, reg, "warmpath_kvevents_last_seq", map[string]string{"dp_rank": "1"}); got == 0 {
		t.Error("last_seq{dp_rank=1} not set")
	}
}

// TestSubscriberBadMessages feeds a subscriber from a raw socket, each bad
// message once. The socket is an XPUB, which, unlike Publisher's PUB, sees
// the subscriber's subscription arrive: sending only after that is a real
// handshake (see publishUntil), so nothing is lost to the slow joiner and
// the counts are exact.
func TestSubscriberBadMessages(t *testing.T) {
	zctx := newZCtx(t)
	pub, ep, err := openSocket(zctx, zmq.XPUB, "tcp://127.0.0.1:*", true, func(s *zmq.Socket) error {
		return s.SetRcvtimeo(50 * time.Millisecond) // to notice the test's end
	})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rec := &recorder{}
	newTestSubscriber(t, zctx, SubscriberConfig{Endpoint: ep, Handler: rec, Metrics: NewMetrics(reg)})
	good, err := Encode(testBatch(7), FormatMap)
	if err != nil {
		t.Fatal(err)
	}
	// This goroutine owns pub from here on.
	testrun.Start(t, "raw publisher", func(ctx context.Context) error {
		defer pub.Close()
		for { // the subscription: 1, then the prefix
			msg, err := pub.RecvBytes(0)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err == nil && len(msg) > 0 && msg[0] == 1 {
				break
			}
			if err != nil && zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
				return fmt.Errorf("receive the subscription: %w", err)
			}
		}
		for _, m := range [][][]byte{
			{[]byte("t"), seqFrame(0)},                       // 2 frames
			{[]byte("t"), {0, 0, 0, 1}, good},                // short seq
			{[]byte("t"), seqFrame(0), {0x93, 0xc1}},         // undecodable
			{[]byte("t"), seqFrame(1), good, []byte("more")}, // 4 frames
		} {
			if _, err := pub.SendMessage(m); err != nil {
				return err
			}
		}
		<-ctx.Done()
		return ctx.Err()
	})
	malformed := func() float64 { return metricValue(t, reg, "warmpath_kvevents_malformed_messages_total", nil) }
	undecodable := func() float64 { return metricValue(t, reg, "warmpath_kvevents_decode_errors_total", nil) }
	testrun.Eventually(t, waitFor, func() bool { return malformed() >= 3 && undecodable() >= 1 }, "bad messages counted")
	if m, u := malformed(), undecodable(); m != 3 || u != 1 {
		t.Errorf("malformed %v, undecodable %v; want 3 and 1", m, u)
	}
	if ops := rec.snapshot(); len(ops) != 0 {
		t.Errorf("handler called: %v", ops)
	}
}

func TestPublisherAPI(t *testing.T) {
	zctx := newZCtx(t)
	p, err := NewPublisher(zctx, PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", QueueSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range []string{p.Endpoint(), p.ReplayEndpoint()} {
		if !strings.HasPrefix(ep, "tcp://127.0.0.1:") || strings.HasSuffix(ep, ":*") {
			t.Errorf("endpoint %q not resolved", ep)
		}
	}
	for i := range 2 {
		if err := p.Publish(testBatch(uint64(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Publish(testBatch(2)); !errors.Is(err, ErrQueueFull) {
		t.Errorf("Publish on a full queue = %v; want ErrQueueFull", err)
	}
	if p.Dropped() != 1 {
		t.Errorf("Dropped() = %d; want 1", p.Dropped())
	}
	if err := p.Publish(Batch{Events: []Event{nil}}); err == nil {
		t.Error("Publish of an unencodable batch succeeded")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(testBatch(3)); !errors.Is(err, ErrClosed) {
		t.Errorf("Publish after Close = %v; want ErrClosed", err)
	}
	if err := p.Run(context.Background()); err == nil {
		t.Error("Run after Close succeeded")
	}

	noReplay, err := NewPublisher(zctx, PublisherConfig{Endpoint: "tcp://127.0.0.1:1"}) // connects lazily
	if err != nil {
		t.Fatal(err)
	}
	if noReplay.Endpoint() != "tcp://127.0.0.1:1" || noReplay.ReplayEndpoint() != "" {
		t.Errorf("endpoints %q, %q; want the configured one and none", noReplay.Endpoint(), noReplay.ReplayEndpoint())
	}
	noReplay.Close()

	for _, cfg := range []PublisherConfig{
		{},
		{Endpoint: "bogus://x"},
		{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "bogus://x"},
		{Endpoint: "tcp://127.0.0.1:*", Format: 9},
	} {
		if p, err := NewPublisher(zctx, cfg); err == nil {
			p.Close()
			t.Errorf("NewPublisher(%+v) succeeded", cfg)
		}
	}
}

// TestPublisherReplayRequests talks to the replay ROUTER directly.
func TestPublisherReplayRequests(t *testing.T) {
	zctx := newZCtx(t)
	p, err := NewPublisher(zctx, PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*",
		Topic: "kv@x@m", BufferSteps: 4})
	if err != nil {
		t.Fatal(err)
	}
	f := &feeder{t: t, p: p}
	f.publish(6) // seqs 0–5; the ring keeps 2–5
	testrun.Start(t, "publisher", p.Run)

	dealer, _, err := openSocket(zctx, zmq.DEALER, p.ReplayEndpoint(), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dealer.Close()
	if err := dealer.SetRcvtimeo(waitFor); err != nil {
		t.Fatal(err)
	}
	// A malformed request is ignored; the next one is served.
	if _, err := dealer.SendMessage("", "short"); err != nil {
		t.Fatal(err)
	}
	ask := func(start uint64) (seqs []uint64) {
		t.Helper()
		if _, err := dealer.SendMessage("", seqFrame(start)); err != nil {
			t.Fatal(err)
		}
		for {
			frames, err := dealer.RecvMessageBytes(0)
			if err != nil {
				t.Fatalf("receive: %v", err)
			}
			if len(frames) != 4 || len(frames[0]) != 0 {
				t.Fatalf("reply %q; want 4 frames after a delimiter", frames)
			}
			seq, _ := ParseSeq(frames[2])
			if seq == EndSeq {
				if len(frames[1]) != 0 || len(frames[3]) != 0 {
					t.Errorf("end marker %q; want empty topic and payload", frames)
				}
				return seqs
			}
			if string(frames[1]) != "kv@x@m" {
				t.Errorf("topic %q", frames[1])
			}
			b, _, err := Decode(frames[3])
			if err != nil || b.Events[0].(*BlockStored).BlockHashes[0] != seq {
				t.Errorf("seq %d: payload %v, %v", seq, b, err)
			}
			seqs = append(seqs, seq)
		}
	}
	for _, tt := range []struct {
		start uint64
		want  []uint64
	}{{0, []uint64{2, 3, 4, 5}}, {4, []uint64{4, 5}}, {6, nil}, {1 << 40, nil}} {
		if got := ask(tt.start); !slices.Equal(got, tt.want) {
			t.Errorf("replay from %d = %v; want %v", tt.start, got, tt.want)
		}
	}
	p.Reset()
	if err := p.Publish(testBatch(0)); err != nil {
		t.Fatal(err)
	}
	testrun.Eventually(t, waitFor, func() bool { return slices.Equal(ask(0), []uint64{0}) }, "replay after reset")
}

func TestSubscriberConfigErrors(t *testing.T) {
	zctx := newZCtx(t)
	h := HandlerFuncs{}
	for _, cfg := range []SubscriberConfig{
		{Endpoint: "tcp://127.0.0.1:1", Handler: h},
		{Replica: "r", Handler: h},
		{Replica: "r", Endpoint: "tcp://127.0.0.1:1"},
	} {
		if _, err := NewSubscriber(zctx, cfg); err == nil {
			t.Errorf("NewSubscriber(%+v) succeeded", cfg)
		}
	}
	if _, err := NewSubscriber(nil, SubscriberConfig{Replica: "r", Endpoint: "tcp://127.0.0.1:1", Handler: h}); err == nil {
		t.Error("NewSubscriber(nil context) succeeded")
	}
	for _, cfg := range []CentralConfig{{Handler: h}, {Bind: "tcp://127.0.0.1:*"}, {Bind: "bogus://", Handler: h}} {
		if c, err := NewCentral(zctx, cfg); err == nil {
			c.Close()
			t.Errorf("NewCentral(%+v) succeeded", cfg)
		}
	}
}

// TestRunExitsWithoutLeaks runs every component, cancels them, and checks
// that the goroutine count returns to where it was.
func TestRunExitsWithoutLeaks(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		zctx, err := zmq.NewContext()
		if err != nil {
			t.Fatal(err)
		}
		defer zctx.Term()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		errs := make(chan error, 5)
		start := func(fn func(context.Context) error) { wg.Go(func() { errs <- fn(ctx) }) }

		rec := &recorder{}
		c, err := NewCentral(zctx, CentralConfig{Bind: "tcp://127.0.0.1:*", Handler: rec})
		if err != nil {
			t.Fatal(err)
		}
		p1, err := NewPublisher(zctx, PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"})
		if err != nil {
			t.Fatal(err)
		}
		p2, err := NewPublisher(zctx, PublisherConfig{Endpoint: c.Endpoint(), Topic: Topic("b", "m")})
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewSubscriber(zctx, SubscriberConfig{Replica: "a", Endpoint: p1.Endpoint(),
			ReplayEndpoint: p1.ReplayEndpoint(), Handler: rec})
		if err != nil {
			t.Fatal(err)
		}
		relay, err := NewRelay(zctx, RelayConfig{Bind: "tcp://127.0.0.1:*", Publish: "tcp://127.0.0.1:*", Metrics: NewRelayMetrics(nil)})
		if err != nil {
			t.Fatal(err)
		}
		start(c.Run)
		start(p1.Run)
		start(p2.Run)
		start(s.Run)
		start(relay.Run)
		f1, f2 := &feeder{t: t, p: p1, rec: rec}, &feeder{t: t, p: p2}
		f1.until("both streams", func() bool {
			f2.publish(1)
			ida, _ := rec.applied("a")
			idb, _ := rec.applied("b")
			return len(ida) >= 3 && len(idb) >= 3
		})
		cancel()
		wg.Wait()
		close(errs)
		for err := range errs {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v; want context.Canceled", err)
			}
		}
	}()
	testrun.Eventually(t, waitFor, func() bool { return runtime.NumGoroutine() <= before }, "goroutines to exit")
}

// logSink is a slog.Handler that keeps every record's message and
// attributes.
type logSink struct {
	mu   sync.Mutex
	msgs []string
	recs []map[string]string
}

func (l *logSink) Enabled(context.Context, slog.Level) bool { return true }

func (l *logSink) Handle(_ context.Context, r slog.Record) error {
	a := map[string]string{}
	r.Attrs(func(at slog.Attr) bool { a[at.Key] = at.Value.String(); return true })
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.recs = append(l.recs, a)
	l.mu.Unlock()
	return nil
}

// attrs returns the values of key over every record that has it.
func (l *logSink) attrs(key string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, a := range l.recs {
		if v, ok := a[key]; ok {
			out = append(out, v)
		}
	}
	return out
}

func (l *logSink) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logSink) WithGroup(string) slog.Handler      { return l }

// count returns how many messages contain sub.
func (l *logSink) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

// TestSubscriberFirstSeqNotZero follows a publisher that numbers batches
// from 1 (llm-d-inference-sim), fresh, joined mid-stream and restarted:
// the replays from 0 return everything the publisher has, from its first
// sequence number, and are complete. Nothing is counted as a failed replay
// or a duplicate, and the replica is not forgotten.
func TestSubscriberFirstSeqNotZero(t *testing.T) {
	for _, tt := range []struct {
		name   string
		before int // batches published before the subscriber starts
	}{{"fresh engine", 0}, {"joined mid-stream", 5}} {
		t.Run(tt.name, func(t *testing.T) {
			zctx := newZCtx(t)
			p := newTestPublisher(t, zctx, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*", FirstSeq: 1}, nil)
			reg := prometheus.NewRegistry()
			rec := &recorder{}
			logs := &logSink{}
			f := &feeder{t: t, p: p, rec: rec}
			f.publishGone(tt.before)
			newTestSubscriber(t, zctx, SubscriberConfig{
				Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Handler: rec, Metrics: NewMetrics(reg),
				Logger: slog.New(logs),
			})
			f.until("first batches", func() bool { return rec.has("r1", uint64(tt.before)+3) })
			p.Reset()
			const restartBase = 1000
			f.next = restartBase
			f.until("batches after the restart", func() bool { return rec.has("r1", restartBase+3) })

			var pre, post []uint64
			clears := 0
			for _, o := range rec.snapshot() {
				switch {
				case o.clear:
					clears++
				case clears == 1:
					pre = append(pre, o.id)
				default:
					post = append(post, o.id)
				}
			}
			checkConsecutive(t, "before the restart", pre, 0)
			checkConsecutive(t, "after the restart", post, restartBase)
			if clears != 2 {
				t.Errorf("%d clears; want 2 (join, restart): %v", clears, rec.snapshot())
			}
			for _, result := range []string{ReplayIncomplete, ReplayFailed} {
				if got := metricValue(t, reg, "warmpath_kvevents_replays_total", map[string]string{"result": result}); got != 0 {
					t.Errorf("replays_total{result=%s} = %v; want 0", result, got)
				}
			}
			if got := metricValue(t, reg, "warmpath_kvevents_duplicates_total", nil); got != 0 {
				t.Errorf("duplicates_total = %v; want 0", got)
			}
			if got := metricValue(t, reg, "warmpath_kvevents_clears_total", map[string]string{"reason": ClearReplayLoss}); got != 0 {
				t.Errorf("clears_total{reason=replay_loss} = %v; want 0", got)
			}
			if n := logs.count("replay incomplete"); n != 0 {
				t.Errorf("%d \"replay incomplete\" log lines; want 0", n)
			}
		})
	}
}

// rankRecorder is a recorder that also clears ranks apart: it logs
// ClearRank calls as clears of "replica/rank".
type rankRecorder struct {
	recorder
}

func (r *rankRecorder) ClearRank(replica string, rank int) {
	r.add(op{clear: true, replica: fmt.Sprintf("%s/%d", replica, rank)})
}

var _ RankClearer = (*rankRecorder)(nil)

// TestCentralDPRanksClearApart runs two data-parallel ranks of one
// replica under one topic with a handler that clears ranks apart: each
// rank's join clears that rank, and rank 1's restart clears rank 1 alone,
// leaving rank 0's stream in sync (no resync, no second clear), and Clear
// is never called.
func TestCentralDPRanksClearApart(t *testing.T) {
	const rank1Base, restartBase, end = 1 << 20, 2 << 20, 3 << 20
	zctx := newZCtx(t)
	rec := &rankRecorder{}
	reg := prometheus.NewRegistry()
	c, err := NewCentral(zctx, CentralConfig{Bind: "tcp://127.0.0.1:*", Handler: rec, Metrics: NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "central", c.Run)
	var feeders []*feeder
	for rank := range 2 {
		p := newTestPublisher(t, zctx, PublisherConfig{Endpoint: c.Endpoint(), Topic: Topic("a", "m")}, nil)
		feeders = append(feeders, &feeder{t: t, p: p, next: uint64(rank) * rank1Base, rank: rank, rec: &rec.recorder})
	}
	publishUntil := func(what string, cond func() bool) {
		t.Helper()
		publishUntil(t, what, cond, feeders...)
	}
	publishUntil("both ranks", func() bool {
		return rec.countRange("a", 0, rank1Base) >= 3 && rec.countRange("a", rank1Base, restartBase) >= 3
	})
	feeders[1].p.Reset()
	feeders[1].next = restartBase
	publishUntil("rank 1 after its restart", func() bool { return rec.countRange("a", restartBase, end) >= 3 })
	n0 := rec.countRange("a", 0, rank1Base)
	publishUntil("rank 0 going on", func() bool { return rec.countRange("a", 0, rank1Base) >= n0+3 })

	clears := map[string]int{}
	var r0 []uint64
	for _, o := range rec.snapshot() {
		switch {
		case o.clear:
			clears[o.replica]++
		case o.id < rank1Base:
			r0 = append(r0, o.id)
		}
	}
	if want := map[string]int{"a/0": 1, "a/1": 2}; !maps.Equal(clears, want) {
		t.Errorf("clears %v; want %v (each rank's join, rank 1's restart; never Clear)", clears, want)
	}
	checkConsecutive(t, "rank 0", r0, r0[0])
	if got := metricValue(t, reg, "warmpath_kvevents_clears_total", map[string]string{"reason": ClearRestart}); got != 1 {
		t.Errorf("clears_total{reason=restart} = %v; want 1", got)
	}
}

// TestSubscriberRankMetricsOutliveSiblings runs two subscribers for two
// data-parallel ranks of one replica on one Metrics: stopping one keeps
// the replica's series (its sibling still reports); stopping the last
// deletes them.
func TestSubscriberRankMetricsOutliveSiblings(t *testing.T) {
	zctx := newZCtx(t)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	rec := &rankRecorder{}
	var stops []func()
	var feeders []*feeder
	for rank := range 2 {
		p := newTestPublisher(t, zctx, PublisherConfig{}, nil)
		feeders = append(feeders, &feeder{t: t, p: p, next: uint64(rank) << 20, rank: rank, rec: &rec.recorder})
		stops = append(stops, newTestSubscriber(t, zctx, SubscriberConfig{Endpoint: p.Endpoint(), Handler: rec, Metrics: m}))
	}
	seen := func(rank string) bool {
		return metricValue(t, reg, "warmpath_kvevents_batches_total", map[string]string{"replica": "r1"}) > 0 &&
			len(gatherLabels(t, reg, "warmpath_kvevents_last_seq", "dp_rank", rank)) > 0
	}
	for rank, f := range feeders {
		f.until("rank's batches", func() bool { return seen(strconv.Itoa(rank)) })
	}
	stops[1]()
	if !seen("0") {
		t.Fatal("stopping rank 1's subscriber deleted rank 0's series")
	}
	stops[0]()
	if n := metricValue(t, reg, "warmpath_kvevents_batches_total", map[string]string{"replica": "r1"}); n != 0 {
		t.Errorf("batches_total{replica=r1} = %v after the last subscriber stopped; want the series gone", n)
	}
}

// gatherLabels returns the values of label on the samples of name.
func gatherLabels(t *testing.T, reg *prometheus.Registry, name, label, value string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					out = append(out, lp.GetValue())
				}
			}
		}
	}
	return out
}
