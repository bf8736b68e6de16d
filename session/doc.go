// Package session owns session identity and session affinity.
//
// A session is a conversation whose turns share a growing prompt prefix. Its
// key comes from the first of: the X-Session-ID header, Dynamo's
// X-Dynamo-Session-ID and the agent-harness headers
// (x-claude-code-session-id, session_id, session-id, x-session-affinity);
// the body's session_id or prompt_cache_key; the body's user or
// safety_identifier; each joined with a hash of the conversation's opening
// (system and developer messages, tools, first user message), so that a
// session id several conversations share (an agent and its title request,
// a user's conversations) keys each of them apart; otherwise the opening's
// hash alone, so consecutive chat turns share a key without any client
// cooperation. Completions requests have no messages and so no opening:
// they are sessions only when the client names one.
//
// The client-named session is the conversation's family ([Key.Family]). A
// Claude Code sub-agent (x-claude-code-agent-id) is a family of its own
// under the run's session id, whose [Key.Parent] is the run's family or the
// sub-agent that spawned it (x-claude-code-parent-agent-id); Dynamo's
// X-Dynamo-Parent-Session-ID names a parent session directly. The gateway
// records under the family where its conversations run, so that a
// sub-agent's first turn can be placed knowing its parent's replica.
//
// A [Store] keeps each session's binding to a replica in Redis with a TTL,
// shared by every gateway process, under the key prefix "<prefix>sess:"
// (one untagged string per session: every command touches one key, and
// MigrateBindings scans every master of a Cluster). It
// also keeps recent bindings in process memory, used when Redis errs or has
// lost them (a restart with persistence off), so stickiness survives a Redis
// outage for the sessions this process served. A binding this process read
// from Redis or wrote there less than Options.LocalTrust ago is answered
// from memory with no round trip (off by default), so another process's
// changes are seen within that window. A local copy Redis never confirmed (its write
// failed) reaches Redis with Flush only if no other process bound the
// session meanwhile; otherwise Flush adopts that binding. With a
// [Tracking] running (Store.Track; a single server only, as CLIENT
// TRACKING follows one connection's server), Redis reports every change to the
// binding keys on one pub/sub connection, and a binding this process read
// or wrote is answered from memory until another process changes it: a
// sticky turn pays no round trip, and sees another gateway's change.
//
// Store runs no goroutines and is safe for concurrent use; Tracking.Run is
// the one the package has.
package session
