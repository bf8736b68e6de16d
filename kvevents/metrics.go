package kvevents

import (
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics holds the subscriber-side Prometheus metrics, all named
// warmpath_kvevents_* and labelled by replica (unknown-replica batches by
// topic instead). A nil *Metrics records nothing. Its methods are safe for concurrent use, so one Metrics may be
// shared by every Subscriber and Central of a process.
type Metrics struct {
	events        *prometheus.CounterVec   // replica, type
	batches       *prometheus.CounterVec   // replica
	gaps          *prometheus.CounterVec   // replica
	replays       *prometheus.CounterVec   // replica, result
	restarts      *prometheus.CounterVec   // replica
	clears        *prometheus.CounterVec   // replica, reason
	duplicates    *prometheus.CounterVec   // replica
	decodeErrors  *prometheus.CounterVec   // replica
	malformed     *prometheus.CounterVec   // replica
	unknownEvents *prometheus.CounterVec   // replica
	unknownKeys   *prometheus.CounterVec   // replica
	lag           *prometheus.HistogramVec // replica
	lastSeq       *prometheus.GaugeVec     // replica, dp_rank
	unknown       *prometheus.CounterVec   // topic (bounded, see unknownReplica)

	mu     sync.Mutex      // guards users and topics
	users  map[string]int  // replica → Subscriber.Run calls in progress
	topics map[string]bool // topic label values in use by unknown
}

// maxTopicLabels bounds the topic label values of
// warmpath_kvevents_unknown_replica_batches_total; later topics are
// counted under OtherTopic.
const maxTopicLabels = 64

// OtherTopic is the topic label under which unknown-replica batches are
// counted once maxTopicLabels (64) distinct topics have been seen.
const OtherTopic = "other"

// Replay results, the values of the result label of
// warmpath_kvevents_replays_total.
const (
	// ReplayOK means every missing batch was replayed.
	ReplayOK = "ok"
	// ReplayIncomplete means the replay ended but could not fill the gap:
	// older batches were gone from the publisher's buffer, or it returned
	// nothing.
	ReplayIncomplete = "incomplete"
	// ReplayFailed means the replay timed out, could not be sent, or the
	// live batches buffered meanwhile overflowed MaxPending.
	ReplayFailed = "failed"
)

// Reasons for Handler.Clear, the values of the reason label of
// warmpath_kvevents_clears_total.
const (
	// ClearJoin is the Clear at a replica's first batch, which drops
	// whatever an earlier subscriber left for it.
	ClearJoin = "join"
	// ClearRestart follows a sequence number going backwards: the engine
	// restarted with an empty cache.
	ClearRestart = "restart"
	// ClearGap follows a gap with no replay endpoint to fill it.
	ClearGap = "gap"
	// ClearReplayLoss follows a replay that could not fill a gap.
	ClearReplayLoss = "replay_loss"
)

// NewMetrics creates the metrics and registers them on reg, which may be
// nil to leave them unregistered (never the global registry implicitly).
// Collectors already registered on reg by an earlier NewMetrics are reused,
// so NewMetrics is idempotent per registry. It panics if reg holds a
// different collector under one of these names.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "warmpath", Subsystem: "kvevents", Name: name, Help: help,
		}, labels))
	}
	return &Metrics{
		events:        counter("events_total", "KV events applied, by replica and event type.", "replica", "type"),
		batches:       counter("batches_total", "KV-event batches applied, live or replayed.", "replica"),
		gaps:          counter("gaps_total", "Sequence gaps detected in live KV-event streams.", "replica"),
		replays:       counter("replays_total", "Replay requests, by result (ok, incomplete, failed).", "replica", "result"),
		restarts:      counter("restarts_total", "Engine restarts detected by the sequence number going backwards.", "replica"),
		clears:        counter("clears_total", "Times the handler was told to forget a replica, by reason.", "replica", "reason"),
		duplicates:    counter("duplicates_total", "Batches dropped because their sequence number was already applied.", "replica"),
		decodeErrors:  counter("decode_errors_total", "Payloads that failed to decode.", "replica"),
		malformed:     counter("malformed_messages_total", "Messages without 3 frames or an 8-byte sequence number, and malformed replay replies.", "replica"),
		unknownEvents: counter("unknown_events_total", "Events skipped because of an unknown tag.", "replica"),
		unknownKeys:   counter("unknown_keys_total", "Unknown event fields skipped while decoding.", "replica"),
		lag: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "warmpath", Subsystem: "kvevents", Name: "lag_seconds",
			Help:    "Time from a live batch's engine timestamp to its delivery to the handler, in seconds (negative values mean clock skew).",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
		}, []string{"replica"})),
		unknown: counter("unknown_replica_batches_total",
			"Batches dropped because their topic names a replica not in the fleet, by topic (the first 64 topics; later ones as \"other\").", "topic"),
		lastSeq: register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "warmpath", Subsystem: "kvevents", Name: "last_seq",
			Help: "Sequence number of the last batch applied, by replica and data-parallel rank.",
		}, []string{"replica", "dp_rank"})),
	}
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic("kvevents: register metrics: " + err.Error())
	}
	return c
}

func (m *Metrics) applied(replica string, b *Batch, seq uint64, live bool, now time.Time) {
	if m == nil {
		return
	}
	m.batches.WithLabelValues(replica).Inc()
	var stored, removed, cleared int
	for _, ev := range b.Events {
		switch ev.(type) {
		case *BlockStored:
			stored++
		case *BlockRemoved:
			removed++
		case *AllBlocksCleared:
			cleared++
		}
	}
	for _, c := range [...]struct {
		typ string
		n   int
	}{{TypeBlockStored, stored}, {TypeBlockRemoved, removed}, {TypeAllBlocksCleared, cleared}} {
		if c.n > 0 {
			m.events.WithLabelValues(replica, c.typ).Add(float64(c.n))
		}
	}
	m.lastSeq.WithLabelValues(replica, rankLabel(b.DPRank)).Set(float64(seq))
	if live && b.TS > 0 {
		ts := time.Unix(0, int64(b.TS*1e9))
		m.lag.WithLabelValues(replica).Observe(now.Sub(ts).Seconds())
	}
}

func rankLabel(r *int) string {
	if r == nil {
		return ""
	}
	return strconv.Itoa(*r)
}

func (m *Metrics) decoded(replica string, st DecodeStats) {
	if m == nil {
		return
	}
	if st.UnknownEvents > 0 {
		m.unknownEvents.WithLabelValues(replica).Add(float64(st.UnknownEvents))
	}
	if st.UnknownKeys > 0 {
		m.unknownKeys.WithLabelValues(replica).Add(float64(st.UnknownKeys))
	}
}

func (m *Metrics) gap(replica string) {
	if m != nil {
		m.gaps.WithLabelValues(replica).Inc()
	}
}

func (m *Metrics) restart(replica string) {
	if m != nil {
		m.restarts.WithLabelValues(replica).Inc()
	}
}

func (m *Metrics) duplicate(replica string) {
	if m != nil {
		m.duplicates.WithLabelValues(replica).Inc()
	}
}

func (m *Metrics) decodeError(replica string) {
	if m != nil {
		m.decodeErrors.WithLabelValues(replica).Inc()
	}
}

func (m *Metrics) malformedMsg(replica string) {
	if m != nil {
		m.malformed.WithLabelValues(replica).Inc()
	}
}

func (m *Metrics) replay(replica, result string) {
	if m != nil {
		m.replays.WithLabelValues(replica, result).Inc()
	}
}

func (m *Metrics) clear(replica, reason string) {
	if m != nil {
		m.clears.WithLabelValues(replica, reason).Inc()
	}
}

func (m *Metrics) unknownReplica(topic string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	if !m.topics[topic] {
		if m.topics == nil {
			m.topics = map[string]bool{}
		}
		if len(m.topics) < maxTopicLabels {
			m.topics[topic] = true
		} else {
			topic = OtherTopic
		}
	}
	m.mu.Unlock()
	m.unknown.WithLabelValues(topic).Inc()
}

// acquire registers a subscriber of replica; release undoes it and, for
// the last one, deletes every series of replica, so a fleet with churning
// replica names does not grow the registry forever while the subscribers
// of a replica's other data-parallel ranks keep theirs.
func (m *Metrics) acquire(replica string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	if m.users == nil {
		m.users = map[string]int{}
	}
	m.users[replica]++
	m.mu.Unlock()
}

func (m *Metrics) release(replica string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.users[replica]--; m.users[replica] > 0 {
		return
	}
	delete(m.users, replica)
	m.forget(replica)
}

// forget deletes every series of replica.
func (m *Metrics) forget(replica string) {
	if m == nil {
		return
	}
	l := prometheus.Labels{"replica": replica}
	for _, v := range []*prometheus.MetricVec{
		m.events.MetricVec, m.batches.MetricVec, m.gaps.MetricVec, m.replays.MetricVec,
		m.restarts.MetricVec, m.clears.MetricVec, m.duplicates.MetricVec, m.decodeErrors.MetricVec,
		m.malformed.MetricVec, m.unknownEvents.MetricVec, m.unknownKeys.MetricVec,
		m.lag.MetricVec, m.lastSeq.MetricVec,
	} {
		v.DeletePartialMatch(l)
	}
}
