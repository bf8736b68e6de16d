// Package scoring owns warmpath's routing math: what the router knows about
// each replica at decision time ([Endpoint]), what it knows about a request
// ([Request]), scorers that turn those into per-replica scores in [0,1],
// pickers that choose among scored replicas, and the named policies built
// from them ([Policy]): round-robin, least-load, session-hash,
// approx-prefix, precise-prefix and warmpath.
//
// The package does no I/O, reads no clock and imports nothing else from
// warmpath. [Policy.Decide] is the whole routing decision: given an [Input]
// (the replicas serving the model with their load and availability, the
// session's [Binding], and, in a second phase, prefix matches) it returns a
// [Plan]: candidates in order, the reason, why a session was rebound, the
// predicted cached tokens per candidate, and the binding to remember. A
// sticky turn whose replica is available, or a policy that needs no prefix
// information, is decided in one call; otherwise the plan says
// NeedsPrefix and the caller matches the prompt against its index and
// calls again. Availability is judged in Decide alone: healthy to take
// traffic; unsaturated (or every replica saturated) to take affinity
// traffic; still holding its prefix to keep a sticky session. The
// thresholds of saturation are [Saturation]'s.
//
// The gateway gathers the inputs from its fleet and Redis, calls Decide,
// then does the I/O (tokenize, match, write the binding); the offline
// analyzer (bench) calls the same Decide with its simulated replicas, so
// both measure one implementation.
//
// # Scores
//
// A scorer returns one score per endpoint, aligned with the endpoints it was
// given, each in [0,1] where 1 is best. The router clamps them, multiplies by
// the scorer's weight and sums; the picker takes the endpoint with the
// highest total, breaking exact ties at random. Scorers are either affinity
// scorers (prefix, session: "send it where its state is") or distribution
// scorers (queue, KV use, in-flight tokens, prefill cost: "send it where
// there is room"). A policy with GuardSaturated set zeroes affinity scores on
// saturated endpoints, so one hot prefix cannot pile every request onto one
// replica: a saturated replica competes on load alone, per request, while
// unsaturated ones keep their affinity.
//
// # Concurrency
//
// A Policy is safe for concurrent use: scorers are stateless and the
// round-robin picker uses an atomic counter.
package scoring
