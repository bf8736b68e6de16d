// Package responses serves OpenAI's Responses API (/v1/responses…) and
// Conversations API (/v1/conversations…) over a self-hosted vLLM fleet. It
// translates each turn into a /v1/chat/completions request sent through
// the gateway's routed client (the chatapi.Chat seam), turns the chat
// stream back into the Responses event sequence (read with
// chatapi.Reader, written with chatapi.Writer), and keeps responses,
// items and conversations in Redis so that any gateway replica can
// continue a chain.
// It owns no routing, authentication or admission: the gateway provides
// them through Chat and Options.Tenant.
//
// # Translation
//
// Instructions become a leading system message (and are not carried over
// by previous_response_id). Input items become chat messages by
// renderItems: easy and typed messages (developer → system), content parts
// (input_text → text, input_image → image_url), function_call items as
// assistant tool_calls (merged into the assistant message before them),
// function_call_output as tool messages; reasoning items are stored but not
// sent. Function tools map to chat tools, namespace tools to "ns.name"
// functions, tool_choice (none, auto, required, a function, allowed_tools)
// to chat's; text.format to response_format; reasoning.effort to
// reasoning_effort; max_output_tokens to max_completion_tokens. Hosted
// tools are refused with 400 naming tools[i], except web_search, which is
// dropped (harnesses offer it on every request; under "auto" a model may
// always not search). The upstream always streams with usage, whatever the
// client asked, so one code path builds both answers.
//
// # Determinism and the prefix cache
//
// A turn's chat messages are rendered once and stored as bytes with the
// response; a chained turn sends its ancestors' stored bytes, then its own
// input. So turn N+1's upstream messages begin byte for byte with turn N's
// followed by its rendered output, and the replica's prefix cache holds.
//
// # Session keys (chatapi.Turn.Session)
//
// A chained turn uses its chain's key, fixed at the chain's root; a
// conversation turn the conversation ID; an unchained turn the client's
// session hint ("k:<tenant>:<session header or prompt_cache_key>"), else
// the key of the newest stored item its input names (full-history clients
// replaying our item IDs, item_reference), else its own response ID (it
// roots a chain), else, with store false, "" (the gateway derives one).
//
// # Redis keys
//
// All under Options.KeyPrefix, with a per-tenant hash tag {t<tenant>} so
// each script stays in one cluster slot:
//
//	resp:{tag}:<id>       HASH  a response: obj, in, msgs, prev, sess, ids, status, err (+ bg, body, hdr, lease, cancel)
//	item:{tag}:<id>       HASH  an item by ID: j (JSON), k (session key), r (owner response or conversation)
//	conv:{tag}:<id>       HASH  a conversation: obj
//	convitems:{tag}:<id>  LIST  a conversation's item IDs in order
//	convlock:{tag}:<id>   STRING the lock of the turn running on a conversation (token, PX lease)
//	ev:{tag}:<id>         STREAM a background response's events, ID 0-<sequence_number+1>, then an end marker
//	resp:jobs             STREAM background jobs, consumer group "workers"
//	resp:leases           ZSET  running background records by lease deadline (unix ms)
//	resp:cancel           pub/sub channel of cancelled records
//
// On a Cluster each script, and the MULTI/EXEC that queues a background
// response, touches one tenant's tagged keys only, so it stays in one slot
// (a chain walk's and a conversation read's keys are derived inside the
// script from the tagged prefix). resp:jobs, resp:leases and resp:cancel
// carry no tag: each is used by single-key commands alone (the leases
// set's members are record keys), PUBLISH reaches every node, and workers
// recreate the job group when a failover or restart lost it (NOGROUP).
//
// Rebuilding a chain is one EVALSHA that walks prev links and returns each
// turn's stored messages. A finished response is written by one script
// (record, items, conversation append) before its terminal event is sent.
// Responses live TTL after their chain was last continued.
//
// # Concurrency
//
// Turns on one conversation are serialised by a lock (SET NX PX, renewed
// every LeaseTTL/3): a second concurrent turn, or an item write during a
// turn, gets 409 conversation_locked, which the SDKs retry. The append
// re-checks the lock token, so a turn that outlived its lock fails
// instead of interleaving.
//
// # Goroutines
//
// Handler's requests run on the server's goroutines; a conversation turn
// adds one lock-renewal goroutine, joined before the request returns.
// Run starts BackgroundWorkers job workers (each with a lease-renewal
// goroutine per run), one sweeper and one cancel subscriber, and waits for
// all of them when its context ends. New starts nothing.
package responses
