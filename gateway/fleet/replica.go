package fleet

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmpath/warmpath/scoring"
)

// Saturation reasons returned by [Replica.Saturated]: the replica's own
// two, then the load thresholds' (see [scoring.Saturation.Judge]).
const (
	ReasonUnhealthy = "unhealthy" // not healthy (or never checked successfully)
	ReasonStale     = "stale"     // no successful scrape within Health.StaleAfter
	ReasonWaiting   = scoring.SaturatedWaiting
	ReasonKV        = scoring.SaturatedKV
	ReasonInflight  = scoring.SaturatedInflight
)

// reasonPending is the HealthReason of a replica that has not answered a
// health check yet.
const reasonPending = "pending: no successful health check yet"

// State is an immutable view of what the fleet last learned about a
// replica. A new State replaces the old one on every change; never modify
// one (or its Models slice) obtained from [Replica.State].
type State struct {
	// Healthy reports whether the replica may receive traffic. It is false
	// until the first successful health check.
	Healthy bool
	// HealthReason says why: "ok" when healthy, otherwise the last failure
	// ("active: …" for a health check, "passive: …" for a proxy report) or
	// that no check has succeeded yet.
	HealthReason string
	// LastCheck is when the last active health check finished; zero before
	// the first.
	LastCheck time.Time

	// Running is the number of requests in the engine's batch, summed over
	// the model_name and engine labels.
	Running int
	// Waiting is the number of requests queued in the engine, summed over
	// the model_name and engine labels.
	Waiting int
	// KVUsage is the fraction of KV-cache blocks in use, 0..1 (the highest
	// over data-parallel engines).
	KVUsage float64
	// PrefixQueries and PrefixHits are the engine's cumulative prefix-cache
	// query and hit counters, in tokens.
	PrefixQueries, PrefixHits float64
	// BlockSize is the engine's KV block size in tokens, 0 when unknown.
	BlockSize int
	// NumGPUBlocks is the number of KV blocks on the GPU (per engine), 0
	// when unknown.
	NumGPUBlocks int
	// QueueTimeCount and QueueTimeSum, PrefillTimeCount and
	// PrefillTimeSum are the engine's cumulative request queue-time and
	// prefill-time histograms (vllm:request_queue_time_seconds,
	// vllm:request_prefill_time_seconds): requests and seconds; 0 when
	// not exposed.
	QueueTimeCount, QueueTimeSum, PrefillTimeCount, PrefillTimeSum float64
	// Rates is the engine's recent request arrivals and uncached prompt
	// tokens per second, from the counters' increments between scrapes
	// (scoring.MeterWindow); zero until two scrapes are in.
	Rates scoring.Meter
	// NumCPUBlocks is the number of KV blocks of the engine's CPU offload
	// tier (per engine; cache_config_info's num_cpu_blocks), 0 when unknown
	// or none.
	NumCPUBlocks int
	// Restarts counts engine restarts seen by this process: scrapes in
	// which the engine's prefix-cache query counter went backwards (a new
	// process starts it from zero). A restarted engine has lost its cache.
	Restarts int
	// ScrapedAt is when the metrics above were last scraped successfully;
	// zero before the first success.
	ScrapedAt time.Time
	// ScrapeErr is the error of the last scrape, "" when it succeeded.
	ScrapeErr string
	// InflightAtScrape is [Replica.InflightRequests] when the metrics
	// above were scraped: requests sent since then (InflightRequests −
	// InflightAtScrape, when positive) are not in Running or Waiting yet.
	InflightAtScrape int

	// Models lists the models the replica serves, sorted: the spec's Model,
	// or what GET /v1/models returned. Nil until discovered.
	Models []string

	scheduled float64 // the engine's requests-scheduled counter, -1 when not exposed
}

// Serves reports whether model is among s.Models.
func (s *State) Serves(model string) bool {
	_, ok := slices.BinarySearch(s.Models, model)
	return ok
}

// Replica is one member of the fleet. Its pointer is stable for as long as
// it is a member: a replica that leaves and comes back is a new Replica.
// Its methods are safe for concurrent use.
type Replica struct {
	// Spec is the replica's configuration. Do not modify it.
	Spec ReplicaSpec

	url *url.URL // Spec.URL, parsed once; read-only

	inflight        atomic.Int64 // requests sent, not finished (see Begin)
	inflightPrefill atomic.Int64 // prompt tokens sent, no first byte yet (see Begin)

	lineMu    sync.Mutex // guards line and lastFirst
	line      []*Flight  // flights awaiting their first byte, in Begin order
	lastFirst time.Time  // when the last flight left line

	cfg *Config      // normalized, shared, read-only
	log *slog.Logger // with the replica's name

	state atomic.Pointer[State] // never nil

	mu          sync.Mutex  // guards fails, passes, everHealthy, engineQueries and read-modify-write of state
	fails       int         // consecutive failures, active or passive
	passes      int         // consecutive active successes while unhealthy
	everHealthy bool        // the replica has been healthy at least once
	anyFailed   atomic.Bool // fails > 0, read lock-free by ReportSuccess and Failing
	// passiveAt is when the last passive failure that counted was
	// reported (see ReportFailureOf).
	passiveAt time.Time
	// engineQueries is the last scrape's prefix-cache queries by engine
	// label (see allWentBack).
	engineQueries map[int]float64

	scrapeErrors  atomic.Uint64
	toHealthy     atomic.Uint64
	toUnhealthy   atomic.Uint64
	scrapeFailing atomic.Bool // last scrape failed; for log de-duplication

	removed chan struct{} // closed when the replica leaves the fleet

	up atomic.Pointer[upEpoch] // the current healthy period; see Up

	// cancel stops the replica's goroutines; guarded by Fleet.mu.
	cancel context.CancelFunc
}

// upEpoch is one period during which a replica is healthy: ctx ends when
// the period does.
type upEpoch struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// downEpoch is the epoch of a replica that is not healthy: already ended.
var downEpoch = func() *upEpoch {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return &upEpoch{ctx, cancel}
}()

// Up returns a context that ends when the replica stops being healthy (at
// once if it is not healthy now). Requests waiting on the replica tie
// their attempts to it (context.AfterFunc), so a replica that hangs
// releases them for a retry elsewhere as soon as health checks notice.
func (r *Replica) Up() context.Context {
	if e := r.up.Load(); e != nil {
		return e.ctx
	}
	return downEpoch.ctx
}

// newReplica returns a pending replica for the normalized spec s.
func newReplica(s ReplicaSpec, cfg *Config, log *slog.Logger) *Replica {
	u, err := url.Parse(s.URL)
	if err != nil {
		u = &url.URL{} // unreachable: normalized specs parse
	}
	r := &Replica{
		Spec:    s,
		url:     u,
		cfg:     cfg,
		log:     log.With("replica", s.Name),
		removed: make(chan struct{}),
	}
	st := &State{HealthReason: reasonPending}
	if s.Model != "" {
		st.Models = []string{s.Model}
	}
	r.state.Store(st)
	return r
}

// URL returns the replica's parsed base URL. Do not modify it.
func (r *Replica) URL() *url.URL { return r.url }

// InflightRequests returns how many requests the gateway has sent to the
// replica that have not finished (see [Replica.Begin]).
func (r *Replica) InflightRequests() int64 { return r.inflight.Load() }

// InflightPrefillTokens returns how many prompt tokens the gateway has
// sent to the replica whose responses have not produced a first byte yet
// (see [Replica.Begin]).
func (r *Replica) InflightPrefillTokens() int64 { return r.inflightPrefill.Load() }

// State returns the replica's latest state. It never returns nil and does
// not block.
func (r *Replica) State() *State {
	if s := r.state.Load(); s != nil {
		return s
	}
	return &State{HealthReason: reasonPending}
}

// Removed returns a channel that is closed when the replica leaves the
// fleet, for example to stop its KV-event subscriber.
func (r *Replica) Removed() <-chan struct{} { return r.removed }

// update publishes a modified copy of the state. The caller holds r.mu.
func (r *Replica) update(fn func(*State)) *State {
	s := *r.State()
	fn(&s)
	r.state.Store(&s)
	return &s
}

// ReportFailure records a failed request (a dial error, a 5xx from the
// engine, a broken stream). Consecutive failures, counted together with
// failed active checks, make the replica unhealthy at Health.Failures; only
// active checks make it healthy again. Errors matching context.Canceled are
// ignored: a client that goes away is not the replica's fault. A nil err
// counts as an unspecified failure. It is ReportFailureOf a call that
// began now, which always counts.
func (r *Replica) ReportFailure(err error) { r.ReportFailureOf(time.Now(), err) }

// ReportFailureOf records, as ReportFailure does, the failure of a call to
// the replica that began at began. Calls in flight together when one of
// them failed are one failure, not one each: a host stall times out every
// call pending at once, a crash resets every connection, and counting
// each would mark a replica down on one event (a gateway pausing for two
// seconds once ejected a whole healthy fleet this way, its every pending
// /tokenize timing out together). So a failure counts only if its call
// began after the last failure that counted was reported; a replica that
// keeps failing what is sent to it after a failure still reaches
// Health.Failures.
func (r *Replica) ReportFailureOf(began time.Time, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	msg := "request failed"
	if err != nil {
		msg = err.Error()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if began.Before(r.passiveAt) {
		return // in flight when the last counted failure came: the same event
	}
	r.passiveAt = time.Now()
	r.failLocked("passive: "+msg, time.Time{})
}

// Failing reports whether the replica's last call or health check failed
// (consecutive failures, below Health.Failures or not): it may be going
// down, and what it was running may have failed rather than finished. A
// successful request or health check clears it. It does not block.
func (r *Replica) Failing() bool { return r.anyFailed.Load() }

// ReportSuccess records a successful request: it resets the consecutive
// failure count. It does not make an unhealthy replica healthy. It is cheap
// when there were no failures (one atomic load).
func (r *Replica) ReportSuccess() {
	if !r.anyFailed.Load() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fails = 0
	r.anyFailed.Store(false)
}

// activeResult records the outcome of one active health check finished at
// now and reports whether the replica just became healthy.
func (r *Replica) activeResult(now time.Time, err error) (recovered bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.failLocked("active: "+err.Error(), now)
		return false
	}
	r.fails = 0
	r.anyFailed.Store(false)
	s := r.State()
	if s.Healthy {
		r.update(func(s *State) { s.LastCheck = now })
		return false
	}
	r.passes++
	// A replica that has never been healthy needs no hysteresis.
	if r.passes < r.conf().RecoveryThreshold && r.everHealthy {
		r.update(func(s *State) { s.LastCheck = now })
		return false
	}
	r.passes = 0
	r.everHealthy = true
	ctx, cancel := context.WithCancel(context.Background())
	r.up.Store(&upEpoch{ctx, cancel})
	r.update(func(s *State) {
		s.Healthy, s.HealthReason, s.LastCheck = true, "ok", now
	})
	r.toHealthy.Add(1)
	r.logger().Info("fleet: replica healthy")
	return true
}

// failLocked records one failure; now is the check time for active
// failures and zero for passive ones. The caller holds r.mu.
func (r *Replica) failLocked(reason string, now time.Time) {
	r.fails++
	r.passes = 0
	r.anyFailed.Store(true)
	s := r.State()
	flip := s.Healthy && r.fails >= r.conf().Health.Failures
	r.update(func(s *State) {
		if !now.IsZero() {
			s.LastCheck = now
		}
		if flip || !s.Healthy {
			s.Healthy, s.HealthReason = false, reason
		}
	})
	switch {
	case flip:
		if e := r.up.Swap(nil); e != nil {
			e.cancel()
		}
		r.toUnhealthy.Add(1)
		r.logger().Warn("fleet: replica unhealthy", "reason", reason, "failures", r.fails)
	case !r.everHealthy && r.fails == r.conf().Health.Failures:
		r.logger().Warn("fleet: replica not answering yet", "reason", reason, "failures", r.fails)
	}
}

// allWentBack reports whether every engine (data-parallel rank) in both
// scrapes counted fewer prefix-cache queries now: the whole engine
// restarted. One rank restarting alone is its KV-event subscriber's to
// see (its sequence goes back), and clears that rank only. Scrapes
// without engine labels count as one engine.
func allWentBack(before, now map[int]float64) bool {
	for e, b := range before {
		if n, ok := now[e]; ok && n >= b {
			return false
		}
	}
	return true
}

// setMetrics publishes a successful scrape taken at now.
func (r *Replica) setMetrics(now time.Time, m engineMetrics) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer func() { r.engineQueries = m.EngineQueries }()
	r.update(func(s *State) {
		if m.PrefixQueries < s.PrefixQueries && !s.ScrapedAt.IsZero() && allWentBack(r.engineQueries, m.EngineQueries) {
			s.Restarts++
			r.logger().Warn("fleet: replica restarted (its counters went back to zero); its cache is gone", "queries_before", s.PrefixQueries, "queries_now", m.PrefixQueries)
		}
		s.Rates, s.scheduled = nextRates(s, &m, now), m.scheduled()
		s.Running, s.Waiting, s.KVUsage = count(m.Running), count(m.Waiting), m.KVUsage
		s.PrefixQueries, s.PrefixHits = m.PrefixQueries, m.PrefixHits
		s.QueueTimeCount, s.QueueTimeSum, s.PrefillTimeCount, s.PrefillTimeSum = m.QueueCount, m.QueueSum, m.PrefillCount, m.PrefillSum
		if m.seen&seenCacheConfig != 0 {
			s.BlockSize, s.NumGPUBlocks, s.NumCPUBlocks = m.BlockSize, m.NumGPUBlocks, m.NumCPUBlocks
		}
		s.ScrapedAt, s.ScrapeErr = now, ""
		s.InflightAtScrape = int(r.inflight.Load())
	})
}

// count converts a scraped gauge to a request count, clamping garbage.
func count(v float64) int {
	if !(v > 0) { // also NaN
		return 0
	}
	return int(min(v, math.MaxInt32))
}

// setScrapeErr records a failed scrape; the previous metrics stay and age.
func (r *Replica) setScrapeErr(err error) {
	r.scrapeErrors.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.update(func(s *State) { s.ScrapeErr = err.Error() })
}

// setModels publishes discovered models (sorted, deduplicated).
func (r *Replica) setModels(models []string) {
	slices.Sort(models)
	models = slices.Compact(models)
	r.mu.Lock()
	defer r.mu.Unlock()
	if slices.Equal(models, r.State().Models) {
		return
	}
	r.update(func(s *State) { s.Models = models })
	r.logger().Info("fleet: replica models", "models", models)
}

// zeroReplicaConfig serves a Replica built outside New (a zero Replica in a
// test). It is never modified.
var zeroReplicaConfig = Config{
	Health:            HealthConfig{Failures: DefaultFailureThreshold, StaleAfter: DefaultStaleAfter},
	RecoveryThreshold: DefaultRecoveryThreshold,
	Saturation:        scoring.Saturation{}.WithDefaults(),
}

// conf returns the normalized configuration in force.
func (r *Replica) conf() *Config {
	if r.cfg == nil {
		return &zeroReplicaConfig
	}
	return r.cfg
}

// logger returns the replica's logger, a discarding one for a Replica built
// outside New.
func (r *Replica) logger() *slog.Logger {
	if r.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.log
}

// saturation returns the thresholds and staleness limit in force.
func (r *Replica) saturation() (scoring.Saturation, time.Duration) {
	c := r.conf()
	return c.Saturation, c.Health.StaleAfter
}

// Saturated reports whether the replica should take no more affinity
// (sticky or prefix-driven) traffic at time now, and why: "unhealthy",
// "stale" (no successful scrape within Health.StaleAfter, or none yet), or one of
// the load thresholds' reasons ([scoring.Saturation.Judge]: queue, KV use,
// in-flight prefill). It does not block.
func (r *Replica) Saturated(now time.Time) (bool, string) {
	sat, staleAfter := r.saturation()
	s := r.State()
	switch {
	case !s.Healthy:
		return true, ReasonUnhealthy
	case s.ScrapedAt.IsZero() || now.Sub(s.ScrapedAt) > staleAfter:
		return true, ReasonStale
	}
	return sat.Judge(s.Waiting, s.KVUsage, r.inflightPrefill.Load())
}

// Flight is one request in flight on a replica, returned by
// [Replica.Begin]. Its methods are idempotent and safe for concurrent use.
type Flight struct {
	r                   *Replica
	prefill             int64
	begun               time.Time
	firstByte, finished atomic.Bool
}

// Begin counts a request with promptTokens prefill tokens as in flight on
// r. Call [Flight.FirstByte] when the response's first byte arrives and
// [Flight.Done] when it ends (Done implies FirstByte).
func (r *Replica) Begin(promptTokens int64) *Flight {
	r.inflight.Add(1)
	r.inflightPrefill.Add(promptTokens)
	fl := &Flight{r: r, prefill: promptTokens, begun: r.now()}
	r.lineMu.Lock()
	r.line = append(r.line, fl)
	r.lineMu.Unlock()
	return fl
}

// FirstByte releases the request's prefill tokens.
func (fl *Flight) FirstByte() {
	if fl.firstByte.CompareAndSwap(false, true) {
		fl.r.inflightPrefill.Add(-fl.prefill)
		fl.r.leaveLine(fl)
	}
}

// leaveLine takes fl out of the line of flights awaiting a first byte.
func (r *Replica) leaveLine(fl *Flight) {
	r.lineMu.Lock()
	defer r.lineMu.Unlock()
	if i := slices.Index(r.line, fl); i >= 0 {
		r.line = slices.Delete(r.line, i, i+1)
	}
	r.lastFirst = r.now()
}

// PrefillLine describes the gateway's requests to r that await their
// first byte at now: how many, the oldest one's prompt tokens, and how
// long it has been first in line (since it was sent, or since the one
// before it got its first byte, whichever is later). The engine has been
// working on it that long, as far as this gateway can tell.
func (r *Replica) PrefillLine(now time.Time) (n int, headTokens int64, headFor time.Duration) {
	r.lineMu.Lock()
	defer r.lineMu.Unlock()
	if len(r.line) == 0 {
		return 0, 0, 0
	}
	head := r.line[0]
	since := head.begun
	if r.lastFirst.After(since) {
		since = r.lastFirst
	}
	return len(r.line), head.prefill, max(0, now.Sub(since))
}

// now is the fleet's clock (time.Now for a Replica built outside New).
func (r *Replica) now() time.Time {
	if r.cfg == nil || r.cfg.Now == nil {
		return time.Now()
	}
	return r.cfg.Now()
}

// Done ends the request.
func (fl *Flight) Done() {
	fl.FirstByte()
	if fl.finished.CompareAndSwap(false, true) {
		fl.r.inflight.Add(-1)
	}
}
