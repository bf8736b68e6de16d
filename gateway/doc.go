// Package gateway is warmpath's HTTP edge and the composition root of
// `warmpath serve`: an OpenAI-compatible proxy that sends each turn of a
// conversation to the vLLM replica that already holds its KV cache.
//
// # Request path
//
//	client ──▶ chi router ─▶ requestID ─▶ auth ─▶ inference handler
//	             reads the body once (size-limited), parses the routing
//	             fields with gjson, derives the session key
//	         ─▶ httputil.ReverseProxy{Rewrite}
//	         ─▶ Gateway.RoundTrip (the routing transport)
//	             route: session binding (Redis) ─▶ sticky fast path, or
//	             tokenize (replica /tokenize, cached) ─▶ prefix index match
//	             ─▶ scoring.Policy ─▶ ordered candidates
//	             forward to candidate 0; on a failure before any byte
//	             (connect error, 5xx) retry once on candidate 1
//	         ─▶ modifyResponse: SSE filter (usage learned, usage chunk
//	             dropped if unasked, errors normalized) or JSON tap
//	         ─▶ client, flushed event by event
//
// Streams are never buffered: each SSE event is released as soon as its
// terminating blank line arrives, and the proxy flushes every write. The
// client's disconnect cancels the upstream request through the request
// context.
//
// # Goroutines
//
// Run starts, under one errgroup: the HTTP server; the fleet (health checks,
// /metrics scrapes and DNS membership, see package fleet); the KV-event
// subscribers (one per replica KV source in the per-replica topology, one
// bound socket in the central topology), which feed the precise prefix
// index; and the index's janitor, which expires speculative entries. All
// stop when Run's context ends.
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
//	no healthy replica serves the model        503 service_unavailable
//	every attempt failed before answering      502 upstream_error
//	client went away                           499 (logged, nothing sent)
//
// Upstream error bodies keep their status; vLLM's integer code and its
// older unwrapped shape are rewritten into the envelope.
//
// # Redis keys
//
// The gateway owns <key_prefix>sess:* through package session.
package gateway
