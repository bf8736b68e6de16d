package responses

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the service's Prometheus collectors.
type metrics struct {
	responses     *prometheus.CounterVec   // by mode, status
	storeErrors   prometheus.Counter       // Redis writes that failed
	chainTurns    prometheus.Histogram     // turns rebuilt per chained request
	running       prometheus.Gauge         // background runs on this process
	swept         prometheus.Counter       // runs failed by the sweeper
	appendRetries prometheus.Counter       // background event writes tried again
	duration      *prometheus.HistogramVec // turn duration by mode
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmpath_responses_total", Help: "Responses finished, by mode (foreground, background) and status."},
			[]string{"mode", "status"}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warmpath_responses_store_errors_total", Help: "Responses that could not be stored in Redis (the client got response.failed or 503)."}),
		chainTurns: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "warmpath_responses_chain_turns", Help: "Earlier turns rebuilt for a previous_response_id request (one Redis round trip each).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12)}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "warmpath_responses_background_running", Help: "Background responses running on this process."}),
		swept: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warmpath_responses_background_swept_total", Help: "Background responses marked failed because their gateway stopped renewing the lease."}),
		appendRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warmpath_responses_background_append_retries_total", Help: "Background events whose write to Redis failed and was tried again (for up to 10 s, as during a failover)."}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "warmpath_responses_turn_duration_seconds", Help: "Time from the upstream request to the stored response.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14)}, []string{"mode"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.responses, m.storeErrors, m.chainTurns, m.running, m.swept, m.appendRetries, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("responses: register metrics: %w", err)
		}
	}
	return m, nil
}
