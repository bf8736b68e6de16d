package fairq

import (
	"os"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/redistest"
)

// TestMain stops the shared Cluster and Sentinel topologies after the tests.
func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

// testCap is a Capacity driven by the test: a model is saturated when the
// queue's running grants reach the limit, or while forced.
type testCap struct {
	limit  atomic.Int64
	forced atomic.Bool
}

func newCap(limit int) *testCap {
	c := &testCap{}
	c.limit.Store(int64(limit))
	return c
}

func (c *testCap) Saturated(_ string, inflight int) bool {
	return c.forced.Load() || int64(inflight) >= c.limit.Load()
}

func newTestQueue(t testing.TB, cfg Config, c Capacity, rdb redis.UniversalClient) (*Queue, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	q, err := New(cfg, c, rdb, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q, reg
}

// grantNow submits tk and fails unless it is admitted at once.
func grantNow(t testing.TB, q *Queue, tk Ticket) *Grant {
	t.Helper()
	g, it, err := q.submit(tk)
	if err != nil || it != nil || g == nil {
		t.Fatalf("submit %+v: grant %v, queued %v, err %v; want an immediate grant", tk, g, it != nil, err)
	}
	return g
}

// enqueue submits tk and fails unless it waits.
func enqueue(t testing.TB, q *Queue, tk Ticket) *item {
	t.Helper()
	g, it, err := q.submit(tk)
	if err != nil || it == nil {
		t.Fatalf("submit %+v: grant %v, err %v; want it queued", tk, g, err)
	}
	return it
}

func ready(it *item) bool {
	select {
	case <-it.ready:
		return true
	default:
		return false
	}
}

// stepper runs a queue at a capacity of one request: each step ends the
// running request and reports the one dispatched in its place.
type stepper struct {
	t       testing.TB
	running *Grant
	waiting map[*item]bool
}

func newStepper(t testing.TB, running *Grant) *stepper {
	return &stepper{t: t, running: running, waiting: map[*item]bool{}}
}

func (s *stepper) add(its ...*item) {
	for _, it := range its {
		s.waiting[it] = true
	}
}

// step ends the running grant (after charging output tokens) and returns
// the ticket dispatched next.
func (s *stepper) step(output float64) Ticket {
	s.t.Helper()
	s.running.Charge(output)
	s.running.Done()
	var next *item
	for it := range s.waiting {
		if ready(it) {
			if next != nil {
				s.t.Fatalf("two requests dispatched for one free slot: %+v and %+v", next.t, it.t)
			}
			next = it
		}
	}
	if next == nil {
		s.t.Fatalf("nothing dispatched; %d waiting", len(s.waiting))
	}
	delete(s.waiting, next)
	s.running = &next.grant
	return next.t
}

// metricValue reads a counter's or gauge's value.
func metricValue(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	case d.Histogram != nil:
		return float64(d.Histogram.GetSampleCount())
	}
	t.Fatalf("metric %v is neither counter, gauge nor histogram", m.Desc())
	return 0
}
