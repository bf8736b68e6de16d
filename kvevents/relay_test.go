package kvevents

import (
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmpath/warmpath/internal/testrun"
)

// TestCentralUnknownReplica feeds a central whose Resolve knows one of
// three engines' topic names: batches of the others are dropped (not
// indexed under a replica that does not exist), counted by topic, and
// warned about once per name with a hint.
func TestCentralUnknownReplica(t *testing.T) {
	zctx := newZCtx(t)
	rec := &recorder{}
	reg := prometheus.NewRegistry()
	logs := &logSink{}
	c, err := NewCentral(zctx, CentralConfig{
		Bind: "tcp://127.0.0.1:*", Handler: rec, Metrics: NewMetrics(reg), Logger: slog.New(logs),
		Resolve: func(name string) (string, bool) {
			if name == "10.0.0.1:8000" {
				return "replica-a", true // e.g. matched on replicas[].kv_topic
			}
			return "", false
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "central", c.Run)
	var feeders []*feeder
	for i, topic := range []string{Topic("10.0.0.1:8000", "m"), Topic("10.0.0.9:8000", "m"), Topic("pod-x.svc:8000", "m")} {
		p := newTestPublisher(t, zctx, PublisherConfig{Endpoint: c.Endpoint(), Topic: topic}, nil)
		f := &feeder{t: t, p: p}
		if i == 0 {
			f.rec = rec // the others' batches reach no handler
		}
		feeders = append(feeders, f)
	}
	unknown := func(topic string) float64 {
		return metricValue(t, reg, "warmpath_kvevents_unknown_replica_batches_total", map[string]string{"topic": topic})
	}
	// Counts, not ids: without a replay endpoint, what the slow joiner
	// loses stays lost.
	publishUntil(t, "5 batches of every topic", func() bool {
		ids, _ := rec.applied("replica-a")
		return len(ids) >= 5 && unknown("kv@10.0.0.9:8000@m") >= 5 && unknown("kv@pod-x.svc:8000@m") >= 5
	}, feeders...)
	for _, o := range rec.snapshot() {
		if o.replica != "replica-a" {
			t.Fatalf("handler saw replica %q", o.replica)
		}
	}
	if n := logs.count("not in the fleet"); n != 2 {
		t.Errorf("%d warnings about unknown replicas; want 2 (one per name)", n)
	}
	hints := logs.attrs("hint")
	if len(hints) != 2 || !strings.Contains(hints[0]+hints[1], "by IP address") || !strings.Contains(hints[0]+hints[1], "kv_topic") {
		t.Errorf("hints %q", hints)
	}
}

// TestUnknownTopicLabelsBounded keeps the topic label of unknown-replica
// batches to maxTopicLabels values.
func TestUnknownTopicLabelsBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	for i := range maxTopicLabels + 10 {
		m.unknownReplica(fmt.Sprintf("kv@10.0.%d.1:8000@m", i))
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "warmpath_kvevents_unknown_replica_batches_total" && len(mf.GetMetric()) != maxTopicLabels+1 {
			t.Errorf("%d series; want %d topics and %q", len(mf.GetMetric()), maxTopicLabels, OtherTopic)
		}
	}
	if got := metricValue(t, reg, "warmpath_kvevents_unknown_replica_batches_total", map[string]string{"topic": OtherTopic}); got != 10 {
		t.Errorf("other = %v; want 10", got)
	}
}

// rawSub is a SUB socket on a relay's publish endpoint, for checking what
// it sends.
func rawSub(t *testing.T, zctx *zmq.Context, endpoint string) *zmq.Socket {
	t.Helper()
	s, _, err := openSocket(zctx, zmq.SUB, endpoint, false, func(s *zmq.Socket) error { return s.SetSubscribe("") })
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetRcvtimeo(20 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestRelay runs one relay between two connecting publishers and two
// connect-mode centrals plus a raw subscriber: messages come out
// unchanged, every central sees every batch of both engines, a batch lost
// on one engine's live stream is replayed straight from that engine, and
// the relay counts its subscriptions.
func TestRelay(t *testing.T) {
	zctx := newZCtx(t)
	reg := prometheus.NewRegistry()
	relay, err := NewRelay(zctx, RelayConfig{Bind: "tcp://127.0.0.1:*", Publish: "tcp://127.0.0.1:*", Metrics: NewRelayMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "relay", relay.Run)

	replays := map[string]string{}
	var skip atomic.Int64
	skip.Store(-1)
	var feeders []*feeder
	for i, name := range []string{"e1", "e2"} {
		var lose func(uint64) bool
		if i == 0 {
			lose = func(seq uint64) bool { return int64(seq) == skip.Load() }
		}
		p := newTestPublisher(t, zctx, PublisherConfig{Endpoint: relay.Endpoints()[0], ReplayEndpoint: "tcp://127.0.0.1:*",
			Topic: Topic(name, "m")}, lose)
		replays[name] = p.ReplayEndpoint()
		feeders = append(feeders, &feeder{t: t, p: p, next: uint64(i) << 20})
	}
	var recs []*recorder
	for range 2 {
		rec := &recorder{}
		c, err := NewCentral(zctx, CentralConfig{Connect: relay.PublishEndpoint(), Handler: rec, Metrics: NewMetrics(nil),
			ReplayEndpoint: func(r string) string { return replays[r] }, ReplayIdleTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if c.Endpoint() != relay.PublishEndpoint() {
			t.Errorf("connect-mode Endpoint() = %q; want %q", c.Endpoint(), relay.PublishEndpoint())
		}
		testrun.Start(t, "central", c.Run)
		recs = append(recs, rec)
	}
	for _, f := range feeders {
		f.rec = recs[0]
	}
	raw := rawSub(t, zctx, relay.PublishEndpoint())
	publishUntil := func(what string, cond func() bool) {
		t.Helper()
		publishUntil(t, what, cond, feeders...)
	}
	both := func(id uint64) bool { return recs[0].has("e1", id) && recs[1].has("e1", id) }
	publishUntil("both centrals", func() bool { return both(5) && recs[0].has("e2", 1<<20+5) && recs[1].has("e2", 1<<20+5) })

	lost := feeders[0].next + 2
	skip.Store(int64(lost))
	publishUntil("the batch after the lost one", func() bool { return both(lost + 2) })

	for _, rec := range recs {
		for _, name := range []string{"e1", "e2"} {
			ids, _ := rec.applied(name)
			checkConsecutive(t, name, ids, ids[0])
		}
		if !rec.has("e1", lost) {
			t.Errorf("lost batch %d not replayed", lost)
		}
	}

	// The raw subscriber sees the publishers' frames as they sent them:
	// each batch's only hash is its publisher's base plus its seq.
	for n := 0; n < 20; {
		feeders[1].publish(1)
		frames, err := raw.RecvMessageBytes(0)
		if err != nil {
			continue
		}
		n++
		base := map[string]uint64{Topic("e1", "m"): 0, Topic("e2", "m"): 1 << 20}
		b0, ok := base[string(frames[0])]
		if len(frames) != 3 || !ok || len(frames[1]) != 8 {
			t.Fatalf("relayed frames %q", frames)
		}
		seq, _ := ParseSeq(frames[1])
		if b, _, err := Decode(frames[2]); err != nil || b.Events[0].(*BlockStored).BlockHashes[0] != b0+seq {
			t.Fatalf("relayed payload of %s seq %d: %v, %v", frames[0], seq, b, err)
		}
	}
	if n := metricValue(t, reg, "warmpath_kvrelay_subscriptions", nil); n != 3 {
		t.Errorf("subscriptions = %v; want 3 (two centrals, one raw)", n)
	}
	if n := metricValue(t, reg, "warmpath_kvrelay_messages_total", nil); n == 0 {
		t.Error("messages_total = 0")
	}
}

// TestRelayConfigErrors checks NewRelay's validation.
func TestRelayConfigErrors(t *testing.T) {
	zctx := newZCtx(t)
	for _, cfg := range []RelayConfig{{}, {Bind: "tcp://127.0.0.1:*"}, {Publish: "tcp://127.0.0.1:*"},
		{Bind: "bogus://", Publish: "tcp://127.0.0.1:*"}, {Bind: "tcp://127.0.0.1:*", Publish: "bogus://"}} {
		if r, err := NewRelay(zctx, cfg); err == nil {
			r.Close()
			t.Errorf("NewRelay(%+v) succeeded", cfg)
		}
	}
	if _, err := NewRelay(nil, RelayConfig{Bind: "tcp://127.0.0.1:*", Publish: "tcp://127.0.0.1:*"}); err == nil {
		t.Error("NewRelay(nil context) succeeded")
	}
	r, err := NewRelay(zctx, RelayConfig{Bind: "tcp://127.0.0.1:*", Publish: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Run(t.Context()); err == nil {
		t.Error("Run after Close succeeded")
	}
	for _, cfg := range []CentralConfig{{Bind: "tcp://127.0.0.1:*", Connect: "tcp://127.0.0.1:1", Handler: HandlerFuncs{}}} {
		if c, err := NewCentral(zctx, cfg); err == nil {
			c.Close()
			t.Errorf("NewCentral(%+v) succeeded", cfg)
		}
	}
}

// onFreePorts calls try with base ports from a seeded sequence until it
// succeeds (binding base and the ports after it), failing the test after
// 50 tries.
func onFreePorts(t *testing.T, try func(base int) error) {
	t.Helper()
	var err error
	for i := range 50 {
		base := 20000 + (i*7919+int(time.Now().UnixNano()%1000))%40000
		if err = try(base); err == nil {
			return
		}
	}
	t.Fatalf("no free ports: %v", err)
}

// TestCentralRanksBindPortPlusRank binds a central for two-rank engines
// whose PUB sockets connect: rank r dials the configured port + r (as
// vLLM offsets connecting endpoints), so the central binds both.
func TestCentralRanksBindPortPlusRank(t *testing.T) {
	zctx := newZCtx(t)
	rec := &rankRecorder{}
	var c *Central
	onFreePorts(t, func(base int) (err error) {
		c, err = NewCentral(zctx, CentralConfig{Bind: fmt.Sprintf("tcp://127.0.0.1:%d", base), Ranks: 2, Handler: rec})
		return err
	})
	if eps := c.Endpoints(); len(eps) != 2 || eps[1] != OffsetEndpoint(eps[0], 1) {
		t.Fatalf("endpoints %v; want port and port+1", eps)
	}
	testrun.Start(t, "central", c.Run)
	var feeders []*feeder
	for rank := range 2 {
		p := newTestPublisher(t, zctx, PublisherConfig{Endpoint: OffsetEndpoint(c.Endpoint(), rank), Topic: Topic("a", "m")}, nil)
		feeders = append(feeders, &feeder{t: t, p: p, next: uint64(rank) << 20, rank: rank, rec: &rec.recorder})
	}
	publishUntil(t, "3 batches of each rank", func() bool {
		return rec.countRange("a", 0, 1<<20) >= 3 && rec.countRange("a", 1<<20, 2<<20) >= 3
	}, feeders...)
}
