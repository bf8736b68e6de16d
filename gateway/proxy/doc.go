// Package proxy is the forwarding stage: it sends a routed request to a
// replica and passes the answer back.
//
// A Forwarder (New, over the upstream: block, Config) owns the upstream
// transport and key and the attempt loop: Forward sends a request to its
// plan's first candidate (a Plan, the routing stage's Route) and, when
// the replica fails before answering (refused, reset, a 5xx, no headers
// within header_timeout, or marked down while the request waited),
// reports it to the replica's health and tries the next candidate once.
// Each answer's body is watched for first_byte_timeout and idle_timeout,
// and ended when the gateway's drain timeout passes (Deps.Drain). What it
// needs of others comes in Deps: the metrics it counts, the Tracer of
// the attempts' spans; the caller's per-request hooks come in Send.
//
// The body layer is what the gateway does to an upstream answer on its
// way to the client. A streamed answer passes through NewSSEFilter event
// by event (never buffered: each event leaves as its blank line
// arrives), which learns usage, drops the usage chunk the client did not
// ask for, rewrites vLLM's mid-stream errors into OpenAI's envelope, and
// ends a stream cut short with an error event and [DONE]; a whole answer
// passes through NewJSONTap, which keeps a bounded copy for its usage; an
// error answer's body is rewritten into OpenAI's envelope
// (NormalizeErrorBody). Each reports to an Observer: the first byte, the
// usage, and the end, exactly once. CopyResponse writes an answer to the
// HTTP client, flushing event by event.
//
// A Forwarder starts no goroutine of its own (the transport's
// connections are net/http's); the body layer keeps no state between
// requests.
package proxy
