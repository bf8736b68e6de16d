package admission

import (
	"fmt"
	"math"
	"time"

	"github.com/warmpath/warmpath/tenancy/fairq"
)

// Config configures the gateway's admission queue (queue: in the
// configuration file) (package
// tenancy/fairq): while every replica serving a model is saturated,
// requests wait in the gateway, in per-tenant weighted fair queues with
// turn priority, and are routed only when they leave. The zero value is
// the default: the queue on, policy fair.
type Config struct {
	// Disabled turns the queue off: every request is routed at once and
	// the engines see arrival order (the fifo baseline).
	Disabled bool `yaml:"disabled"`
	// Policy is fair (default: class priority with a guaranteed
	// background share, weighted fair sharing across tenants, turns in
	// progress first) or strict (interactive strictly before background,
	// first come first served, no tenant fairness).
	Policy string `yaml:"policy"`
	// BackgroundShare is the share of the dispatches made while both
	// classes wait that goes to background, so it always progresses;
	// default 0.1. Negative means 0.
	BackgroundShare float64 `yaml:"background_share"`
	// MaxQueued bounds the requests waiting in this gateway; default
	// 5000. Past it a request is refused with 429 and Retry-After.
	MaxQueued int `yaml:"max_queued"`
	// MaxQueuedPerTenant bounds one tenant's waiting requests; default
	// 1000.
	MaxQueuedPerTenant int `yaml:"max_queued_per_tenant"`
	// Timeout is the longest a request waits before a 429; default 60s.
	Timeout time.Duration `yaml:"timeout"`
	// OutputWeight is what an output token costs in a tenant's virtual
	// counter relative to a prompt token that is not a cache hit; default
	// 2.
	OutputWeight float64 `yaml:"output_weight"`
	// AgeCredit is the tokens of attained service one second of waiting
	// forgives when ordering a tenant's turns; default 1000. Negative
	// means 0.
	AgeCredit float64 `yaml:"age_credit"`
	// ScanDepth is how many waiting requests, in the queue's order, a
	// dispatch considers when the first cannot start at once on the
	// replica its routing chooses (that replica has no room while another
	// has): the first whose replica has room goes; default 8.
	ScanDepth int `yaml:"scan_depth"`
	// SyncInterval is how often the virtual counters are exchanged with
	// Redis (one round trip for all), so shares hold across gateways;
	// default 100ms.
	SyncInterval time.Duration `yaml:"sync_interval"`
	// RecheckInterval is how often capacity is re-checked besides the
	// checks on every scrape, every finished request and every streaming
	// request's first token; default 100ms.
	RecheckInterval time.Duration `yaml:"recheck_interval"`
	// VLLMPriority sends a background request's class to vLLM as
	// "priority": 1 (interactive is vLLM's default 0), so interactive
	// turns also go first inside an engine. Only for engines run with
	// --scheduling-policy priority: others answer 400. Default off.
	VLLMPriority bool `yaml:"vllm_priority"`
	// Saturation says when a model's replicas have room.
	Saturation Saturation `yaml:"saturation"`
}

// Saturation judges, per model and class, whether its replicas can
// start another request. A replica is available unless it is unhealthy,
// failing (a request sent to it or its health check failed since its last
// success, before health.failures marks it unhealthy), its metrics are
// stale (stale metrics count as saturated) or it is past routing's
// thresholds (routing.max_waiting, max_kv_usage,
// max_inflight_prefill_tokens). The model has room for a request when
// Σ max(0, room_r) over its available replicas exceeds the requests
// already admitted but not routed yet, where
//
//	room_r = EngineWaiting − queued_r                          interactive
//	room_r = EngineWaiting − pending_r                         interactive, with vllm_priority
//	room_r = BackgroundEngineWaiting − waiting'_r              background, while kv_r < BackgroundMaxKVUsage (else 0)
//	queued_r = max(waiting'_r, notstarted_r)
//	waiting'_r = waiting_r + sent_r − started_r (started_r taking it to 0 at most)
//
// waiting_r and kv_r are the replica's engine queue and KV-cache use as
// last scraped; sent_r is what this gateway sent it since that scrape net
// of what finished since (negative when more finished: each finished
// request freed a place a waiting one takes, so dispatch follows
// completions rather than the next scrape); started_r is this gateway's
// streaming requests on it whose first token came since that scrape and
// that are still running (they have left its engine queue, so room opens
// at a first token rather than at the next scrape); notstarted_r is this
// gateway's requests on it that have not started (no first byte yet),
// which a scrape taken before the engine saw them would miss (a
// non-streaming answer's first byte is its end, so a non-streaming
// request counts for two scrape intervals at most, after which a scrape
// taken since the engine saw it tells: counting it until it finished
// capped a replica at EngineWaiting such requests in flight, however
// many the engine could run); pending_r
// is the interactive ones among them: an engine that schedules by
// priority serves those before any background work, so only they are
// ahead. With MaxRunning set, room_r is also at
// most MaxRunning − (running_r + sent_r). Background sees less room so
// that interactive turns find an engine able to start them at once: KV
// blocks free (few background requests sit in an engine queue, where the
// engine would hand them the blocks it frees) and a short queue. And
// while interactive traffic lasts, InteractiveReserve replicas take no
// background at all (their room is not counted for it, and routing does
// not offer them to it): an engine steps through every running request's
// prefill chunk before a newly arrived one, whatever its priority (vLLM
// preempts only for KV blocks, never for a waiting request), so an
// interactive turn that lands beside a long background prefill waits out
// that prefill; on a reserved replica there is none.
type Saturation struct {
	// EngineWaiting is the engine queue a replica may have and still take
	// more; default 4. Higher keeps engines busier through scrape lag,
	// lower leaves more of the order to the gateway.
	EngineWaiting int `yaml:"engine_waiting"`
	// BackgroundEngineWaiting is EngineWaiting for background requests;
	// default 1.
	BackgroundEngineWaiting int `yaml:"background_engine_waiting"`
	// BackgroundMaxKVUsage is the KV-cache use (0..1] at or above which a
	// replica takes no background requests, keeping the rest for
	// interactive turns; default 0.9. Negative disables the headroom
	// (background sees the same room as interactive).
	BackgroundMaxKVUsage float64 `yaml:"background_max_kv_usage"`
	// MaxRunning, when positive, is the batch size (vLLM's
	// --max-num-seqs) at which a replica has no room; default 0, not
	// judged (a full batch shows as a waiting queue anyway).
	MaxRunning int `yaml:"max_running"`
	// InteractiveReserve is how many of a model's replicas are kept for
	// interactive turns while interactive traffic lasts: a replica joins
	// the reserve when this gateway sends it an interactive request and
	// fewer are reserved (never all of the model's replicas), and leaves
	// it ReserveIdle after its last one. Background requests are not
	// routed to a reserved replica (unless no other is healthy), so an
	// interactive turn there never waits behind a background prefill;
	// default 1. Negative disables the reserve.
	InteractiveReserve int `yaml:"interactive_reserve"`
	// ReserveIdle is how long a reserved replica stays reserved after
	// the last interactive request this gateway sent it; default 60s.
	ReserveIdle time.Duration `yaml:"reserve_idle"`
}

// Defaults of Saturation.
const (
	DefaultEngineWaiting           = 4
	DefaultBackgroundEngineWaiting = 1
	DefaultBackgroundMaxKVUsage    = 0.9
	DefaultInteractiveReserve      = 1
	DefaultReserveIdle             = 60 * time.Second
)

// WithDefaults returns q with every zero field at its default.
func (q Config) WithDefaults() Config {
	if q.Policy == "" {
		q.Policy = fairq.DefaultPolicy
	}
	if q.BackgroundShare == 0 {
		q.BackgroundShare = fairq.DefaultBackgroundShare
	}
	if q.MaxQueued == 0 {
		q.MaxQueued = fairq.DefaultMaxQueued
	}
	if q.MaxQueuedPerTenant == 0 {
		q.MaxQueuedPerTenant = fairq.DefaultMaxQueuedPerTenant
	}
	if q.Timeout == 0 {
		q.Timeout = fairq.DefaultTimeout
	}
	if q.OutputWeight == 0 {
		q.OutputWeight = fairq.DefaultOutputWeight
	}
	if q.AgeCredit == 0 {
		q.AgeCredit = fairq.DefaultAgeCredit
	}
	if q.ScanDepth == 0 {
		q.ScanDepth = fairq.DefaultScanDepth
	}
	if q.SyncInterval == 0 {
		q.SyncInterval = fairq.DefaultSyncInterval
	}
	if q.RecheckInterval == 0 {
		q.RecheckInterval = fairq.DefaultRecheckInterval
	}
	if q.Saturation.EngineWaiting == 0 {
		q.Saturation.EngineWaiting = DefaultEngineWaiting
	}
	if q.Saturation.BackgroundEngineWaiting == 0 {
		q.Saturation.BackgroundEngineWaiting = DefaultBackgroundEngineWaiting
	}
	if q.Saturation.BackgroundMaxKVUsage == 0 {
		q.Saturation.BackgroundMaxKVUsage = DefaultBackgroundMaxKVUsage
	}
	if q.Saturation.InteractiveReserve == 0 {
		q.Saturation.InteractiveReserve = DefaultInteractiveReserve
	}
	if q.Saturation.ReserveIdle == 0 {
		q.Saturation.ReserveIdle = DefaultReserveIdle
	}
	return q
}

// Validate checks a defaulted queue configuration; errors name the field.
func (q *Config) Validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("config: queue.%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if q.Policy != fairq.PolicyFair && q.Policy != fairq.PolicyStrict {
		bad("policy", "%q is not %s or %s", q.Policy, fairq.PolicyFair, fairq.PolicyStrict)
	}
	if !(q.BackgroundShare <= 1) {
		bad("background_share", "%v is not a fraction", q.BackgroundShare)
	}
	if !(q.OutputWeight >= 0) {
		bad("output_weight", "%v is negative", q.OutputWeight)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"max_queued", q.MaxQueued}, {"max_queued_per_tenant", q.MaxQueuedPerTenant}, {"scan_depth", q.ScanDepth}, {"saturation.max_running", q.Saturation.MaxRunning}} {
		if f.v < 0 {
			bad(f.name, "%d is negative", f.v)
		}
	}
	if q.Saturation.EngineWaiting < 1 {
		bad("saturation.engine_waiting", "%d is below 1", q.Saturation.EngineWaiting)
	}
	if w := q.Saturation.BackgroundEngineWaiting; w < 1 || w > q.Saturation.EngineWaiting {
		bad("saturation.background_engine_waiting", "%d is not in [1, engine_waiting]", w)
	}
	if kv := q.Saturation.BackgroundMaxKVUsage; kv > 1 || math.IsNaN(kv) {
		bad("saturation.background_max_kv_usage", "%v is not in (0, 1] (negative disables)", kv)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"timeout", q.Timeout}, {"sync_interval", q.SyncInterval}, {"recheck_interval", q.RecheckInterval}, {"saturation.reserve_idle", q.Saturation.ReserveIdle}} {
		if d.v < 0 {
			bad(d.name, "%v is negative", d.v)
		}
	}
	return errs
}

// fairqConfig translates the configuration for fairq.New.
func (q *Config) fairqConfig(keyPrefix string, label func(string) string) fairq.Config {
	return fairq.Config{
		Policy:             q.Policy,
		BackgroundShare:    q.BackgroundShare,
		MaxQueued:          q.MaxQueued,
		MaxQueuedPerTenant: q.MaxQueuedPerTenant,
		Timeout:            q.Timeout,
		OutputWeight:       q.OutputWeight,
		AgeCredit:          q.AgeCredit,
		ScanDepth:          q.ScanDepth,
		KeyPrefix:          keyPrefix,
		SyncInterval:       q.SyncInterval,
		RecheckInterval:    q.RecheckInterval,
		Label:              label,
	}
}
