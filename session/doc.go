// Package session owns session identity and session affinity.
//
// A session is a conversation whose turns share a growing prompt prefix. Its
// key comes from the first of: the X-Session-ID header and the agent-harness
// headers (x-claude-code-session-id, session_id, session-id,
// x-session-affinity), with Claude Code's x-claude-code-agent-id
// appended when a sub-agent sends it (a sub-agent is a conversation of its
// own; Key.Parent names the conversation that spawned it); the body's
// session_id or prompt_cache_key; the body's
// user or safety_identifier; otherwise a hash of the conversation's opening
// (system and developer messages, tools, first user message), so consecutive
// chat turns share a key without any client cooperation. Completions
// requests have no messages and so no opening: they are sessions only when
// the client names one.
//
// A [Store] keeps each session's binding to a replica in Redis with a TTL,
// shared by every gateway process, under the key prefix "<prefix>sess:". It
// also keeps recent bindings in process memory, used when Redis errs or has
// lost them (a restart with persistence off), so stickiness survives a Redis
// outage for the sessions this process served. A binding this process read
// from Redis or wrote there less than Options.LocalTrust ago is answered
// from memory with no round trip, so another process's rebinding is seen
// within that window. A first turn's binding is claimed in memory (Claim)
// and reaches Redis with Flush, which writes it only if no other process
// bound the session first, and otherwise adopts that binding.
//
// The package runs no goroutines; Store is safe for concurrent use.
package session
