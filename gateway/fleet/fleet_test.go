package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/warmpath/warmpath/internal/testrun"
)

// fakeVLLM is an httptest server speaking the parts of vLLM's HTTP API the
// fleet uses. Its behaviour can be changed while it runs.
type fakeVLLM struct {
	*httptest.Server
	health  atomic.Int32                // status of GET /health; 0 = 200
	metrics atomic.Pointer[string]      // body of GET /metrics
	models  atomic.Pointer[[]string]    // ids listed by GET /v1/models
	filter  atomic.Int32                // name[] handling: filterIgnore, filterApply, filterReject
	hits    sync.Map                    // path → *atomic.Int64
	query   atomic.Pointer[string]      // raw query of the last GET /metrics
	headers atomic.Pointer[http.Header] // headers of the last request
}

// Values of fakeVLLM.filter.
const (
	filterIgnore = iota // serve everything
	filterApply         // serve only the requested samples
	filterReject        // 400 for a filtered request
)

const defaultMetrics = `vllm:num_requests_running{engine="0",model_name="m"} 1
vllm:num_requests_waiting{engine="0",model_name="m"} 2
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1
process_open_fds 12
`

func newFakeVLLM(t *testing.T) *fakeVLLM {
	t.Helper()
	v := &fakeVLLM{}
	m := defaultMetrics
	v.metrics.Store(&m)
	v.models.Store(&[]string{"m"})
	v.Server = httptest.NewServer(http.HandlerFunc(v.serve))
	t.Cleanup(v.Close)
	return v
}

func (v *fakeVLLM) hit(path string) int64 {
	c, _ := v.hits.LoadOrStore(path, new(atomic.Int64))
	return c.(*atomic.Int64).Load()
}

func (v *fakeVLLM) serve(w http.ResponseWriter, r *http.Request) {
	c, _ := v.hits.LoadOrStore(r.URL.Path, new(atomic.Int64))
	c.(*atomic.Int64).Add(1)
	h := r.Header.Clone()
	v.headers.Store(&h)
	switch r.URL.Path {
	case "/health":
		code := int(v.health.Load())
		if code == 0 {
			code = http.StatusOK
		}
		w.WriteHeader(code)
	case "/metrics":
		q := r.URL.RawQuery
		v.query.Store(&q)
		names := r.URL.Query()["name[]"]
		body := *v.metrics.Load()
		switch v.filter.Load() {
		case filterReject:
			if len(names) > 0 {
				http.Error(w, "bad query", http.StatusBadRequest)
				return
			}
		case filterApply:
			if len(names) > 0 {
				var b strings.Builder
				for line := range strings.Lines(body) {
					for _, n := range names {
						if strings.HasPrefix(line, n+"{") || strings.HasPrefix(line, n+" ") {
							b.WriteString(line)
						}
					}
				}
				body = b.String()
			}
		}
		if body == "500" {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = fmt.Fprint(w, body)
	case "/v1/models":
		type model struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		}
		var data []model
		for _, id := range *v.models.Load() {
			data = append(data, model{id, "model"})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
	default:
		http.NotFound(w, r)
	}
}

// spec returns a static spec for v.
func (v *fakeVLLM) spec(model string) ReplicaSpec { return ReplicaSpec{URL: v.URL, Model: model} }

// fastConfig returns a config with short intervals for tests.
func fastConfig(specs ...ReplicaSpec) Config {
	return Config{
		Replicas: specs,
		Health: HealthConfig{
			Interval:       5 * time.Millisecond,
			Timeout:        time.Second,
			ScrapeInterval: 5 * time.Millisecond,
			StaleAfter:     time.Hour, // no staleness unless a test wants it
			Failures:       2,
		},
		ScrapeTimeout:     time.Second,
		RecoveryThreshold: 2,
	}
}

// startFleet creates a fleet and runs it until the test ends, then checks
// that Run returned nil and left no goroutines behind.
func startFleet(t *testing.T, cfg Config) *Fleet {
	t.Helper()
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "fleet", f.Run)
	return f
}

func TestNewStartsNothing(t *testing.T) {
	v := newFakeVLLM(t)
	res := &fakeResolver{}
	cfg := fastConfig(v.spec(""))
	cfg.Discovery = []DNSSpec{{Name: "vllm.test", Port: 1}}
	cfg.Resolver = res
	synctest.Test(t, func(t *testing.T) {
		if _, err := New(cfg); err != nil {
			t.Fatal(err)
		}
		// Let a minute of fake time pass: any goroutine New started would
		// have checked, scraped and resolved many times, then blocked.
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := v.hit("/health") + v.hit("/metrics") + res.calls.Load(); n != 0 {
			t.Errorf("New sent %d requests or lookups; want 0", n)
		}
		if got := fleetGoroutines(); got != [3]int{} {
			t.Errorf("after New: [health scrape dns] goroutines = %v; want none", got)
		}
	})
}

func TestHealthTransitions(t *testing.T) {
	v := newFakeVLLM(t)
	reg := prometheus.NewRegistry()
	cfg := fastConfig(v.spec("m"))
	cfg.Registerer = reg
	f := startFleet(t, cfg)
	r := f.Snapshot().Replicas[0]

	testrun.Eventually(t, 10*time.Second, func() bool { return r.State().Healthy }, "healthy")

	v.health.Store(http.StatusServiceUnavailable)
	testrun.Eventually(t, 10*time.Second, func() bool { return !r.State().Healthy }, "unhealthy after failed checks")
	if got := r.State().HealthReason; !strings.Contains(got, "active: GET /health: status 503") {
		t.Errorf("HealthReason = %q; want the 503", got)
	}
	if f.Models() != nil {
		t.Errorf("Models() with no healthy replica = %v; want nil", f.Models())
	}

	v.health.Store(http.StatusOK)
	testrun.Eventually(t, 10*time.Second, func() bool { return r.State().Healthy }, "recovered")

	got := gather(t, reg)
	name := r.Spec.Name
	if v := got[`warmpath_replica_health_transitions_total{replica=`+name+`,to=unhealthy}`]; v != 1 {
		t.Errorf("transitions to unhealthy = %v; want 1", v)
	}
	if v := got[`warmpath_replica_health_transitions_total{replica=`+name+`,to=healthy}`]; v != 2 {
		t.Errorf("transitions to healthy = %v; want 2", v)
	}
	if v := got[`warmpath_replica_healthy{replica=`+name+`}`]; v != 1 {
		t.Errorf("healthy gauge = %v; want 1", v)
	}
}

func TestHealthUnreachable(t *testing.T) {
	v := newFakeVLLM(t)
	url := v.URL
	v.Close() // nothing listens there any more
	f := startFleet(t, fastConfig(ReplicaSpec{URL: url}))
	r := f.Snapshot().Replicas[0]
	testrun.Eventually(t, 10*time.Second, func() bool { return !r.State().LastCheck.IsZero() }, "a failed check")
	s := r.State()
	if s.Healthy || !strings.HasPrefix(s.HealthReason, "active: GET /health: ") {
		t.Errorf("state = %+v; want unhealthy with the dial error", s)
	}
	if sat, reason := r.Saturated(time.Now()); !sat || reason != ReasonUnhealthy {
		t.Errorf("Saturated = %v, %q; want true, unhealthy", sat, reason)
	}
}

func TestPassiveFailure(t *testing.T) {
	v := newFakeVLLM(t)
	cfg := fastConfig(v.spec("m"))
	cfg.Health.Interval = time.Hour // one check at start, then only passive reports
	f := startFleet(t, cfg)
	r := f.Snapshot().Replicas[0]
	testrun.Eventually(t, 10*time.Second, func() bool { return r.State().Healthy }, "healthy")
	r.ReportFailure(errors.New("upstream: 502"))
	if !r.State().Healthy {
		t.Fatal("unhealthy after one failure; threshold is 2")
	}
	r.ReportFailure(errors.New("upstream: 502"))
	if s := r.State(); s.Healthy || s.HealthReason != "passive: upstream: 502" {
		t.Errorf("state = %+v; want unhealthy, passive reason", s)
	}
}

func TestScrape(t *testing.T) {
	tests := []struct {
		name         string
		filter       int32
		wantFiltered bool // later scrapes still carry the filter
	}{
		{"exporter applies the filter", filterApply, true},
		{"exporter ignores the filter", filterIgnore, true},
		{"exporter rejects the filter", filterReject, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := newFakeVLLM(t)
			v.filter.Store(tt.filter)
			f := startFleet(t, fastConfig(v.spec("m")))
			r := f.Snapshot().Replicas[0]
			testrun.Eventually(t, 10*time.Second, func() bool { return v.hit("/metrics") >= 4 && !r.State().ScrapedAt.IsZero() }, "a few scrapes")
			s := r.State()
			if s.Running != 1 || s.Waiting != 2 || s.KVUsage != 0.5 || s.BlockSize != 16 || s.NumGPUBlocks != 100 || s.ScrapeErr != "" {
				t.Errorf("state = %+v", s)
			}
			last := *v.query.Load()
			if filtered := strings.Contains(last, "name%5B%5D="); filtered != tt.wantFiltered {
				t.Errorf("last scrape query %q: filtered = %v; want %v", last, filtered, tt.wantFiltered)
			}
		})
	}
}

func TestScrapeFailureKeepsHealth(t *testing.T) {
	v := newFakeVLLM(t)
	reg := prometheus.NewRegistry()
	cfg := fastConfig(v.spec("m"))
	cfg.Registerer = reg
	f := startFleet(t, cfg)
	r := f.Snapshot().Replicas[0]
	testrun.Eventually(t, 10*time.Second, func() bool { return r.State().Healthy && !r.State().ScrapedAt.IsZero() }, "healthy and scraped")
	scraped := r.State().ScrapedAt

	bad := "500"
	v.metrics.Store(&bad)
	testrun.Eventually(t, 10*time.Second, func() bool { return r.scrapeErrors.Load() >= 3 }, "scrape errors")
	s := r.State()
	if !s.Healthy {
		t.Error("a failing scrape made the replica unhealthy")
	}
	if !strings.Contains(s.ScrapeErr, "status 500") || s.Running != 1 || !s.ScrapedAt.Equal(scraped) {
		t.Errorf("state = %+v; want the old numbers, the old ScrapedAt and the error", s)
	}
	if got := gather(t, reg)[`warmpath_replica_scrape_errors_total{replica=`+r.Spec.Name+`}`]; got < 3 {
		t.Errorf("scrape_errors_total = %v; want ≥ 3", got)
	}

	notVLLM := "up 1\n"
	v.metrics.Store(&notVLLM)
	testrun.Eventually(t, 10*time.Second, func() bool { return strings.Contains(r.State().ScrapeErr, "no vllm:") }, "no-vLLM error")
}

// fakeClock is an injectable clock.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Set(t time.Time)         { c.ns.Store(t.UnixNano()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func TestStaleMetrics(t *testing.T) {
	v := newFakeVLLM(t)
	clock := &fakeClock{}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock.Set(t0)
	reg := prometheus.NewRegistry()
	cfg := fastConfig(v.spec("m"))
	cfg.Now = clock.Now
	cfg.Health.StaleAfter = time.Second
	cfg.Registerer = reg
	f := startFleet(t, cfg)
	r := f.Snapshot().Replicas[0]
	testrun.Eventually(t, 10*time.Second, func() bool { return r.State().Healthy && !r.State().ScrapedAt.IsZero() }, "healthy and scraped")

	if sat, reason := r.Saturated(clock.Now()); sat {
		t.Fatalf("fresh metrics: Saturated = true, %q", reason)
	}
	// The scrape endpoint breaks; time moves on past StaleAfter.
	bad := "500"
	v.metrics.Store(&bad)
	testrun.Eventually(t, 10*time.Second, func() bool { return r.State().ScrapeErr != "" }, "a failed scrape")
	clock.Advance(1500 * time.Millisecond)
	if sat, reason := r.Saturated(clock.Now()); !sat || reason != ReasonStale {
		t.Errorf("stale metrics: Saturated = %v, %q; want true, stale", sat, reason)
	}
	if got := gather(t, reg)[`warmpath_replica_metrics_age_seconds{replica=`+r.Spec.Name+`}`]; got != 1.5 {
		t.Errorf("metrics age = %v; want 1.5", got)
	}
	// Scrapes work again: fresh at the current (fake) time.
	good := defaultMetrics
	v.metrics.Store(&good)
	testrun.Eventually(t, 10*time.Second, func() bool { sat, _ := r.Saturated(clock.Now()); return !sat }, "fresh metrics")
}

func TestModelDiscovery(t *testing.T) {
	v := newFakeVLLM(t)
	v.models.Store(&[]string{"qwen", "llama", "qwen"})
	w := newFakeVLLM(t) // configured model: never asked
	cfg := fastConfig(v.spec(""), w.spec("fixed"))
	cfg.ModelsInterval = 20 * time.Millisecond
	cfg.Header = http.Header{"Authorization": {"Bearer k"}}
	f := startFleet(t, cfg)
	rv := f.Replica(strings.TrimPrefix(v.URL, "http://"))
	rw := f.Replica(strings.TrimPrefix(w.URL, "http://"))
	if rv == nil || rw == nil {
		t.Fatalf("replicas not found in %v", names(f.Snapshot().Replicas))
	}
	testrun.Eventually(t, 10*time.Second, func() bool { return slices.Equal(rv.State().Models, []string{"llama", "qwen"}) }, "discovered models")
	if got := (*v.headers.Load()).Get("Authorization"); got != "Bearer k" {
		t.Errorf("Authorization header = %q; want the configured one", got)
	}
	testrun.Eventually(t, 10*time.Second, func() bool { return rw.State().Healthy }, "both healthy")
	if got := f.Models(); !slices.Equal(got, []string{"fixed", "llama", "qwen"}) {
		t.Errorf("Models() = %v", got)
	}

	v.models.Store(&[]string{"mistral"})
	testrun.Eventually(t, 10*time.Second, func() bool { return slices.Equal(rv.State().Models, []string{"mistral"}) }, "refreshed models")
	// A failing discovery keeps the last known models.
	v.models.Store(&[]string{})
	n := v.hit("/v1/models")
	testrun.Eventually(t, 10*time.Second, func() bool { return v.hit("/v1/models") >= n+3 }, "failed discoveries")
	if got := rv.State().Models; !slices.Equal(got, []string{"mistral"}) || !rv.State().Healthy {
		t.Errorf("after failed discovery: Models = %v, healthy %v; want [mistral], true", got, rv.State().Healthy)
	}
	// A configured model is checked once, on becoming healthy (see
	// TestConfiguredModelCheck), never rediscovered.
	if n := w.hit("/v1/models"); n != 1 {
		t.Errorf("replica with a configured model got %d GET /v1/models; want 1", n)
	}
	if got := rw.State().Models; !slices.Equal(got, []string{"fixed"}) {
		t.Errorf("configured replica's Models = %v; want [fixed] whatever it lists", got)
	}
}

// fakeResolver answers from a settable table.
type fakeResolver struct {
	mu    sync.Mutex
	addrs []string // guarded by mu
	err   error    // guarded by mu
	calls atomic.Int64
}

func (r *fakeResolver) set(addrs []string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addrs, r.err = addrs, err
}

func (r *fakeResolver) LookupHost(ctx context.Context, host string) ([]string, error) {
	defer r.calls.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if host != "vllm.test" {
		return nil, fmt.Errorf("unexpected host %q", host)
	}
	return slices.Clone(r.addrs), r.err
}

func TestDNSMembership(t *testing.T) {
	res := &fakeResolver{}
	res.set([]string{"127.0.0.2", "127.0.0.3"}, nil)
	reg := prometheus.NewRegistry()
	cfg := fastConfig(ReplicaSpec{Name: "static", URL: "http://127.0.0.1:1"})
	cfg.Health.Interval = time.Hour // members are unreachable; keep probing down
	cfg.Health.ScrapeInterval = time.Hour
	// Port 1 on loopback: nothing listens, so probes fail fast.
	cfg.Discovery = []DNSSpec{{Name: "vllm.test", Port: 1, KVPort: 5557, ReplayPort: 5558, Interval: 2 * time.Millisecond}}
	cfg.Resolver = res
	cfg.Registerer = reg
	f := startFleet(t, cfg)

	members := func() []string { return names(f.Snapshot().Replicas) }
	waitMembers := func(want ...string) {
		t.Helper()
		testrun.Eventually(t, 10*time.Second, func() bool { return slices.Equal(members(), want) }, fmt.Sprint("members ", want))
	}
	waitMembers("127.0.0.2:1", "127.0.0.3:1", "static")
	a, b := f.Replica("127.0.0.2:1"), f.Replica("127.0.0.3:1")
	if a.Spec.KVEndpoint != "tcp://127.0.0.2:5557" || a.Spec.ReplayEndpoint != "tcp://127.0.0.2:5558" || a.Spec.URL != "http://127.0.0.2:1" {
		t.Errorf("dns spec = %+v", a.Spec)
	}
	a.inflight.Add(7)

	// An address joins: existing pointers and counters survive.
	res.set([]string{"127.0.0.4", "127.0.0.2", "127.0.0.3", "127.0.0.2"}, nil)
	waitMembers("127.0.0.2:1", "127.0.0.3:1", "127.0.0.4:1", "static")
	if f.Replica("127.0.0.2:1") != a || f.Replica("127.0.0.3:1") != b || a.InflightRequests() != 7 {
		t.Error("existing replicas were replaced on re-resolution")
	}

	// Resolution fails: the last known set stays.
	v := f.Snapshot().Version
	res.set(nil, errors.New("server misbehaving"))
	calls := res.calls.Load()
	testrun.Eventually(t, 10*time.Second, func() bool { return res.calls.Load() >= calls+5 }, "failed resolutions")
	if got := members(); !slices.Equal(got, []string{"127.0.0.2:1", "127.0.0.3:1", "127.0.0.4:1", "static"}) || f.Snapshot().Version != v {
		t.Errorf("after failed resolution: members %v (version %d → %d); want unchanged", got, v, f.Snapshot().Version)
	}
	if got := gather(t, reg)[`warmpath_dns_resolutions_total{name=vllm.test,result=error}`]; got < 5 {
		t.Errorf("dns error count = %v; want ≥ 5", got)
	}

	// Addresses leave: removed replicas disappear and are told so.
	res.set([]string{"127.0.0.3"}, nil)
	waitMembers("127.0.0.3:1", "static")
	select {
	case <-a.Removed():
	default:
		t.Error("removed replica's Removed channel is open")
	}
	if f.Replica("127.0.0.3:1") != b {
		t.Error("surviving replica was replaced")
	}
	if _, ok := gather(t, reg)[`warmpath_replica_healthy{replica=127.0.0.2:1}`]; ok {
		t.Error("removed replica still has metric series")
	}

	// An address comes back: a new member.
	res.set([]string{"127.0.0.2", "127.0.0.3"}, nil)
	waitMembers("127.0.0.2:1", "127.0.0.3:1", "static")
	if a2 := f.Replica("127.0.0.2:1"); a2 == a || a2.InflightRequests() != 0 {
		t.Error("returning address reused the old *Replica")
	}

	// An empty answer empties the DNS part; the static replica stays.
	res.set([]string{}, nil)
	waitMembers("static")
}

func TestDNSMergeWithStatic(t *testing.T) {
	res := &fakeResolver{}
	res.set([]string{"127.0.0.1", "127.0.0.2", "not-an-ip", "::ffff:127.0.0.5"}, nil)
	cfg := fastConfig(ReplicaSpec{URL: "http://127.0.0.1:1", Model: "static-model"})
	cfg.Health.Interval, cfg.Health.ScrapeInterval = time.Hour, time.Hour
	cfg.Discovery = []DNSSpec{
		{Name: "vllm.test", Port: 1, Interval: time.Hour},
		{Name: "vllm.test", Port: 1, Interval: time.Hour, Model: "shadowed"}, // same members: first spec wins
	}
	cfg.Resolver = res
	f := startFleet(t, cfg)
	// Both specs resolve concurrently; the first spec's answer wins once in.
	testrun.Eventually(t, 10*time.Second, func() bool {
		r := f.Replica("127.0.0.2:1")
		return len(f.Snapshot().Replicas) == 3 && r != nil && r.Spec.Model == ""
	}, "dns members")
	if got := names(f.Snapshot().Replicas); !slices.Equal(got, []string{"127.0.0.1:1", "127.0.0.2:1", "127.0.0.5:1"}) {
		t.Errorf("members = %v", got)
	}
	if m := f.Replica("127.0.0.1:1").Spec.Model; m != "static-model" {
		t.Errorf("name clash: spec model %q; want the static spec's", m)
	}
}

func TestSnapshotNotTorn(t *testing.T) {
	f, err := New(Config{
		Replicas:  []ReplicaSpec{{Name: "s", URL: "http://127.0.0.1:1"}},
		Discovery: []DNSSpec{{Name: "a", Port: 1}, {Name: "b", Port: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	sets := [][]ReplicaSpec{nil, {}, {}}
	for i := range 6 {
		sets[1] = append(sets[1], f.cfg.Discovery[0].specFor(fmt.Sprintf("127.0.1.%d", i)))
		sets[2] = append(sets[2], f.cfg.Discovery[1].specFor(fmt.Sprintf("127.0.2.%d", i)))
	}
	// Each publish is one of a few whole configurations; a reader must see
	// one of them, sorted, with a consistent index.
	valid := map[int]bool{1: true, 4: true, 7: true, 10: true}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var reads atomic.Int64
	for range 4 {
		wg.Go(func() {
			var last uint64
			for ctx.Err() == nil {
				s := f.Snapshot()
				reads.Add(1)
				if s.Version < last {
					t.Errorf("version went back from %d to %d", last, s.Version)
					return
				}
				last = s.Version
				if !valid[len(s.Replicas)] {
					t.Errorf("snapshot %d has %d replicas", s.Version, len(s.Replicas))
					return
				}
				for i, r := range s.Replicas {
					if i > 0 && s.Replicas[i-1].Spec.Name >= r.Spec.Name {
						t.Errorf("snapshot %d not sorted", s.Version)
						return
					}
					if s.Lookup(r.Spec.Name) != r || r.State() == nil {
						t.Errorf("snapshot %d: index disagrees for %s", s.Version, r.Spec.Name)
						return
					}
				}
			}
		})
	}
	// Publish while the readers read, until they have seen plenty.
	for i := 0; i < 300 || reads.Load() < 20000; i++ {
		f.setDNS(0, sets[1][:3*(i%3)]) // 0, 3 or 6 members
		f.setDNS(1, sets[2][:3*((i/3)%2)])
	}
	cancel()
	wg.Wait()
	if v := f.Snapshot().Version; v < 300 {
		t.Errorf("only %d versions published", v)
	}
}

func TestWatchAndDiff(t *testing.T) {
	f, err := New(Config{Discovery: []DNSSpec{{Name: "a", Port: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	seen := make(chan *Snapshot, 16)
	done := make(chan error, 1)
	go func() { done <- f.Watch(ctx, func(s *Snapshot) { seen <- s }) }()

	s0 := <-seen
	if len(s0.Replicas) != 0 || s0.Version != 1 {
		t.Fatalf("first snapshot = %+v", s0)
	}
	d := f.cfg.Discovery[0]
	f.setDNS(0, []ReplicaSpec{d.specFor("127.0.0.2"), d.specFor("127.0.0.3")})
	s1 := <-seen
	added, removed := s1.Diff(s0)
	if got := names(added); !slices.Equal(got, []string{"127.0.0.2:1", "127.0.0.3:1"}) || len(removed) != 0 {
		t.Errorf("diff 0→1: added %v removed %v", got, names(removed))
	}
	f.setDNS(0, []ReplicaSpec{d.specFor("127.0.0.2"), d.specFor("127.0.0.3")}) // no change: no snapshot
	f.setDNS(0, []ReplicaSpec{d.specFor("127.0.0.3"), d.specFor("127.0.0.4")})
	s2 := <-seen
	if s2.Version != s1.Version+1 {
		t.Errorf("version %d after %d; want +1 (unchanged resolutions publish nothing)", s2.Version, s1.Version)
	}
	added, removed = s2.Diff(s1)
	if !slices.Equal(names(added), []string{"127.0.0.4:1"}) || !slices.Equal(names(removed), []string{"127.0.0.2:1"}) {
		t.Errorf("diff 1→2: added %v removed %v", names(added), names(removed))
	}
	select {
	case <-s1.Changed():
	default:
		t.Error("replaced snapshot's Changed channel is open")
	}
	select {
	case <-f.Snapshot().Changed():
		t.Error("current snapshot's Changed channel is closed")
	default:
	}
	if a, r := s2.Diff(nil); len(a) != 2 || r != nil {
		t.Errorf("Diff(nil) = %v, %v", names(a), names(r))
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Watch = %v; want nil", err)
	}
}

func TestRunTwice(t *testing.T) {
	v := newFakeVLLM(t)
	f := startFleet(t, fastConfig(v.spec("m")))
	testrun.Eventually(t, 10*time.Second, func() bool { return v.hit("/health") > 0 }, "running")
	if err := f.Run(context.Background()); err == nil {
		t.Error("second concurrent Run succeeded")
	}
}

func TestRunRestart(t *testing.T) {
	v := newFakeVLLM(t)
	f, err := New(fastConfig(v.spec("m")))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- f.Run(ctx) }()
		n := v.hit("/health")
		testrun.Eventually(t, 10*time.Second, func() bool { return v.hit("/health") > n+2 }, fmt.Sprint("checks in run ", i))
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run %d = %v", i, err)
		}
	}
}

func TestRegisterTwiceFails(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := Config{Replicas: []ReplicaSpec{{URL: "http://127.0.0.1:1"}}, Registerer: reg}
	if _, err := New(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg); err == nil || !strings.HasPrefix(err.Error(), "fleet: register metrics: ") {
		t.Errorf("second New on the same registry: err = %v", err)
	}
}

func TestInflightMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	f, err := New(Config{Replicas: []ReplicaSpec{{Name: "r", URL: "http://127.0.0.1:1"}}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	fl := f.Replica("r").Begin(42)
	got := gather(t, reg)
	if got[`warmpath_replica_inflight_requests{replica=r}`] != 1 || got[`warmpath_replica_inflight_prefill_tokens{replica=r}`] != 42 ||
		got[`warmpath_fleet_replicas`] != 1 || got[`warmpath_replica_healthy{replica=r}`] != 0 {
		t.Errorf("metrics = %v", got)
	}
	if _, ok := got[`warmpath_replica_metrics_age_seconds{replica=r}`]; ok {
		t.Error("metrics age exported before the first scrape")
	}
	fl.Done()
}

// gather returns the registry's samples keyed by name{label=value,…}.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			key := mf.GetName()
			if len(ls) > 0 {
				key += "{" + strings.Join(ls, ",") + "}"
			}
			out[key] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	}
	return 0
}

// lingeringTransport delays the return of canceled requests, so a Run
// that did not join its goroutines would return while they still run.
type lingeringTransport struct{ base http.RoundTripper }

func (lt lingeringTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := lt.base.RoundTrip(req)
	if req.Context().Err() != nil {
		time.Sleep(50 * time.Millisecond)
	}
	return resp, err
}

func TestNoGoroutineLeak(t *testing.T) {
	v := newFakeVLLM(t)
	block := make(chan struct{})
	defer close(block)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // hang until the client gives up
		case <-r.Context().Done():
		case <-block:
		}
	}))
	defer slow.Close()
	res := &fakeResolver{}
	res.set([]string{"127.0.0.2", "127.0.0.3"}, nil)
	cfg := fastConfig(v.spec(""), ReplicaSpec{URL: slow.URL})
	cfg.Discovery = []DNSSpec{{Name: "vllm.test", Port: 1, Interval: time.Millisecond}}
	cfg.Resolver = res
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	cfg.Client = &http.Client{Transport: lingeringTransport{transport}}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	testrun.Eventually(t, 10*time.Second, func() bool {
		return len(f.Snapshot().Replicas) == 4 && v.hit("/metrics") > 3 && v.hit("/v1/models") > 0
	}, "work")
	if got := fleetGoroutines(); got != [3]int{4, 4, 1} {
		t.Errorf("running: [health scrape dns] goroutines = %v; want [4 4 1]", got)
	}
	res.set([]string{"127.0.0.3"}, nil) // a replica leaves while running: its goroutines stop
	testrun.Eventually(t, 10*time.Second, func() bool { return fleetGoroutines() == [3]int{3, 3, 1} }, "removed replica's goroutines to stop")

	cancel() // the slow replica's probes are in flight now
	if err := <-done; err != nil {
		t.Fatalf("Run = %v; want nil", err)
	}
	// Run joins its goroutines before returning: no polling here.
	if got := fleetGoroutines(); got != [3]int{} {
		t.Errorf("after Run: [health scrape dns] goroutines = %v; want none", got)
	}
}

func TestRunClosesOwnedClient(t *testing.T) {
	v := newFakeVLLM(t)
	f, err := New(fastConfig(v.spec("m"))) // nil Client: the fleet owns one
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	testrun.Eventually(t, 10*time.Second, func() bool { return v.hit("/metrics") > 3 }, "scrapes")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v; want nil", err)
	}
	// Idle connections close asynchronously.
	testrun.Eventually(t, 10*time.Second, func() bool { return stacksContaining("net/http.(*persistConn)") == 0 }, "client connections to close")
}

// fleetGoroutines counts the goroutines running health loops, scrape loops
// and DNS loops.
func fleetGoroutines() [3]int {
	return [3]int{
		stacksContaining("fleet.(*prober).healthLoop"),
		stacksContaining("fleet.(*prober).scrapeLoop"),
		stacksContaining("fleet.(*Fleet).watchDNS"),
	}
}

// stacksContaining counts the goroutines whose stack contains s.
func stacksContaining(s string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	c := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, s) {
			c++
		}
	}
	return c
}
