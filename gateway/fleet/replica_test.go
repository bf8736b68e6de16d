package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmpath/warmpath/scoring"
)

// testReplica returns a pending replica with normalized defaults modified
// by mod.
func testReplica(t *testing.T, mod func(*Config)) *Replica {
	t.Helper()
	cfg := Config{Replicas: []ReplicaSpec{{URL: "http://127.0.0.1:1"}}}
	if mod != nil {
		mod(&cfg)
	}
	n, err := cfg.normalize()
	if err != nil {
		t.Fatal(err)
	}
	return newReplica(n.Replicas[0], &n, slog.New(slog.DiscardHandler))
}

// Steps of the health state machine.
const (
	okStep     = "ok"     // successful active check
	failStep   = "fail"   // failed active check
	passive    = "report" // ReportFailure
	passiveOK  = "good"   // ReportSuccess
	cancelStep = "cancel" // ReportFailure(context.Canceled)
)

func TestHealthStateMachine(t *testing.T) {
	tests := []struct {
		name        string
		fail, recov int
		steps       []string
		want        []bool // Healthy after each step
		toHealthy   uint64
		toUnhealthy uint64
	}{
		{
			name: "pending until first success, then healthy at once",
			fail: 3, recov: 2,
			steps:     []string{failStep, failStep, failStep, failStep, okStep},
			want:      []bool{false, false, false, false, true},
			toHealthy: 1,
		},
		{
			name: "active failures reach the threshold",
			fail: 3, recov: 2,
			steps:     []string{okStep, failStep, failStep, failStep, failStep},
			want:      []bool{true, true, true, false, false},
			toHealthy: 1, toUnhealthy: 1,
		},
		{
			name: "a success resets the failure count",
			fail: 3, recov: 2,
			steps:     []string{okStep, failStep, failStep, okStep, failStep, failStep},
			want:      []bool{true, true, true, true, true, true},
			toHealthy: 1,
		},
		{
			name: "passive failures count",
			fail: 3, recov: 1,
			steps:     []string{okStep, passive, passive, passive},
			want:      []bool{true, true, true, false},
			toHealthy: 1, toUnhealthy: 1,
		},
		{
			name: "passive and active failures share the count",
			fail: 3, recov: 1,
			steps:     []string{okStep, passive, failStep, passive},
			want:      []bool{true, true, true, false},
			toHealthy: 1, toUnhealthy: 1,
		},
		{
			name: "passive success resets the count",
			fail: 2, recov: 1,
			steps:     []string{okStep, passive, passiveOK, passive, passiveOK, passive},
			want:      []bool{true, true, true, true, true, true},
			toHealthy: 1,
		},
		{
			name: "client cancels are not failures",
			fail: 1, recov: 1,
			steps:     []string{okStep, cancelStep, cancelStep},
			want:      []bool{true, true, true},
			toHealthy: 1,
		},
		{
			name: "recovery needs consecutive active successes",
			fail: 1, recov: 3,
			steps:     []string{okStep, failStep, okStep, okStep, failStep, okStep, okStep, okStep},
			want:      []bool{true, false, false, false, false, false, false, true},
			toHealthy: 2, toUnhealthy: 1,
		},
		{
			name: "passive failure while recovering restarts the count",
			fail: 1, recov: 2,
			steps:     []string{okStep, passive, okStep, passive, okStep, okStep},
			want:      []bool{true, false, false, false, false, true},
			toHealthy: 2, toUnhealthy: 1,
		},
		{
			name: "passive success does not heal",
			fail: 1, recov: 1,
			steps:     []string{okStep, passive, passiveOK, passiveOK},
			want:      []bool{true, false, false, false},
			toHealthy: 1, toUnhealthy: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := testReplica(t, func(c *Config) { c.Health.Failures, c.RecoveryThreshold = tt.fail, tt.recov })
			now := time.Unix(1000, 0)
			for i, step := range tt.steps {
				now = now.Add(time.Second)
				switch step {
				case okStep:
					r.activeResult(now, nil)
				case failStep:
					r.activeResult(now, errors.New("GET /health: status 503"))
				case passive:
					r.ReportFailure(errors.New("dial tcp: connection refused"))
				case passiveOK:
					r.ReportSuccess()
				case cancelStep:
					r.ReportFailure(fmt.Errorf("proxy: %w", context.Canceled))
				}
				if got := r.State().Healthy; got != tt.want[i] {
					t.Fatalf("after step %d (%s): Healthy = %v; want %v (state %+v)", i, step, got, tt.want[i], r.State())
				}
			}
			if got := r.toHealthy.Load(); got != tt.toHealthy {
				t.Errorf("transitions to healthy = %d; want %d", got, tt.toHealthy)
			}
			if got := r.toUnhealthy.Load(); got != tt.toUnhealthy {
				t.Errorf("transitions to unhealthy = %d; want %d", got, tt.toUnhealthy)
			}
		})
	}
}

func TestHealthReason(t *testing.T) {
	r := testReplica(t, func(c *Config) { c.Health.Failures = 2 })
	if got := r.State().HealthReason; got != reasonPending {
		t.Errorf("initial reason = %q; want %q", got, reasonPending)
	}
	t0 := time.Unix(1000, 0)
	r.activeResult(t0, errors.New("GET /health: status 503"))
	if s := r.State(); s.HealthReason != "active: GET /health: status 503" || !s.LastCheck.Equal(t0) {
		t.Errorf("pending after failure: state %+v", s)
	}
	r.activeResult(t0.Add(time.Second), nil)
	if s := r.State(); !s.Healthy || s.HealthReason != "ok" {
		t.Errorf("after success: state %+v", s)
	}
	r.ReportFailure(errors.New("EOF"))
	if s := r.State(); !s.Healthy || s.HealthReason != "ok" {
		t.Errorf("one passive failure below threshold: state %+v", s)
	}
	r.ReportFailure(nil)
	if s := r.State(); s.Healthy || s.HealthReason != "passive: request failed" {
		t.Errorf("after threshold: state %+v", s)
	}
}

// Calls in flight together when one of them fails are one failure: a
// stall that times out every pending call at once does not mark the
// replica down (FailureThreshold 3), while calls sent after a failure
// that fail too still do.
func TestConcurrentFailuresCountOnce(t *testing.T) {
	r := testReplica(t, nil)
	r.activeResult(time.Unix(1000, 0), nil)
	began := time.Now()
	for range 20 { // twenty calls pending together, all timing out
		r.ReportFailureOf(began, errors.New("context deadline exceeded"))
	}
	if s := r.State(); !s.Healthy {
		t.Fatalf("twenty calls in flight together failed once: %+v; want healthy (one failure of three)", s)
	}
	for i := range 2 { // each sent after the last failure, each failing
		r.ReportFailureOf(time.Now(), errors.New("connection refused"))
		if got, want := r.State().Healthy, i == 0; got != want {
			t.Fatalf("after %d later failures: healthy %v; want %v", i+1, got, want)
		}
	}
	if got := r.State().HealthReason; got != "passive: connection refused" {
		t.Errorf("reason %q", got)
	}
}

func TestSaturated(t *testing.T) {
	t0 := time.Unix(1000, 0)
	fresh := func(s *State) { s.Healthy, s.ScrapedAt = true, t0 }
	tests := []struct {
		name    string
		sat     scoring.Saturation
		state   func(*State)
		prefill int64
		now     time.Time
		want    bool
		reason  string
	}{
		{"idle", scoring.Saturation{}, fresh, 0, t0, false, ""},
		{"pending", scoring.Saturation{}, func(s *State) {}, 0, t0, true, ReasonUnhealthy},
		{"unhealthy beats everything", scoring.Saturation{}, func(s *State) { s.ScrapedAt, s.Waiting = t0, 100 }, 0, t0, true, ReasonUnhealthy},
		{"never scraped", scoring.Saturation{}, func(s *State) { s.Healthy = true }, 0, t0, true, ReasonStale},
		{"fresh at the limit", scoring.Saturation{}, fresh, 0, t0.Add(time.Second), false, ""},
		{"stale", scoring.Saturation{}, fresh, 0, t0.Add(time.Second + time.Millisecond), true, ReasonStale},
		{"waiting below", scoring.Saturation{}, func(s *State) { fresh(s); s.Waiting = 7 }, 0, t0, false, ""},
		{"waiting at default max", scoring.Saturation{}, func(s *State) { fresh(s); s.Waiting = 32 }, 0, t0, true, ReasonWaiting},
		{"waiting custom max", scoring.Saturation{MaxWaiting: 2}, func(s *State) { fresh(s); s.Waiting = 2 }, 0, t0, true, ReasonWaiting},
		{"waiting check off", scoring.Saturation{MaxWaiting: -1}, func(s *State) { fresh(s); s.Waiting = 1000 }, 0, t0, false, ""},
		{"kv below", scoring.Saturation{}, func(s *State) { fresh(s); s.KVUsage = 0.94 }, 0, t0, false, ""},
		{"kv at max", scoring.Saturation{}, func(s *State) { fresh(s); s.KVUsage = 1 }, 0, t0, true, ReasonKV},
		{"kv check off", scoring.Saturation{MaxKVUsage: -1}, func(s *State) { fresh(s); s.KVUsage = 1 }, 0, t0, false, ""},
		{"waiting before kv", scoring.Saturation{}, func(s *State) { fresh(s); s.Waiting, s.KVUsage = 33, 1 }, 0, t0, true, ReasonWaiting},
		{"prefill at the default cap", scoring.Saturation{}, fresh, scoring.DefaultMaxInflightPrefillTokens, t0, true, ReasonInflight},
		{"prefill check off", scoring.Saturation{MaxInflightPrefillTokens: -1}, fresh, 1 << 30, t0, false, ""},
		{"prefill below", scoring.Saturation{MaxInflightPrefillTokens: 1000}, fresh, 999, t0, false, ""},
		{"prefill at max", scoring.Saturation{MaxInflightPrefillTokens: 1000}, fresh, 1000, t0, true, ReasonInflight},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := testReplica(t, func(c *Config) { c.Saturation = tt.sat })
			r.mu.Lock()
			r.update(tt.state)
			r.mu.Unlock()
			r.inflightPrefill.Store(tt.prefill)
			got, reason := r.Saturated(tt.now)
			if got != tt.want || reason != tt.reason {
				t.Errorf("Saturated = %v, %q; want %v, %q", got, reason, tt.want, tt.reason)
			}
		})
	}
}

func TestSaturatedZeroReplica(t *testing.T) {
	var r Replica // built outside New: defaults, pending
	if sat, reason := r.Saturated(time.Now()); !sat || reason != ReasonUnhealthy {
		t.Errorf("zero Replica: Saturated = %v, %q; want true, %q", sat, reason, ReasonUnhealthy)
	}
	if r.State() == nil {
		t.Error("zero Replica: State() = nil")
	}
	r.ReportFailure(errors.New("x")) // must not panic
	r.ReportSuccess()
}

func TestFlight(t *testing.T) {
	r := testReplica(t, nil)
	a := r.Begin(100)
	b := r.Begin(50)
	if got, want := [2]int64{r.InflightRequests(), r.InflightPrefillTokens()}, [2]int64{2, 150}; got != want {
		t.Fatalf("after Begin: %v; want %v", got, want)
	}
	var wg sync.WaitGroup
	for range 8 { // idempotent under concurrency
		wg.Go(a.FirstByte)
	}
	wg.Wait()
	if got := r.InflightPrefillTokens(); got != 50 {
		t.Errorf("after FirstByte: prefill = %d; want 50", got)
	}
	a.Done()
	a.Done()
	b.Done() // implies FirstByte
	if got, want := [2]int64{r.InflightRequests(), r.InflightPrefillTokens()}, [2]int64{0, 0}; got != want {
		t.Errorf("after Done: %v; want %v", got, want)
	}
}

func TestStateServes(t *testing.T) {
	s := &State{Models: []string{"a", "c"}}
	if !s.Serves("a") || !s.Serves("c") || s.Serves("b") || (&State{}).Serves("a") {
		t.Error("Serves mismatch")
	}
}

func TestSetModelsSortsAndDedups(t *testing.T) {
	r := testReplica(t, nil)
	r.setModels([]string{"b", "a", "b"})
	if got := strings.Join(r.State().Models, ","); got != "a,b" {
		t.Errorf("Models = %s; want a,b", got)
	}
}

// Up ends when the replica turns unhealthy, and a new one starts when it
// recovers.
func TestUpContext(t *testing.T) {
	r := testReplica(t, nil)
	if r.Up().Err() == nil {
		t.Fatal("pending replica: Up is live")
	}
	t0 := time.Unix(1000, 0)
	r.activeResult(t0, nil)
	up := r.Up()
	if up.Err() != nil {
		t.Fatal("healthy replica: Up has ended")
	}
	for range DefaultFailureThreshold {
		r.ReportFailure(errors.New("hung"))
	}
	if up.Err() == nil || r.Up().Err() == nil {
		t.Error("unhealthy replica: Up still live")
	}
	for range DefaultRecoveryThreshold {
		r.activeResult(t0, nil)
	}
	if r.Up().Err() != nil || r.Up() == up {
		t.Error("recovered replica: want a new live Up")
	}
}

// The line of flights awaiting a first byte: its head, and how long the
// head has been first (since it began, or since the one before it left).
func TestPrefillLine(t *testing.T) {
	now := time.Unix(5000, 0)
	clock := func() time.Time { return now }
	r := &Replica{cfg: &Config{Now: clock}}
	if n, _, _ := r.PrefillLine(now); n != 0 {
		t.Fatalf("empty line has %d", n)
	}
	a := r.Begin(1000)
	now = now.Add(time.Second)
	b := r.Begin(500)
	now = now.Add(2 * time.Second)
	if n, tok, d := r.PrefillLine(now); n != 2 || tok != 1000 || d != 3*time.Second {
		t.Errorf("line = %d, %d, %v; want 2, 1000, 3s", n, tok, d)
	}
	a.FirstByte()
	now = now.Add(time.Second)
	if n, tok, d := r.PrefillLine(now); n != 1 || tok != 500 || d != time.Second {
		t.Errorf("after a's first byte: %d, %d, %v; want 1, 500, 1s (first since a left)", n, tok, d)
	}
	b.Done()
	b.Done()
	if n, _, _ := r.PrefillLine(now); n != 0 || r.InflightPrefillTokens() != 0 || r.InflightRequests() != 1 {
		t.Errorf("line %d, prefill %d, in flight %d; want 0, 0, 1 (a not done)", n, r.InflightPrefillTokens(), r.InflightRequests())
	}
}
