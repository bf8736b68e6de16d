// Package fairq is the gateway's admission queue: per-tenant weighted fair
// queues with turn priority, in front of a saturated fleet. A request is
// admitted at once while its model has capacity and nothing waits for it
// (the fast path: a lock, a map lookup and one small allocation; no Redis,
// no timer). Otherwise it waits in the gateway, where the order can still
// be chosen, and is dispatched in the order below as capacity frees; the
// replica is chosen only then (late binding), so a queued turn still goes
// to the replica holding its prefix.
//
// The package deals in plain values (tenant IDs, weights, classes, token
// counts). It does not import the tenancy or gateway packages; the gateway
// derives a [Ticket] per request, implements [Capacity] from replica
// signals and calls [Queue.Admit] before routing.
//
// # Queueing model
//
// Each model has its own queue. Whenever [Capacity] says the model can take
// a request, the queue dispatches the first one of this order: class, then
// tenant, then the tenant's own turns.
//
// Class. Interactive goes before Background, except that every dispatch
// made while both classes wait earns Background a credit of
// s = Config.BackgroundShare (default 0.1), and a credit of 1 buys a
// Background dispatch:
//
//	credit += s;  if credit ≥ 1 { credit −= 1; dispatch Background } else { dispatch Interactive }
//
// So under sustained interactive load Background still gets the share s of
// the dispatches and always progresses; credit is only earned while
// Background waits, so none is banked.
//
// Tenant: weighted fair sharing by virtual token counters, as in VTC (Sheng
// et al., "Fairness in Serving Large Language Models", OSDI '24). Tenant i
// of weight w_i has one counter c_i per model, charged
//
//	c_i += (prompt − predicted cache hit) / w_i    at dispatch (Ticket.Cost, corrected by Grant.Settle)
//	c_i += o × output / w_i                        as output arrives (Grant.Charge)
//
// with o = Config.OutputWeight (default 2, VTC's w_q/w_p). Within the chosen
// class, the waiting tenant with the least counter goes first. When a tenant
// returns from idle (it had nothing queued and nothing running for the
// model at this gateway) its counter is lifted, as VTC lifts a newly active
// client:
//
//	c_i = max(c_i, min{c_j : j waits})      or, when nobody waits,   c_i = max(c_i, c_last)
//
// where c_last is the counter of the tenant dispatched last (before its
// charge). Idle time is therefore not banked: a tenant returning from idle
// competes from the present, not from its past. A tenant whose queue
// merely emptied while its requests run is not lifted: a closed-loop
// client between turns, or one whose waiting requests happen to sit in
// other gateways' queues, is still being served and keeps the credit it
// is owed. VTC bounds the service
// difference between two continuously waiting tenants by a constant that
// does not grow with the length of the period, so over a saturated period
// tenant i's share of service tends to w_i / Σ_j w_j over the tenants that
// wait. One counter serves both classes: a tenant's background service
// counts against its interactive turns too.
//
// Within a tenant and class: turns of sessions in progress (Ticket.Turn >
// 0) go before first turns and requests without a session, since finishing
// started runs frees their cache; then least attained service, aged so that
// a long session is not starved by a stream of short ones:
//
//	key = Attained − a × waited = (Attained + a × t_enqueue) − a × now,   smallest first
//
// with a = Config.AgeCredit tokens per second (default 1000). The part in
// parentheses is fixed at enqueue, so the order is a heap. Ties go by
// arrival.
//
// Routing-aware dispatch. The model's room may lie on one replica while
// the request first in this order is bound (by its session or its prefix)
// to another that has none. A ticket's Place, when set, tells whether the
// request could start at once where routing would send it now; the queue
// then dispatches the first request, in the order above, that can: the
// class's tenants by counter, each tenant's requests in its own order,
// then the other class's (Background only while it has room), at most
// Config.ScanDepth requests (default 8) per dispatch. A request passed
// over keeps its place. When none of them can start, the first goes
// anyway, to wait in its replica's engine queue (held, a request whose
// replica stays full would wait out its timeout). Deviations from the
// order: a request behind goes first when the one ahead cannot start yet
// (it would only wait in an engine queue); and Background may use room
// no waiting Interactive request can, without spending its credit, which
// a Background dispatch it bought alone spends (so under PolicyStrict
// Background overtakes only where Interactive cannot start now).
//
// PolicyStrict is the strict-priority baseline: Interactive strictly before
// Background (no background share), arrival order within a class, no
// tenant fairness.
//
// Saturation is the gateway's judgement per model ([Capacity]); the queue
// passes the number of its grants still running, so that grants made a
// moment ago, not yet visible in scraped metrics, can be bounded. A
// Capacity that also implements [ClassCapacity] judges each class apart,
// so headroom can be held back from Background for Interactive turns:
// Background is then dispatched (by its share or because it alone waits)
// only while it has room of its own, and its credit is capped at one
// dispatch meanwhile. A dispatch
// is attempted when a request starts waiting, when a grant is Done, on
// [Queue.Kick] and every Config.RecheckInterval, so no request waits while
// Capacity reports room and its Place (when set) agrees.
//
// # Bounds
//
// At most Config.MaxQueued requests wait in all (default 5000) and
// Config.MaxQueuedPerTenant per tenant (default 1000); a request waits at
// most Config.Timeout (default 60s); a request whose context ends leaves
// the queue at once. Overflow and timeout are a 429 rate_limit_exceeded
// (*apierror.Error wrapping [ErrFull] or [ErrTimeout]) with Retry-After:
// the model's recent average wait, between 1 s and the timeout.
//
// # Several gateways
//
// Queues are local to each gateway; the counters are shared. Every
// Config.SyncInterval (default 100 ms) Run sends each counter's updates
// since the last exchange and reads back every counter of the model, in
// one pipelined round trip; requests never wait on Redis. Charges and lifts
// compose as x ↦ max(x + a, f), which composes in closed form, so each
// counter's updates travel as one pair (a, f) and a lift made by several
// gateways is applied once (it is a max, not an increment). Between
// exchanges a gateway decides on its last view plus its own updates, so
// the shares compose fleet-wide to within one interval's service. If
// Redis is down the counters stay local (logged once), updates stay
// pending, and the next exchange that succeeds sends them. A hash Redis
// lost (restart, flush, failover to an empty replica) is re-seeded with
// each gateway's values, as a max, on its next exchange.
//
// # Redis keys
//
// <KeyPrefix>fairq:vtc:<model> (KeyPrefix default "wp:"): a hash with one
// field "t:<tenant ID>" per tenant holding its counter, and a marker field
// "#" whose absence tells a lost hash from a live one; written only by a
// Lua script (one call per model per exchange, so Redis Cluster is fine);
// it expires Config.KeyTTL (default 24h) after its last exchange.
//
// # Concurrency and goroutines
//
// Each model's state is guarded by its own mutex; tenants' totals are
// atomics. [Queue.Admit] blocks only the calling goroutine (on a channel,
// its context and a timer); dispatch runs on whichever goroutine frees
// capacity or queues a request, under the model's lock, and calls
// [Capacity] there. New starts no goroutine. [Queue.Run] is the only
// goroutine the package runs: the Redis exchange, the periodic re-check,
// saturated-time accounting, share gauges, label refresh and forgetting
// idle tenants.
//
// # Metrics
//
// warmpath_queue_depth and warmpath_queue_wait_seconds (tenant, class);
// warmpath_queue_dispatches_total (tenant, class, path = fast | queued);
// warmpath_queue_shed_total (tenant, class, reason = queue_full |
// tenant_queue_full | timeout); warmpath_queue_canceled_total;
// warmpath_queue_service_total (charged tokens); warmpath_queue_inflight
// and warmpath_queue_saturated_seconds_total (model);
// warmpath_queue_dispatch_share and warmpath_queue_weight_share (tenant,
// per share window); warmpath_queue_sync_errors_total and
// warmpath_queue_sync_seconds. Tenant labels come from Config.Label.
package fairq
