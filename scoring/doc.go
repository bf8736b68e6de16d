// Package scoring owns warmpath's routing math: what the router knows about
// each replica at decision time ([Endpoint]), what it knows about a request
// ([Request]), scorers that turn those into per-replica scores in [0,1],
// pickers that choose among scored replicas, and the named policies built
// from them ([Policy]): round-robin, least-load, session-hash,
// approx-prefix, precise-prefix and warmpath.
//
// The package does no I/O and imports nothing else from warmpath. The gateway
// gathers the inputs (fleet snapshot, session binding, prefix-index matches)
// and calls [Policy.Route]; the offline analyzer calls the same code with
// simulated replicas, so both measure one implementation.
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
