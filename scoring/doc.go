// Package scoring owns warmpath's routing math: what the router knows about
// each replica at decision time ([Endpoint]), what it knows about a request
// ([Request], [Input]), the TTFT model that estimates each replica's time
// to first token ([Cost], [Estimate]) and its calibration ([Calibrator],
// [Meter], [SessionStats], [Demand]), scorers and pickers for the
// baselines, and the
// named policies built from them ([Policy]): round-robin, least-load,
// session-hash, approx-prefix, precise-prefix and warmpath.
//
// The package does no I/O, reads no clock and imports nothing else from
// warmpath. [Policy.Decide] is the whole routing decision: given an [Input]
// (the replicas serving the model with their load and availability, the
// session's [Binding], the calibrated [Cost] and, in a second phase, prefix
// matches) it returns a [Plan]: candidates in order, the reason, why a
// session was rebound, the predicted cached tokens and the TTFT estimate
// per candidate, and the binding to remember. A sticky turn whose replica
// is kept, or a policy that needs no prefix information, is decided in one
// call; otherwise the plan says NeedsPrefix and the caller matches the
// prompt against its index and calls again.
//
// The gateway gathers the inputs from its fleet and Redis, calls Decide,
// then does the I/O (tokenize, match, write the binding), and feeds the
// Calibrator with each answered request's observed TTFT; the offline
// analyzer (bench) calls the same Decide with its simulated replicas and
// feeds the same Calibrator, so both measure one implementation.
//
// # The TTFT model
//
// A replica is a continuous-batching engine whose step costs
//
//	step = StepBase + PrefillPerToken × prefill tokens
//	       + DecodePerSeq × running sequences + DecodePerContextToken × their context
//
// with at most StepTokens tokens a step (the prior is vllmsim's default
// profile, Qwen3-32B on 2×H100). For a request of P prompt tokens of which
// the replica holds M (its GPU hit, plus its CPU offload tier's hit less
// the transfer each such token still costs: M = Matched + (1 − CPUHitCost)
// × MatchedCPU, a CPU hit being a load, not a prefill), the estimate is
//
//	queued = InflightPrefillTokens − what the head of this gateway's line has
//	         computed since it got there (HeadElapsed ÷ perToken, at most its tokens)
//	         + (Waiting − InflightPrefillRequests) × RequestTokens      requests others sent
//	         + GatewayAheadTokens           held for it in the caller's queue, leaving first
//	W      = queued + (P − M)                       prefill tokens before the first token
//	o      = StepBase + Running × DecodePerSeq + KVUsage × KVTokens × DecodePerContextToken
//	steps  = ⌈W ÷ max(StepTokens − Running, StepTokens ÷ 8)⌉, + ½ for the step in progress
//	admit  = (Waiting + GatewayAhead + 1) ÷ ArrivalRate when the engine is not draining its queue
//	         (fewer scheduled over the last MeterWindow than are waiting, and its KV
//	         cache full or prefill under half its time); else 0
//	TTFT   = max(QueueScale × queued × PrefillPerToken, admit)
//	         + TokenScale × (P − M) × PrefillPerToken + StepScale × steps × o + Overhead
//
// Under routing-aware dispatch the caller's admission queue holds a
// request for room on the replica its plan chose, so the requests held for
// a replica form a second queue in front of its engine's: those that will
// leave before this request (GatewayAhead, with their uncached prefill in
// GatewayAheadTokens) are ahead of it exactly as the engine's waiting
// requests are.
//
// RequestTokens (the engine's recent mean uncached prompt per request) is
// what a waiting request costs; it replaces the fixed 1,024-token price
// the prefill-cost scorer used, and defaults to the request's own prompt
// until the engine's counters tell. perToken = TokenScale ×
// PrefillPerToken + StepScale × o ÷ max(StepTokens − Running, StepTokens ÷
// 8) is one more token's marginal cost.
//
// # The warmpath policy
//
// warmpath sends each request to the replica with the lowest
//
//	cost        = TTFT + Others + Future − Replication
//	Others      = (P − M) × perToken × (1 + ArrivalRate × (TTFT − Overhead) + GatewayBehind + B ÷ N)
//	B           = Backlog − Σ (GatewayAhead + GatewayBehind)   waiting with no replica chosen
//	Future      = evicted(life) × P × perToken                 without a CPU tier
//	            = (CPUHitCost × evicted(life) + (1 − CPUHitCost) × evicted(cpuLife)) × P × perToken
//	evicted(τ)  = 1 − (1 − P(gap > τ))^remaining turns
//	life        = (1 − KVUsage) × CacheTokens ÷ UncachedRate
//	cpuLife     = life + CPUCacheTokens ÷ UncachedRate
//	Replication = Sharers × max(0, held − as)     on a replica holding less than H
//
// Others is what the request's own prefill costs everyone else: the
// replica's time (paid once: the fleet can do nothing else with it), the
// wait of each request that arrives behind it before it is done, the wait
// of each request the admission queue holds for this replica after it
// (GatewayBehind: all of the replica's time), and the wait of the
// requests it holds for room on the fleet with no replica chosen yet (B
// of Input.Backlog over the N available replicas: the queue drains at the
// replicas' pace, so a second of one replica's time delays each by 1 ÷ N
// of it). Future
// is what the conversation's later turns pay for being placed there: an
// LRU cache that admits UncachedRate tokens a second forgets an unused
// prefix after life seconds, and the first turn still to come
// ([SessionStats.Remaining]) whose gap exceeds it ([SessionStats.Survival])
// prefills the whole prompt again; routing then places the conversation
// anew, so a placement costs at most one such re-prefill. Behind a CPU
// offload tier (Endpoint.CPUCacheTokens), which stores every block the
// engine computes, a prefix the GPU evicts is loaded back at CPUHitCost of
// its prefill until the tier evicts it too, cpuLife seconds after the
// turn. Together they are the cache-placement
// term: a cache hit shrinks both this request's prefill and what it costs
// others, so at low load a conversation stays where its prefix is unless
// another replica is faster by more than twice what the prefix costs to
// recompute, and under load the queue's share of every miss grows with the
// requests that would wait behind it (and, when the gateway's queue holds
// a backlog, with all of it: an overloaded fleet keeps its hits rather
// than spread load it cannot serve faster); a replica whose cache churns is a
// poor home for a conversation that pauses. Exact ties go to the replica
// of the request's parent (Input.Parent), then at random.
//
// Replication is what a second copy of a shared prefix saves the requests
// that will share it. Let H be the most of the prompt any replica holds
// (a harness every coding-agent conversation opens with; a sub-agent's
// parent's opening). A replica holding less is a copy in the making: this
// request pays for the copy (its TTFT and Others price the prefill of
// what the replica lacks), and each later request opening the same way
// may then start there instead of at a holder. Sharers is the prefix's
// demand, the requests of other conversations that shared it (were scored
// with it as the longest held; a conversation's own turns, which name the
// same prefix while its cache holds a fixed depth of it, count once) over the horizon of a conversation's lifetime, remaining turns
// after the first × the mean gap ([SessionStats.Lifetime]), decayed with
// that time constant ([Demand], kept per model by the [Calibrator]): as
// many as shared it over the last horizon are expected over the next,
// while the copy is kept warm by the conversation that made it. Each of
// them would pay held, this request's cost on the cheapest holder, and
// with the copy pays as, the cost of a request like this one on the
// replica were it to hold H: the wait at a queue the holders' share of
// the fleet cannot drain, and the Future of a cache that churns because
// every conversation crowds onto the few replicas holding the opening. So
// a new conversation whose prefix lives only on a busy replica goes to a
// cold one when Sharers × (held − as) exceeds the copy's price; with no
// demand, or a holder as cheap as the copy would be, the term is 0 and
// nothing moves. The holders' term is 0. It is weighed once the prefix
// is known (sticky turns, decided without it, do not weigh it), and
// costs one table probe per decision.
//
// A sticky turn (one whose session is bound to a replica, continues the
// bound conversation and whose replica still holds its prefix) is routed
// without tokenizing while staying costs no more than moving to the
// cheapest other replica, taken to hold nothing of the prompt: llm-d's
// "sticky until saturated", with the penalty derived from the costs. When
// staying costs more, the turn is scored with its prefix known, and
// leaves (Plan.Rebind "saturated") only if another replica wins. (Scoring
// every turn whose answer depends on what the other replicas hold, i.e.
// comparing with another replica holding as much of the prompt, routed
// almost no turn without the tokenizer: on a fleet with an idle replica
// the bound one is never the cheapest at an equal hit.) A turn whose
// replica holds the conversation's tip only in its CPU offload tier
// (Input.BoundOnCPU) is scored with its prefix known as well: the sticky
// estimate prices the held prefix as GPU hits, and a 200k-token
// conversation's load from CPU is half a second it would leave out.
// warmpath reads no saturation flag and has no weights.
//
// The other policies keep their scores (below) and report estimates for
// their candidates when they know the prefix matches, without acting on
// them.
//
// # Calibration
//
// A [Calibrator] fits, per model, QueueScale, TokenScale and StepScale
// (prior 1, within [1/16, 16]) and a fixed Overhead (prior 0: what no
// replica's load explains, the same everywhere) to observed TTFTs by
// decayed least squares on relative error, each held at its prior until
// observations excite it; it also keeps each model's [SessionStats] and
// prefix [Demand]. A [Meter] turns an engine's
// counters into ArrivalRate, UncachedRate and RequestTokens.
//
// # Scores
//
// A scorer returns one score per endpoint, aligned with the endpoints it was
// given, each in [0,1] where 1 is best. The router clamps them, multiplies by
// the scorer's weight and sums; the picker takes the endpoint with the
// highest total, breaking exact ties at random. Scorers are either affinity
// scorers (prefix, session: "send it where its state is") or distribution
// scorers (queue, KV use, in-flight requests: "send it where there is
// room").
//
// # Concurrency
//
// A Policy is safe for concurrent use: scorers are stateless and the
// round-robin picker uses an atomic counter. A Calibrator is safe for
// concurrent use; Meter, SessionStats and Demand values are not.
package scoring
