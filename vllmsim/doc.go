// Package vllmsim is a simulated vLLM engine and fleet that behaves like
// vLLM wherever routing is concerned: OpenAI-compatible HTTP endpoints,
// a paged prefix cache with LRU eviction, a continuous-batching scheduler
// with a simulated clock, and KV-cache events published over ZMQ exactly as
// vLLM publishes them. It lets the gateway and its benchmarks run many
// replicas on a small machine without GPUs. It owns no routing logic and
// imports only kvevents (for the publisher and event types) and
// tokenizer/simtok (its vocabulary and chat template).
//
// # Fleet and replicas
//
// NewFleet binds, for each replica i, an HTTP listener on Host:HTTPPort+i, a
// KV-event PUB socket (tcp://*:KVPort+i, bound like vLLM's default) with
// the topic kv@<host:port>@<model>, and an optional replay ROUTER. With
// Config.DataParallelSize N a replica is N engines behind one HTTP
// endpoint, as vLLM's --data-parallel-size: rank r has its own scheduler,
// KV cache, publisher and replay ROUTER at the replica's ports + r (a
// connecting publisher dials port + r), and sets data_parallel_rank r on
// its batches; requests go to the rank their X-data-parallel-rank header
// names, else to the least loaded one. Fleet.Run then runs, until its
// context ends, per rank the engine step loop and the publisher's socket
// loop (kvevents.Publisher.Run), and per replica the HTTP server loop
// (which survives SetDown cycles). HTTP handlers run on the server's
// goroutines, one per request; nothing else is started.
//
// Endpoints: POST /v1/chat/completions and /v1/completions (streaming SSE
// with stream_options.include_usage, or not), GET /v1/models, POST
// /tokenize and /detokenize (prompt and chat forms, return_token_strs;
// simtok.TokenizeBody is /tokenize's code, for a gateway tokenizing in
// process), GET /health, GET /version, GET /metrics (vLLM's metric names
// from a per-replica prometheus.Registry), POST /reset_prefix_cache, and the
// admin endpoints GET/POST /sim/faults ({"error_rate","extra_latency_ms",
// "hang"}), POST /sim/restart and GET /sim/stats. Errors use vLLM's shape
// {"error":{"message","type","param","code":<int status>}}.
//
// Request fields honoured as in vLLM: max_tokens / max_completion_tokens
// (default: max_model_len − prompt length), min_tokens, ignore_eos (exactly
// max_tokens tokens), stop (string or list; output cut before the match),
// cache_salt (a non-empty string; salts block 0's hash), priority (lower
// runs first with SchedulingPolicy "priority"; non-zero is a 400 under
// "fcfs"), session_id or the X-Session-ID header (echoed on BlockStored),
// return_token_ids (chat: prompt_token_ids at the root and
// choices[].token_ids; streamed as deltas), tools and tool_choice, n = 1
// only. usage.prompt_tokens_details.cached_tokens is always present.
//
// Simulated timings come back in response headers: X-Sim-Queue-Ms (arrival
// to first scheduling), X-Sim-TTFT-Ms (arrival to first token),
// X-Sim-E2E-Ms (arrival to last token; non-streaming only), all in
// simulated milliseconds, plus X-Sim-Cached-Tokens, X-Sim-CPU-Cached-Tokens,
// X-Sim-Replica and X-Sim-DP-Rank.
// Replica.Stats returns the engine counters.
//
// # Tokenizer and chat template
//
// The vocabulary, the chat template and the decoding and tokenizing of
// /tokenize bodies are package tokenizer/simtok's, whose doc describes
// them, so a gateway tokenizes as the replicas do without importing the
// simulator. vllmsim uses it and keeps its names for its callers:
// Tokenize, Detokenize, RenderChat, Message, IMEndToken and the rest are
// simtok's.
//
// # Output
//
// A request's output is fixed when it is admitted (the engine only decides
// when each token appears): vocabulary words with '.' closing sentences,
// seeded by a hash of the prompt (the same on every replica and run),
// 16–63 tokens plus the end-of-sequence token (<|im_end|> for chat,
// <|endoftext|> for completions) unless ignore_eos, max_tokens or a stop
// string says otherwise. An assistant reply sent back in the next turn
// re-tokenizes to exactly the tokens the engine generated and cached.
//
// Tool calls follow a fixed rule: tool_choice {"type":"function",
// "function":{"name":N}} calls N; "required" calls the tool named in the
// last message, else the first tool; "auto" (or no tool_choice) calls a
// tool only when the last message is a user message that mentions a tool's
// name as a whole word (e.g. "use the read_file tool"), the earliest
// mention winning; "none" never calls. Trailing system and developer
// messages are skipped when looking for the last message. The arguments are built from the
// tool's parameter schema: each required property, in the order of
// "required", gets its first enum value or a value of its type (a word, 1,
// 1.5, true, a one-element array, or a nested object). The output is then
// the tokens of "<tool_call>\n{"name": …, "arguments": …}\n</tool_call>"
// plus <|im_end|>, finish_reason "tool_calls"; streaming sends the name
// first and the arguments in fragments as tokens are generated.
//
// # KV cache
//
// The cache has Profile.KVBlocks blocks of BlockSize tokens, reference
// counted. Full blocks are identified by chained 64-bit hashes,
// xxhash64(parent ‖ tokens ‖ salt), where the parent of block 0 is a root
// drawn at random per replica and per restart (vLLM's NONE_HASH without
// PYTHONHASHSEED) unless Config.Seed fixes it, and the cache_salt is mixed
// into block 0 only. Free blocks sit in an LRU queue (a finished request's
// blocks are queued tail first, so prefixes outlive suffixes); allocation
// takes the least recently freed block and, if it was cached, evicts it.
// A lookup counts the longest run of cached blocks from block 0, never the
// block holding the prompt's last token (at most len(prompt)−1 tokens, in
// whole blocks).
//
// # Engine
//
// Each step, the scheduler first serves running sequences in admission
// order (one token each when decoding, the rest of a chunked prefill
// otherwise) and then, if nothing was preempted, admits waiting requests
// (FCFS, or by priority then arrival) while the budget of
// MaxNumBatchedTokens tokens and MaxNumSeqs sequences lasts. Admission
// needs free blocks for the uncached part of the chunk; a request that
// does not fit waits at the head of the queue. When a running sequence
// needs a block and none is free, the newest running sequence (lowest
// priority, then newest, under "priority") is preempted and later
// recomputed, as vLLM's recompute preemption; a sequence that has to
// preempt itself ends the step's pass over running sequences, as in vLLM. A sequence whose tokens are all computed samples
// its next token at the end of the step.
//
// The step's simulated duration is
//
//	StepBase + PrefillPerToken × prefill tokens + DecodePerSeq × sequences
//	+ DecodePerContextToken × context tokens of decoding sequences
//
// and the step loop sleeps it divided by Config.Speed, against an absolute
// deadline so overhead does not accumulate. The engine keeps its own
// simulated clock: it advances by each step's duration while busy and
// follows real time × Speed while idle. Request timings are measured on it
// (a request arrives when the engine first sees it, at the start of a
// step), so they do not depend on host load. An idle engine blocks on a
// channel. Output reaches the HTTP handler through a per-request atomic
// token count and a one-slot notification channel: a handler that falls
// behind sends several tokens per chunk, and the engine never blocks.
//
// DefaultProfile approximates Qwen3-32B on 2×H100 (TP=2): 19,208 blocks of
// 16 tokens (307,328 KV tokens, measured in llm-d's benchmark, see
// shared/reference/peers.md §2.1), 8192 batched tokens, 256 sequences,
// max_model_len 131,072 (YaRN), ≈15,000 prefill tokens/s and ≈15 ms decode
// steps at moderate batch; the timing numbers are estimates, derived in
// DefaultProfile's comment.
//
// # KV events
//
// Events are produced when vLLM produces them and published once per step
// that produced any, as Batch{TS, Events, DPRank: the rank}:
//   - BlockStored when blocks become full at scheduling time: prompt blocks
//     as chunked prefill covers them, decode blocks as generated tokens fill
//     them; one event per request per step with the new blocks' hashes,
//     their tokens only, parent = the previous block's hash (nil at block
//     0), block_size, medium "GPU", group_idx 0, kv_cache_spec_kind
//     "full_attention", extra_keys one entry per block (nil except a
//     cache_salt entry on block 0; typed in the map format, a raw tuple in
//     the array format) and session_id. Prefix-cache hits produce none
//     (vLLM's incremental mode).
//   - BlockRemoved, one per evicted hash, when allocation evicts a cached
//     block.
//   - AllBlocksCleared on POST /reset_prefix_cache.
//
// A restart (Replica.Restart) empties the cache silently and resets the
// publisher, so the next batch has sequence number 0 (Config.FirstSeq), as
// a restarted vLLM.
//
// # Other engines' quirks
//
// Options reproduce engines and deployments that differ from vLLM's
// defaults: Config.FirstSeq numbers batches from 1 (llm-d-inference-sim);
// Config.BlockSize 64 (llm-d's guides); Config.PromptBlocksOnly caches
// prompt blocks only (llm-d-inference-sim); Config.NoTokenize answers 404
// on /tokenize and /detokenize (a proxy that hides them);
// Replica.DropKVEvents loses live batches (a subscriber past the PUB's
// high-water mark).
//
// # CPU offload tier
//
// Config.CPUBlocks gives each rank a CPU tier modelled on vLLM's native
// offloading connector: every block the GPU caches is offloaded (a
// BlockStored with medium "CPU", the GPU's hashes, no tokens, locality
// "LOCAL"); the tier is an LRU of CPUBlocks blocks that evicts with a CPU
// BlockRemoved, or silently with Config.CPUStoreOnly (LMCache). Admission
// continues a request's GPU prefix hit with the blocks the tier holds: they
// are loaded instead of computed, at Profile.CPULoadPerToken a token, and
// become GPU blocks again (a GPU BlockStored). usage cached_tokens counts
// them, as vLLM's num_cached_tokens counts connector hits, and
// X-Sim-CPU-Cached-Tokens reports them alone. A restart empties the tier; a
// prefix-cache reset keeps it.
//
// # Faults
//
// Replica.SetFaults injects an error rate (500s in vLLM's shape), extra
// simulated latency and hanging (requests accepted, never answered until
// un-hung); Replica.SetDown closes the HTTP listener (connection refused)
// and reopens it on the same port; Replica.Restart fails requests in
// flight and restarts the engine.
package vllmsim
