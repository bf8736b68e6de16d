package fairq

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Why a request was refused (the shed counter's reason label).
type reason uint8

const (
	reasonFull       reason = iota // the total queue limit
	reasonTenantFull               // the tenant's queue limit
	reasonTimeout                  // waited Config.Timeout
	numReasons
)

var reasonNames = [numReasons]string{"queue_full", "tenant_queue_full", "timeout"}

// metrics are the queue's series.
type metrics struct {
	depth         *prometheus.GaugeVec     // tenant, class
	wait          *prometheus.HistogramVec // tenant, class
	dispatches    *prometheus.CounterVec   // tenant, class, path
	shed          *prometheus.CounterVec   // tenant, class, reason
	canceled      *prometheus.CounterVec   // tenant, class
	service       *prometheus.CounterVec   // tenant, class
	inflight      *prometheus.GaugeVec     // model
	saturated     *prometheus.CounterVec   // model
	dispatchShare *prometheus.GaugeVec     // tenant
	weightShare   *prometheus.GaugeVec     // tenant
	syncErrors    prometheus.Counter
	syncSeconds   prometheus.Histogram

	mu      sync.Mutex // guards byLabel
	byLabel map[string]*series
	shared  map[string]bool // labels whose share gauges were set; Run's goroutine only
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	tc := []string{"tenant", "class"}
	m := &metrics{
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "warmpath_queue_depth", Help: "Requests waiting in the gateway's fair queue.",
		}, tc),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "warmpath_queue_wait_seconds", Help: "Time dispatched requests waited in the fair queue (requests admitted at once are not observed).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, tc),
		dispatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmpath_queue_dispatches_total", Help: "Requests admitted, by path: fast (nothing waited, capacity free) or queued.",
		}, []string{"tenant", "class", "path"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmpath_queue_shed_total", Help: "Requests refused with 429, by reason: queue_full, tenant_queue_full, timeout.",
		}, []string{"tenant", "class", "reason"}),
		canceled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmpath_queue_canceled_total", Help: "Requests whose client went away while they waited.",
		}, tc),
		service: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmpath_queue_service_total", Help: "Service charged to virtual token counters, in tokens: prompt tokens net of predicted cache hits, plus output_weight × output tokens (before dividing by the tenant's weight).",
		}, tc),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "warmpath_queue_inflight", Help: "Admitted requests not finished, per model (updated every recheck interval).",
		}, []string{"model"}),
		saturated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmpath_queue_saturated_seconds_total", Help: "Time requests for the model waited in the queue because its replicas were saturated.",
		}, []string{"model"}),
		dispatchShare: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "warmpath_queue_dispatch_share", Help: "Share of queued dispatches the tenant got over the last share window (compare with warmpath_queue_weight_share).",
		}, []string{"tenant"}),
		weightShare: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "warmpath_queue_weight_share", Help: "The tenant's weight over the weights of all tenants that waited during the last share window: its fair share.",
		}, []string{"tenant"}),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warmpath_queue_sync_errors_total", Help: "Failed exchanges of virtual counters with Redis (the counters stay local meanwhile).",
		}),
		syncSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "warmpath_queue_sync_seconds", Help: "Duration of one exchange of virtual counters with Redis.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}),
		byLabel: map[string]*series{},
		shared:  map[string]bool{},
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.depth, m.wait, m.dispatches, m.shed, m.canceled, m.service,
		m.inflight, m.saturated, m.dispatchShare, m.weightShare, m.syncErrors, m.syncSeconds} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("fairq: register metrics: %w", err)
		}
	}
	return m, nil
}

// series are one tenant label's children, resolved once so that the
// request path does no label lookups.
type series struct {
	label    string
	depth    [numClasses]prometheus.Gauge
	wait     [numClasses]prometheus.Observer
	fast     [numClasses]prometheus.Counter
	queued   [numClasses]prometheus.Counter
	shed     [numClasses][numReasons]prometheus.Counter
	canceled [numClasses]prometheus.Counter
	service  [numClasses]prometheus.Counter
}

func (m *metrics) seriesFor(label string) *series {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.byLabel[label]; s != nil {
		return s
	}
	s := &series{label: label}
	for c := range numClasses {
		cl := c.String()
		s.depth[c] = m.depth.WithLabelValues(label, cl)
		s.wait[c] = m.wait.WithLabelValues(label, cl)
		s.fast[c] = m.dispatches.WithLabelValues(label, cl, "fast")
		s.queued[c] = m.dispatches.WithLabelValues(label, cl, "queued")
		for r := range numReasons {
			s.shed[c][r] = m.shed.WithLabelValues(label, cl, reasonNames[r])
		}
		s.canceled[c] = m.canceled.WithLabelValues(label, cl)
		s.service[c] = m.service.WithLabelValues(label, cl)
	}
	m.byLabel[label] = s
	return s
}

// tenant is what the queue keeps per tenant across models. Its pointer is
// stable while the tenant is active; Run forgets idle ones.
type tenant struct {
	id     string
	queued atomic.Int64           // waiting requests, all models
	series atomic.Pointer[series] // never nil
	weight atomic.Uint64          // math.Float64bits of the weight last seen

	uses          atomic.Uint64 // admissions, for idleness detection
	seenUses      uint64        // uses at the last sweep; Run's goroutine only
	winDispatched atomic.Int64  // queued dispatches in the current share window
	winBacklogged atomic.Bool   // something waited in the current share window
}
