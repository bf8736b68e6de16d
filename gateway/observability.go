package gateway

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/warmpath/warmpath/kvevents"
	"github.com/warmpath/warmpath/record"
)

// observability is what the gateway tells about itself: the metrics
// registry and the gateway's collectors, the traces, the status page's
// activity, the recording of routed traffic, and the rate-limited
// warnings a client can trigger.
type observability struct {
	log     *slog.Logger
	reg     *prometheus.Registry
	wrapped prometheus.Registerer // reg with the policy label
	m       *metrics
	kvm     *kvevents.Metrics
	trace   tracing          // OpenTelemetry; off unless configured (tracing.go)
	rec     *record.Recorder // nil unless record.dir is set (record.go)
	// activity is what the status page shows.
	activity *activity
	// tokenizeWarn rate-limits a warning any client can trigger.
	tokenizeWarn sometimes
}

// newObservability registers the gateway's collectors on o.Registry (a
// fresh one with Go and process collectors when nil), labelled with the
// routing policy. Tracing and the recorder are added by their builders.
func newObservability(policy string, o Options, log *slog.Logger) *observability {
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"policy": policy}, reg)
	if o.wrapRegisterer != nil {
		wrapped = o.wrapRegisterer(wrapped)
	}
	ob := &observability{log: log, reg: reg, wrapped: wrapped, m: newMetrics(wrapped), kvm: kvevents.NewMetrics(wrapped),
		activity: newActivity()}
	ob.tokenizeWarn.period = 10 * time.Second
	return ob
}

// run starts the recorder's writer under eg (when recording).
func (ob *observability) run(ctx context.Context, eg *errgroup.Group) {
	if ob.rec != nil {
		eg.Go(func() error { return ob.rec.Run(ctx) })
	}
}

// close stops tracing, exporting the last spans.
func (ob *observability) close() { ob.trace.shutdown(ob.log) }

// tokenizeFailed warns, at most once per tokenizeWarn's period, that a
// tokenization failed and routing went on without prefix information
// (the router's Deps.TokenizeFailed): any client can trigger it.
func (ob *observability) tokenizeFailed(ctx context.Context, requestID string, err error) {
	if ok, held := ob.tokenizeWarn.allow(); ok {
		ob.log.WarnContext(ctx, "tokenize failed; routing without prefix information", "request_id", requestID, "err", err, "held_back", held)
	}
}
