// Package kvevents owns vLLM's KV-cache event stream: the msgpack codec for
// event batches (both the legacy tagged-array and the tagged-map layouts), a
// ZMQ subscriber that tracks sequence numbers, asks for replays and detects
// engine restarts, and a ZMQ publisher with a replay endpoint that sends
// frames exactly as vLLM does (used by the simulator).
package kvevents
