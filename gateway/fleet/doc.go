// Package fleet owns the set of upstream vLLM replicas and everything the
// router needs to know about each one: membership (a static list plus DNS
// names re-resolved periodically), health (active GET /health checks and
// passive failures reported by the proxy), engine load scraped from vLLM's
// /metrics, the models each replica serves, and the gateway's own in-flight
// counters. It publishes membership as an immutable [Snapshot] swapped
// atomically, so routing reads it without taking a lock.
//
// The package does not route, proxy or subscribe to KV events. It carries
// each replica's KV-event endpoints ([ReplicaSpec.KVSources]) and announces
// membership changes so that the gateway can run one KV-event subscriber per
// replica. It imports nothing else from warmpath.
//
// # Goroutines
//
// [New] validates the configuration and starts nothing. [Fleet.Run] owns
// every goroutine and blocks until its context is done:
//
//   - per replica, a health goroutine (GET /health every Health.Interval,
//     and GET /v1/models when the spec names no model: on becoming healthy
//     and every ModelsInterval; when it names one, once on becoming
//     healthy, to warn if the replica does not serve it) and a scrape
//     goroutine (GET /metrics every Health.ScrapeInterval);
//   - per DNS spec, a goroutine that resolves the name at once and then
//     every Interval.
//
// Config.OnUpdate, when set, is called on a replica's scrape goroutine after
// each successful scrape and on its health goroutine when it becomes
// healthy (the gateway's admission queue re-checks capacity then).
//
// Replica goroutines start when the replica joins and stop when it leaves;
// each loop selects on its context and recovers from panics. Run returns
// nil after every goroutine it started has exited. Two goroutines per
// replica keep a slow health check from delaying scrapes; at 64 replicas
// that is 128 mostly sleeping goroutines.
//
// # Snapshots and concurrency
//
// Readers call [Fleet.Snapshot], one atomic load. A Snapshot's replica list
// never changes; a membership change builds a new Snapshot under the
// fleet's mutex (writers are the DNS goroutines only) and stores it. A
// member whose spec is unchanged keeps its *[Replica] across snapshots, so
// the proxy's atomic counters on it survive re-resolution; a replica whose
// address leaves and comes back is a new *Replica.
//
// Each Replica publishes its own immutable [State] through an atomic
// pointer: the health goroutine, the scrape goroutine and the proxy's
// reports build a modified copy under the replica's mutex and store it, so
// [Replica.State] never blocks and never sees a half-written state. The
// proxy maintains [Replica.InflightRequests] and
// [Replica.InflightPrefillTokens] directly (or through [Replica.Begin]).
//
// # Membership changes
//
// Every snapshot has a channel, [Snapshot.Changed], that is closed when a
// newer snapshot replaces it. A consumer processes a snapshot and then waits
// on that snapshot's channel, which cannot miss a change; [Fleet.Watch]
// wraps the loop, and [Snapshot.Diff] lists the replicas added and removed
// between two snapshots. [Replica.Removed] is closed when a replica leaves,
// which suits a per-replica subscriber goroutine. Health and metrics
// changes do not produce a new snapshot: read them per request.
//
// # Health state machine
//
// A replica starts pending: unhealthy, with HealthReason "pending: …", and
// receives no traffic until a health check succeeds. Then:
//
//	pending   --first successful active check-------------------> healthy
//	healthy   --Health.Failures consecutive failures-------------> unhealthy
//	unhealthy --RecoveryThreshold consecutive active successes---> healthy
//
// Failures are active (GET /health error, timeout or non-200) or passive
// ([Replica.ReportFailure]; context.Canceled is ignored) and share one
// consecutive count, which any success (active, or passive through
// [Replica.ReportSuccess]) resets. Only active checks heal: the proxy sends
// nothing to an unhealthy replica, so its successes cannot vouch for it.
// Any failure while unhealthy restarts the recovery count. Passive
// failures of calls that were in flight together count once
// ([Replica.ReportFailureOf]): one event (a host stall timing out every
// pending call, a crash resetting every connection) is one failure.
//
// Scrapes are independent of health: a failed scrape keeps the previous
// numbers and records ScrapeErr, and once the last success is older than
// Health.StaleAfter the replica counts as saturated (reason "stale") rather than
// unhealthy. [Replica.Saturated] also reports "waiting", "kv" and
// "inflight" against the [Saturation] thresholds.
//
// # Metrics
//
// When Config.Registerer is set, New registers a collector that reads the
// current snapshot at scrape time: warmpath_replica_healthy, _waiting,
// _running, _kv_usage, _inflight_requests, _inflight_prefill_tokens,
// _metrics_age_seconds, _scrape_errors_total and
// _health_transitions_total{to} per replica, warmpath_fleet_replicas, and
// warmpath_dns_resolutions_total{name,result}. A replica's series vanish
// with it.
package fleet
