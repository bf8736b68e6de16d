// Package gateway is warmpath's HTTP edge and the composition root of
// `warmpath serve`: an OpenAI-compatible proxy that sends each turn of a
// conversation to the vLLM replica that already holds its KV cache.
//
// # Request path
//
// One request is a pipeline of named steps, each in the file its name
// suggests:
//
//	handler   routes.go    chi router ─▶ chatapi.RequestID ─▶ auth ─▶
//	                       inference: reads the body once (size-limited,
//	                       chatapi.ReadBody); the Responses and Messages
//	                       fronts reach Do through frontChat (chatapi.Chat)
//	parse     request/     request.Parse: the routing fields with gjson,
//	                       the session key (package session), the class
//	admit     admission.go the tenant's limits, routing's I/O (Router.Prepare),
//	          admission/   then the fair queue (package admission over
//	                       tenancy/fairq): at once while a replica has
//	                       room (admission.Capacity), else wait in
//	                       per-tenant queues (class from request.Parse);
//	                       queue.disabled admits every request at once
//	route     routing/     Router.Route: gather (fleet snapshot ─▶ scoring.Endpoint,
//	                       session binding from Redis; a background request
//	                       does not see the replicas admission reserves for
//	                       interactive turns) ─▶ scoring.Decide
//	                       ─▶ I/O: tokenize (replica /tokenize, cached) and
//	                       match the prefix index when the plan asks, then
//	                       Decide again; remember the binding, speculate
//	forward   proxy/       proxy.Forwarder (forward.go hands it the exchange):
//	                       send to the plan's first candidate; on a
//	                       failure before any byte (connect error, 5xx,
//	                       header timeout, replica marked down) retry
//	                       once on the next; watch the body's silences
//	account   account.go   proxy.NewSSEFilter (usage learned, unasked usage
//	          proxy/       chunk dropped, errors normalized) or
//	                       proxy.NewJSONTap; on the
//	                       body's end: in-flight counts, metrics, the
//	                       session's cached tokens, admission release;
//	                       the miss attribution (misses.go: the uncached
//	                       tokens by cause, the tenant's prefix breaks)
//	                       and the recording (record.go)
//
// Gateway.Do runs admit → route → forward → account for one parsed
// request (package request, the leaf every stage reads; the gateway
// wraps it in a routing.Turn with what admission and routing learn) and returns the upstream response as a stream: the routed
// client. The chat and completions handlers are thin users of it (parse,
// Do, copy the response); the Responses API (responses.go, package
// responses) and the Anthropic Messages API (messages.go, package
// anthropic, which answers in its own error envelope) are others, through
// one chatapi.Chat (frontChat in responses.go) and the kit of package
// internal/chatapi they all share. No routing state or error travels
// through a context value.
//
// Streams are never buffered: each SSE event is released as soon as its
// terminating blank line arrives, and the handler flushes every write. The
// client's disconnect cancels the upstream request through the request
// context.
//
// # Goroutines
//
// Run starts, under one errgroup: the HTTP server; the fleet (health checks,
// /metrics scrapes and DNS membership, see package fleet); the KV-event
// subscribers (one per replica KV source, i.e. per data-parallel rank, in
// the per-replica topology; in the central topology one goroutine for the
// socket bound per rank, or connected to a kv-relay, whose topics are
// resolved to fleet names by kv_topic, name or URL host:port), which feed
// the precise prefix index; the router's Run (package routing): with
// routing.tokenizer set, the worker that checks the in-process tokenizer
// against the replicas' /tokenize, the two session-tip workers, the two
// that publish session families' placements, the one that writes session
// bindings to Redis in batches off the response path (PublishBinding,
// RememberCompleted; queued writes get a second on shutdown) and the
// session tracking; the Responses API's background workers when Redis
// is configured; the fair queue's Run (counter exchange with Redis,
// re-checks, share gauges; every scrape also kicks it); with record.dir
// set, the recorder's writer (package record); the miss attribution's
// worker, which explains each answered request's uncached tokens off the
// response path (queued turns get a second on shutdown); and a
// once-a-second sync of the indexes' per-replica facts (model, KV and
// CPU-tier capacity, restarts). Speculative index entries expire lazily, on the index's own
// calls, so no janitor runs. All stop when Run's context ends.
//
// # Errors
//
// Handlers return errors; one adapter maps them to OpenAI's envelope
// {"error":{"message","type","param","code"}}:
//
//	bad JSON, missing model or messages        400 invalid_request_error
//	missing or wrong API key                   401 invalid_api_key
//	unknown route / model                      404 unknown_url / model_not_found
//	wrong method                               405 method_not_allowed
//	body over max_body_bytes                   413 request_too_large
//	queue full or waited past queue.timeout    429 rate_limit_exceeded (Retry-After)
//	no healthy replica serves the model        503 service_unavailable
//	every attempt failed before answering      502 upstream_error
//	client went away                           499 (logged, nothing sent)
//
// Upstream error bodies keep their status; vLLM's integer code and its
// older unwrapped shape are rewritten into the envelope.
//
// # Redis keys
//
// The gateway owns <key_prefix>sess:* through package session, and
// <key_prefix>fairq:vtc:<model> (the tenants' shared virtual counters)
// through package fairq.
package gateway
