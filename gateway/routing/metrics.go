package routing

import "github.com/prometheus/client_golang/prometheus"

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
