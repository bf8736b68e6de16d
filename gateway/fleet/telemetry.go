package fleet

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Descriptions of the fleet's metrics. The collector reads them from the
// current snapshot at scrape time, so a replica's series disappear with it.
var (
	descHealthy = prometheus.NewDesc("warmpath_replica_healthy",
		"Whether the replica is healthy (1) or not (0).", []string{"replica"}, nil)
	descWaiting = prometheus.NewDesc("warmpath_replica_waiting",
		"Requests waiting in the replica's engine queue, as last scraped.", []string{"replica"}, nil)
	descRunning = prometheus.NewDesc("warmpath_replica_running",
		"Requests running in the replica's engine batch, as last scraped.", []string{"replica"}, nil)
	descKVUsage = prometheus.NewDesc("warmpath_replica_kv_usage",
		"Fraction of the replica's KV-cache blocks in use, 0..1, as last scraped.", []string{"replica"}, nil)
	descInflight = prometheus.NewDesc("warmpath_replica_inflight_requests",
		"Requests this gateway sent to the replica that have not finished.", []string{"replica"}, nil)
	descInflightPrefill = prometheus.NewDesc("warmpath_replica_inflight_prefill_tokens",
		"Prompt tokens this gateway sent to the replica that have not produced a first byte.", []string{"replica"}, nil)
	descScrapeErrors = prometheus.NewDesc("warmpath_replica_scrape_errors_total",
		"Failed scrapes of the replica's /metrics.", []string{"replica"}, nil)
	descTransitions = prometheus.NewDesc("warmpath_replica_health_transitions_total",
		"Health transitions of the replica, by the state entered.", []string{"replica", "to"}, nil)
	descMetricsAge = prometheus.NewDesc("warmpath_replica_metrics_age_seconds",
		"Age of the replica's last successful metrics scrape (absent before the first).", []string{"replica"}, nil)
	descReplicas = prometheus.NewDesc("warmpath_fleet_replicas",
		"Members of the fleet.", nil, nil)
	descDNS = prometheus.NewDesc("warmpath_dns_resolutions_total",
		"DNS resolutions of fleet names, by result (ok or error).", []string{"name", "result"}, nil)
)

// collector exports a fleet's state as Prometheus metrics.
type collector struct{ f *Fleet }

var _ prometheus.Collector = (*collector)(nil)

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		descHealthy, descWaiting, descRunning, descKVUsage, descInflight, descInflightPrefill,
		descScrapeErrors, descTransitions, descMetricsAge, descReplicas, descDNS,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. It reads the current snapshot
// without locking.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	snap := c.f.Snapshot()
	now := c.f.cfg.Now()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(descReplicas, float64(len(snap.Replicas)))
	for _, r := range snap.Replicas {
		name := r.Spec.Name
		s := r.State()
		healthy := 0.0
		if s.Healthy {
			healthy = 1
		}
		gauge(descHealthy, healthy, name)
		gauge(descWaiting, float64(s.Waiting), name)
		gauge(descRunning, float64(s.Running), name)
		gauge(descKVUsage, s.KVUsage, name)
		gauge(descInflight, float64(r.InflightRequests()), name)
		gauge(descInflightPrefill, float64(r.InflightPrefillTokens()), name)
		if !s.ScrapedAt.IsZero() {
			gauge(descMetricsAge, max(0, now.Sub(s.ScrapedAt).Seconds()), name)
		}
		counter(descScrapeErrors, r.scrapeErrors.Load(), name)
		counter(descTransitions, r.toHealthy.Load(), name, "healthy")
		counter(descTransitions, r.toUnhealthy.Load(), name, "unhealthy")
	}
	// Several DNS specs may share a name (different ports): sum them.
	type key struct{ name, result string }
	dns := map[key]uint64{}
	var order []key
	for _, w := range c.f.dns {
		for _, k := range []key{{w.spec.Name, "ok"}, {w.spec.Name, "error"}} {
			if _, ok := dns[k]; !ok {
				order = append(order, k)
			}
		}
		dns[key{w.spec.Name, "ok"}] += w.ok.Load()
		dns[key{w.spec.Name, "error"}] += w.fail.Load()
	}
	for _, k := range order {
		counter(descDNS, dns[k], k.name, k.result)
	}
}
