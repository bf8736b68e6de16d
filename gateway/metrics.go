package gateway

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/gateway/request"
)

// metrics are the gateway's own series. Every series carries the policy
// label: New registers through a registerer wrapped with it.
type metrics struct {
	requests        *prometheus.CounterVec   // route, code
	duration        *prometheus.HistogramVec // route
	ttft            *prometheus.HistogramVec // model
	ttftError       *prometheus.HistogramVec // replica
	phases          [numPhases]prometheus.Observer
	promptTokens    *prometheus.CounterVec // tenant, model
	cachedTokens    *prometheus.CounterVec // tenant, model
	predictedTokens *prometheus.CounterVec // tenant, model
	cachedFraction  *prometheus.GaugeVec   // tenant, model
	mispredicted    *prometheus.CounterVec // tenant, model
	mispredictedTok *prometheus.CounterVec // tenant, model
	retries         *prometheus.CounterVec // reason
	upstreamErrors  *prometheus.CounterVec // replica, kind
	redisErrors     *prometheus.CounterVec // op
	streamsCut      *prometheus.CounterVec // reason
	connsRejected   prometheus.Counter
	replicaRestarts *prometheus.CounterVec // replica
	inflight        prometheus.Gauge

	mu    sync.Mutex // guards fracs
	fracs map[[2]string]*[2]float64
}

func newMetrics(reg prometheus.Registerer) *metrics {
	ttftBuckets := []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}
	m := &metrics{
		requests: counterVec("warmpath_requests_total", "Requests answered, by route and HTTP status.", "route", "code"),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "warmpath_request_duration_seconds", Help: "Time from request arrival to the end of the response.",
			Buckets: ttftBuckets,
		}, []string{"route"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "warmpath_ttft_seconds", Help: "Time from request arrival to the first streamed event (streaming requests).",
			Buckets: ttftBuckets,
		}, []string{"model"}),
		ttftError: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "warmpath_ttft_estimate_error_seconds",
			Help:    "Estimated minus observed time to first token (routing decision to first byte), by the replica that answered; policies that estimate.",
			Buckets: []float64{-30, -10, -5, -2, -1, -.5, -.25, -.1, -.05, 0, .05, .1, .25, .5, 1, 2, 5, 10, 30},
		}, []string{"replica"}),
		promptTokens:    counterVec("warmpath_prompt_tokens_total", "Prompt tokens of completed requests, as the replicas reported them.", "tenant", "model"),
		cachedTokens:    counterVec("warmpath_cached_tokens_total", "Prompt tokens the chosen replica served from its prefix cache (usage.prompt_tokens_details.cached_tokens).", "tenant", "model"),
		predictedTokens: counterVec("warmpath_predicted_cached_tokens_total", "Prompt tokens the router predicted the chosen replica held cached.", "tenant", "model"),
		cachedFraction:  gaugeVec("warmpath_cached_prefix_fraction", "Fleet-wide cached-prefix fraction since start: cached ÷ prompt tokens.", "tenant", "model"),
		mispredicted:    counterVec("warmpath_mispredicted_hits_total", "Requests routed on a predicted hit of at least one block that the replica did not have (index staleness).", "tenant", "model"),
		mispredictedTok: counterVec("warmpath_mispredicted_tokens_total", "Predicted cached tokens the replica did not have.", "tenant", "model"),
		retries:         counterVec("warmpath_upstream_retries_total", "Requests retried on the next-best replica after a failure before the first byte.", "reason"),
		upstreamErrors:  counterVec("warmpath_upstream_errors_total", "Upstream failures by replica and kind.", "replica", "kind"),
		redisErrors:     counterVec("warmpath_redis_errors_total", "Redis operations that failed; routing went on without them.", "op"),
		streamsCut:      counterVec("warmpath_streams_cut_total", "Streams that ended before the replica finished them, by reason (upstream_error, idle_timeout, first_byte_timeout, truncated, event_too_large); each ended with an error event.", "reason"),
		connsRejected:   prometheus.NewCounter(prometheus.CounterOpts{Name: "warmpath_connections_rejected_total", Help: "Client connections closed on arrival because their address already held server.max_conns_per_client."}),
		replicaRestarts: counterVec("warmpath_replica_restarts_total", "Engine restarts seen on a replica's /metrics (its counters went back to zero); the index forgot what it held.", "replica"),
		inflight:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "warmpath_inflight_requests", Help: "Requests being proxied now."}),
		fracs:           map[[2]string]*[2]float64{},
	}
	phases := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "warmpath_gateway_phase_seconds",
		Help:    "The gateway's own time per request before it forwards, by phase: prepare (session lookup, tokenizer and prefix match), queue (waiting for admission), route (the decision at dispatch and its session write).",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"phase"})
	for ph, name := range phaseNames {
		m.phases[ph] = phases.WithLabelValues(name)
	}
	reg.MustRegister(phases)
	reg.MustRegister(m.requests, m.duration, m.ttft, m.ttftError, m.promptTokens, m.cachedTokens, m.predictedTokens,
		m.cachedFraction, m.mispredicted, m.mispredictedTok, m.retries, m.upstreamErrors, m.redisErrors, m.streamsCut, m.connsRejected,
		m.replicaRestarts, m.inflight)
	return m
}

// counterVec is a counter vector named name, with help and labels.
func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// gaugeVec is a gauge vector named name, with help and labels.
func gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

// A phase is one step of the gateway's own work on a request before it
// forwards (warmpath_gateway_phase_seconds).
type phase int

const (
	phasePrepare phase = iota
	phaseQueue
	phaseRoute
	numPhases
)

// phaseNames are the phases' label values, which the overhead benchmark
// reads back.
var phaseNames = [numPhases]string{"prepare", "queue", "route"}

// PhaseNames lists the label values of warmpath_gateway_phase_seconds, in
// the order the phases run.
func PhaseNames() []string { return phaseNames[:] }

// observePhases records a routed exchange's phases.
func (m *metrics) observePhases(x *exchange) {
	for ph, d := range x.phases() {
		m.phases[ph].Observe(d.Seconds())
	}
}

// account records one completed request's prompt and cache figures.
func (m *metrics) account(tenant, model string, u request.Usage, predicted, blockSize int) {
	m.promptTokens.WithLabelValues(tenant, model).Add(float64(u.PromptTokens))
	m.cachedTokens.WithLabelValues(tenant, model).Add(float64(u.CachedTokens))
	m.predictedTokens.WithLabelValues(tenant, model).Add(float64(predicted))
	if miss := predicted - u.CachedTokens; miss >= blockSize {
		m.mispredicted.WithLabelValues(tenant, model).Inc()
		m.mispredictedTok.WithLabelValues(tenant, model).Add(float64(miss))
	}
	m.mu.Lock()
	f := m.fracs[[2]string{tenant, model}]
	if f == nil {
		f = new([2]float64)
		m.fracs[[2]string{tenant, model}] = f
	}
	f[0] += float64(u.CachedTokens)
	f[1] += float64(u.PromptTokens)
	if f[1] > 0 {
		m.cachedFraction.WithLabelValues(tenant, model).Set(f[0] / f[1])
	}
	m.mu.Unlock()
}
