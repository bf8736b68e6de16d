// Package admission is the gateway's admission stage: it decides when a
// parsed request may be routed. While every replica serving a model is
// saturated, requests wait in per-tenant weighted fair queues with turn
// priority (package tenancy/fairq) and are routed only as they leave
// (late binding: a queued turn still goes to whichever replica holds its
// prefix when it leaves the queue).
//
// It owns:
//
//   - Config: the queue: block of the configuration, its defaults and
//     validation;
//   - Queue: the fair queue over the fleet, Admit → Grant, ended by
//     Grant.Done with the replica's usage;
//   - Capacity: the one judgment of whether a model's replicas have room
//     for a request of a class (Saturation: engine queue length, running
//     requests, KV usage for background, the interactive reserve), with
//     this gateway's bookkeeping per replica: requests routed and not
//     started (Pending), places claimed by dispatched requests not yet
//     sent (Claim), and first bytes since the last scrape.
//
// Routing reaches admission through Queue.Admit's place function (the
// gateway's placement decides where a waiting request would go and asks
// Capacity.Claim for room there) and through Capacity.KeepReserve and
// Capacity.AddClaims, which adjust the endpoints routing decides on.
//
// Goroutines: Queue.Run (the fair queue's exchange with Redis and its
// re-checks), started by the gateway's Run; Pending arms a timer per
// non-streaming request. Redis keys: <key_prefix>fairq:vtc:<model>,
// through package fairq.
package admission
