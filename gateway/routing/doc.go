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
package routing
