// Package routing is the routing stage of the gateway: where each
// admitted turn goes. It owns the decision's inputs (the replicas
// serving the model as the fleet reads them, the session's binding, the
// prompt's length and prefix matches), the prefix indexes (the precise
// one fed by the replicas' KV events, the approximate one over sent
// text), tokenization (the /tokenize client with its cache and backoff,
// the in-process tokenizers and their checks), the bytes-per-token
// ratios that estimate prompts it does not tokenize, and the session
// bindings with their writes to Redis (batched off the response path).
// The decision itself is scoring's (scoring.Policy.Decide); the binding
// rules are session's.
//
// A Router (New, from the routing: block's Config and explicit Deps)
// holds that state. Per request, the gateway wraps the parsed request in
// a Turn; Router.Prepare does routing's I/O before admission and leaves
// a Placement on it (which the fair queue asks, Placement.Place, as it
// considers the request); Router.Route makes the Route the request is
// forwarded on; RememberCompleted and PublishBinding write the binding
// back as the answer streams. Router.Run runs its workers: the binding
// flusher, the tip and write pools, the in-process tokenizer's checker
// and the session tracking.
package routing
