package routing

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/session"
)

// metrics are the router's series; redisErrors is the gateway's (Redis
// operations that failed, by op), shared.
type metrics struct {
	decisions       *prometheus.CounterVec // reason
	rebinds         *prometheus.CounterVec // reason
	copies          prometheus.Counter
	tokenizeAvoided prometheus.Counter
	tokenizeUnseen  prometheus.Counter
	tips            *prometheus.CounterVec // result
	redisErrors     *prometheus.CounterVec // op
}

func newMetrics(reg prometheus.Registerer, redisErrors *prometheus.CounterVec) *metrics {
	m := &metrics{
		decisions:       counterVec("warmpath_routing_decisions_total", "Routing decisions by reason: sticky (bound replica, no scoring), scored, retry.", "reason"),
		rebinds:         counterVec("warmpath_session_rebinds_total", "Sessions moved off their bound replica, by why.", "reason"),
		copies:          prometheus.NewCounter(prometheus.CounterOpts{Name: "warmpath_prefix_copies_total", Help: "Requests placed on a replica holding less of their prompt than the best holder with a positive replication term: a copy of a shared prefix made for the requests that will share it."}),
		tokenizeAvoided: prometheus.NewCounter(prometheus.CounterOpts{Name: "warmpath_tokenizer_avoided_total", Help: "Turns routed without tokenizing (sticky sessions whose replica still holds their prefix)."}),
		tokenizeUnseen:  prometheus.NewCounter(prometheus.CounterOpts{Name: "warmpath_tokenizer_unseen_total", Help: "Scored turns routed on load without tokenizing: no replica was sent their opening (routing.skip_unseen on)."}),
		tips:            counterVec("warmpath_session_tips_total", "Prompts routed without the tokenizer, tokenized off the request path (blocks speculated, session tip filled), by result: filled, stale (no session, or it moved or already had one), failed (tokenizer or Redis), dropped (the workers' backlog was full).", "result"),
		redisErrors:     redisErrors,
	}
	if m.redisErrors == nil {
		m.redisErrors = counterVec("warmpath_redis_errors_total", "Redis operations that failed; routing went on without them.", "op")
	}
	if reg != nil {
		reg.MustRegister(m.decisions, m.rebinds, m.copies, m.tokenizeAvoided, m.tokenizeUnseen, m.tips)
	}
	return m
}

// tokMetrics are the tokenizer's series.
type tokMetrics struct {
	calls    *prometheus.CounterVec // result
	backoff  *prometheus.GaugeVec   // replica
	checks   *prometheus.CounterVec // result
	mismatch *prometheus.CounterVec // model
}

// newTokMetrics builds the tokenizer's series and registers them on reg
// (nil: not registered).
func newTokMetrics(reg prometheus.Registerer) *tokMetrics {
	m := &tokMetrics{
		calls:    counterVec("warmpath_tokenizer_calls_total", "Prompt tokenizations, by result: local (in process, routing.tokenizer), cached, ok, error, unavailable (every tokenizer backed off; no call made). Identical prompts in flight share one call.", "result"),
		backoff:  prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "warmpath_tokenizer_backoff", Help: "1 while the gateway does not ask a replica's (or the tokenize_url service's, replica=\"tokenize_url\") /tokenize, which had none to offer; 0 once it answers again."}, []string{"replica"}),
		checks:   counterVec("warmpath_tokenizer_checks_total", "In-process tokenizations (routing.tokenizer) compared with a replica's /tokenize off the request path, by result: match, mismatch, failed (no answer), dropped (the checker's backlog was full).", "result"),
		mismatch: counterVec("warmpath_tokenizer_mismatch_total", "Checks that found the in-process tokenizer's ids differ from a replica's /tokenize; the model is then tokenized by the replicas.", "model"),
	}
	if reg != nil {
		reg.MustRegister(m.calls, m.backoff, m.checks, m.mismatch)
	}
	return m
}

// counterVec is a counter vector named name, with help and labels.
func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// watchTracking registers the session tracking's metrics on reg.
func (m *metrics) watchTracking(reg prometheus.Registerer, t *session.Tracking) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "warmpath_session_tracking",
		Help: "1 while Redis reports every change to the session bindings (client-side tracking), so sticky lookups are answered from memory; 0 while every lookup asks Redis.",
	}, func() float64 {
		if t.On() {
			return 1
		}
		return 0
	}))
	for _, kind := range []string{"key", "flush"} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "warmpath_session_tracking_notices_total",
			Help:        "Change notices the session tracking received: key (a binding changed: this gateway's own writes included), flush (everything distrusted: a flush, a lost connection, a write that failed).",
			ConstLabels: prometheus.Labels{"kind": kind},
		}, func() float64 {
			keys, flushes := t.Notices()
			if kind == "key" {
				return float64(keys)
			}
			return float64(flushes)
		}))
	}
}
