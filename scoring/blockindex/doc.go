// Package blockindex owns warmpath's prefix indexes: which replica's KV cache
// holds which prefix of a conversation.
//
// [Index] is the precise index, fed by vLLM KV events (it implements the
// kvevents subscriber's Handler) and queried with the block keys of a
// request's token ids. [Approx] is the approximate, tokenizer-free index: it
// remembers the chunk keys of the requests the gateway routed to each replica
// and needs no events. Both answer the same question through Match: for each
// candidate replica, how many leading blocks of the request it holds.
//
// The package does not decode events or subscribe to engines (kvevents does),
// tokenize requests, or turn matches into scores (scoring does). It imports
// nothing from this module but kvevents' event types, and starts no
// goroutines.
//
// # Keys
//
// vLLM's block hashes depend on the hash algorithm, PYTHONHASHSEED and the
// engine's block size, and are not comparable across pods by default, so the
// index treats them as opaque per-replica ids and computes its own keys from
// token ids, on the event path (BlockStored.TokenIDs) and on the request path
// alike ([Hasher], [Index.AppendKeys]):
//
//	seed   = finish(xxh64("warmpath/blockindex/v1\x00" ‖ lp(Model) ‖ lp(LoRA) ‖ lp(CacheSalt)))
//	key(0) = finish(xxh64(le32(t₀) ‖ … ‖ le32(t_{B−1}) ‖ le64(seed)))
//	key(i) = finish(xxh64(le32(t_{iB}) ‖ … ‖ le32(t_{iB+B−1}) ‖ le64(key(i−1))))
//
// where B is the index's block size (default 16), lp(s) is s prefixed by its
// length as a 32-bit little-endian integer, and finish keeps the low 61 bits and
// maps 0 to 1 (keys are 61-bit and nonzero). The parent key comes last so
// that hashing a chain is not serialized on the whole of XXH64: only its tail
// round and avalanche wait for the previous block. There is no random seed: the same
// tokens under the same [Root] give the same keys in every process. The cache
// salt is folded into the seed, i.e. into block 0's parent input; as vLLM's
// salt on block 0 does, it changes every key of the chain. The model comes
// from configuration ([Index.SetReplicaModel]) because events do not name it;
// LoRA and salt come from the event that starts a chain (parent nil).
//
// # Events
//
// Per replica, an engine table maps each engine block hash to the chain state
// at the block's end: the key of the last own block completed there, plus,
// when the engine block does not complete exactly one own block, the own keys
// it completes and the tokens of an unfinished own block. A
// BlockStored is applied by resolving its parent through that table (nil ⇒
// the chain's seed; unknown ⇒ skip, the chain is broken), cutting its tokens
// into own blocks from the parent's state, and recording each engine block.
// This handles any ratio of the engine's block size (vLLM's default 16;
// llm-d's guides use 64) to ours: ours smaller gives several keys per engine
// block; ours larger carries partial tokens until a key completes. An own key
// is attributed to the engine block that completes it, so removing an earlier
// engine block of a larger own block does not remove the key. BlockRemoved
// releases the keys an engine block completed; AllBlocksCleared and
// [Index.Clear] drop a whole replica.
//
// Events for media other than GPU and CPU (storage offload) are skipped and
// counted, as are non-full-attention groups, token counts that do not match
// the block count, blocks with multimodal or prompt-embeds extra keys, GPU
// stores without tokens, and stores under an unknown parent ([SkipReason],
// [Index.Stats]). Storing an engine block again is idempotent; two engine
// blocks that map to the same own key (for example vLLM's partial-block
// entries, or two data-parallel ranks holding the same prefix) are
// reference-counted per replica.
//
// # Replicas and data-parallel ranks
//
// A replica is one routing target: a pod. A vLLM engine with
// --data-parallel-size N is one replica with N ranks, each its own KV cache
// with its own event stream, sequence numbers and engine-hash space. The
// index keeps engine tables per (replica, rank) ([kvevents.Batch.Rank] of
// the batch), so [Index.ClearRank], a rank's AllBlocksCleared and its
// removals drop only what that rank holds; the key table holds each key
// once per replica, so Match scores the ranks together (a block held by
// any rank counts for the replica). [Index.Clear] drops every rank.
//
// # CPU tier
//
// Blocks offloaded to CPU memory (BlockStored with medium "CPU": vLLM's
// native offloading connector, which sends the GPU block's hash without
// tokens, and LMCache, which sends its own chunks with tokens and a parent)
// are indexed per replica in a CPU tier of their own: an LRU of engine
// blocks and the own keys they complete, bounded by Config.CPUMaxEntries
// keys (or [Index.SetCPUCapacity]), because LMCache never reports their
// removal. A CPU store without tokens takes its keys from the rank's GPU
// table (an offload of an unknown block is skipped, [SkipUnknownBlock]);
// one with tokens chains from a CPU block or a GPU block. A GPU store of a
// key the tier holds touches it, as the engine's own LRU is touched by the
// load that produced the store. CPU BlockRemoved drops a block; a
// prefix-cache reset (AllBlocksCleared) keeps the tier, as vLLM's reset
// keeps the connector's cache by default; ClearRank and Clear drop it.
// [Index.Match] reports in [Hit.CPU] how far the CPU tier continues each
// candidate's GPU prefix: a hit there costs the engine a transfer instead
// of a prefill. The tier takes no part in the key table's capacity or
// CLOCK, and costs Match nothing while no tier holds keys.
//
// # Lookup and speculation
//
// [Index.Match] walks a request's keys from key 0, reading each key's holder
// set once, and stops at the first key held by none of the candidates still
// matching; a replica's result is its longest consecutive run from block 0.
// Holder sets are kept sorted by replica id, so a run of keys with the same
// holders as the key before (a conversation's blocks usually share theirs
// until conversations diverge) costs one table read and one comparison per
// key, whatever the number of holders or replicas. The result is a slice
// aligned with the caller's candidate names ([Hit]: matched blocks, and how
// many of them are speculative), filled without allocating.
// [Index.AddSpeculative] marks keys as held by the replica a request was just
// routed to, until KV events confirm them or a TTL passes, covering the lag
// between routing and BlockStored; Match counts them and reports how many
// matched blocks were speculative.
//
// Every stored block is indexed: a lookup walks a prompt's keys from key 0,
// so any block of a chain the index can resolve is reached by a later
// prompt that extends its prefix, and which prompts will come is not
// known when the events arrive. What the event path avoids is work no
// lookup needs: the bookkeeping of a speculation its events confirmed
// (BenchmarkIngest16kFresh: the KV work of one fresh 16k-token prompt,
// speculation, 1,026 events, their application and expiry).
//
// # Memory layout
//
// Keys live in a table sharded by key (up to 256 shards, each an
// open-addressing table with linear probing, backward-shift deletion and a
// load factor between ~0.53 and 0.8; tables grow by half). A slot is 16
// bytes: the 61-bit key with its 2-bit CLOCK counter above it, and a hold
// word packing up to three 21-bit holder descriptors (a 20-bit replica id
// and a speculative bit); keys held by more replicas point into an immutable
// per-shard overflow list, replaced on change. Most keys are held by one to
// three replicas, so most pairs cost a share of one slot and no pointer, and
// a key shared by many replicas costs 4 bytes per extra holder. Engine
// tables are per replica, 16 bytes a slot (engine hash, chain state with a
// flag bit), with a side map only for engine blocks that do not complete
// exactly one own block (the block sizes differ). A speculative pair also
// has an entry, until its events confirm it, in its replica's deadline
// table (the engine tables' kind of map, 16 bytes a slot, never shrunk
// below 2,048 slots), and each AddSpeculative call one item in an expiry
// heap; expiring a confirmed pair is one miss in that table.
// BenchmarkMemory measures about 50 bytes per (block, replica) pair in
// all, engine tables included, for 16-token blocks on 64 replicas.
//
// The index holds at most Config.MaxEntries (key, replica) pairs; beyond it,
// each shard's CLOCK hand evicts keys, with all their holders: a key's
// counter is set to 1 when stored and to 3 when a lookup finds it, and the
// hand decrements counters and evicts keys at 0, so keys that requests hit
// outlive keys only stored.
// Engine tables are bounded by what the engines hold (they follow
// BlockRemoved) and, after evictions, by the entries kept: before an engine
// table grows, blocks none of whose keys remain are purged.
//
// # Concurrency
//
// Lookups take no lock: each shard is a seqlock, where writers hold the
// shard's mutex and make a sequence counter odd around each change, and
// readers load atomically and retry if the counter moved. A lookup is never
// blocked by an event batch, only (briefly) by the few stores of one key's
// update; a table that grows is rebuilt aside and published with one
// pointer store. Apply holds the replica's mutex for a batch, so batches of
// different replicas apply in parallel, contending only per shard (the
// ranks of one replica share its mutex). The CPU pass of a lookup takes
// the replica's CPU-tier read lock. Replica names are interned to dense ids
// through a copy-on-write map. Lock order: replica, then the CPU tier or
// the speculative-expiry lock, then shard locks.
//
// # Approximate mode
//
// [Approx] cuts the canonical text of a conversation into fixed-size byte
// chunks (default 256 bytes, about 64 tokens), chains xxhash over them from a
// seed over the [Root], and keeps per replica an LRU of the keys recorded by
// [Approx.Record] after routing, sized to about the replica's KV capacity
// ([ApproxCapacity]). Its blind spots: it never sees evictions, restarts,
// failed or preempted requests, or traffic from other gateways, so it
// over-reports after the engine forgot and depends on the LRU size matching
// the engine's; byte chunks only approximate token blocks, so depths are
// estimates; and the text must be canonicalized identically on every turn.
package blockindex
