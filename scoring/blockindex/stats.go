package blockindex

// SkipReason says why an event, or part of one, was not applied.
type SkipReason string

// Reasons for skipping events. Stats reports a count for each.
const (
	// SkipUnknownParent: a BlockStored whose parent hash is neither nil nor
	// a block the replica is known to hold; the chain is broken.
	SkipUnknownParent SkipReason = "unknown_parent"
	// SkipTokenCount: len(TokenIDs) ≠ BlockSize × len(BlockHashes), or a
	// BlockSize ≤ 0 (sliding-window and other sparse groups).
	SkipTokenCount SkipReason = "token_count"
	// SkipAttentionKind: a KV-cache group other than full attention
	// ("", "full_attention", "mla_attention", "sink_full").
	SkipAttentionKind SkipReason = "attention_kind"
	// SkipNoTokens: a BlockStored without token ids (an offload tier update).
	SkipNoTokens SkipReason = "no_tokens"
	// SkipMedium: an event for a medium other than GPU and CPU (storage
	// offload, or an engine-defined tier).
	SkipMedium SkipReason = "medium"
	// SkipUnknownBlock: a CPU store without tokens (an offload of a block
	// the GPU held) of an engine block the index does not know.
	SkipUnknownBlock SkipReason = "unknown_block"
	// SkipExtraKeys: blocks with multimodal or prompt-embeds extra keys,
	// whose content the token ids alone do not identify.
	SkipExtraKeys SkipReason = "extra_keys"
	// SkipLoRAID: a chain root naming its LoRA adapter only by the
	// deprecated integer lora_id, which cannot be matched to a name.
	SkipLoRAID SkipReason = "lora_id"
	// SkipZeroHash: a block hash of 0, which the index reserves (a parent
	// hash of 0 means the root, as llm-d-inference-sim sends it).
	SkipZeroHash SkipReason = "zero_hash"
	// SkipReplicaLimit: a batch or speculative add for a new replica beyond
	// the number of replica names an index can hold (about a million).
	SkipReplicaLimit SkipReason = "replica_limit"
	// SkipUnknownEvent: an event of a type the index does not know.
	SkipUnknownEvent SkipReason = "unknown_event"
)

// numSkipReasons is the number of SkipReason values.
const numSkipReasons = 11

// skipReasons lists the reasons in the order of Index.skipped.
func skipReasons() [numSkipReasons]SkipReason {
	return [numSkipReasons]SkipReason{
		SkipUnknownParent, SkipTokenCount, SkipAttentionKind, SkipNoTokens, SkipMedium,
		SkipExtraKeys, SkipLoRAID, SkipZeroHash, SkipReplicaLimit, SkipUnknownEvent,
		SkipUnknownBlock,
	}
}

// Tier names a kind of KV-cache memory the index tracks, the key of
// Stats.Stored and Stats.Removed.
type Tier string

// Tiers. vLLM reports them in the medium field of its events.
const (
	// TierGPU is the engine's own KV cache (medium "GPU", or none).
	TierGPU Tier = "GPU"
	// TierCPU is CPU memory that blocks are offloaded to (medium "CPU":
	// vLLM's native offloading, LMCache). A hit there costs a transfer
	// instead of a prefill.
	TierCPU Tier = "CPU"
)

// Stats is a snapshot of an Index's size and counters, for metrics.
type Stats struct {
	// Keys is the number of distinct keys held by at least one replica.
	Keys int64
	// Entries is the number of (key, replica) entries, speculative included.
	Entries int64
	// Speculative is the number of speculative entries.
	Speculative int64
	// Evictions counts entries evicted because the index was full.
	Evictions int64
	// Expired counts speculative entries that reached their TTL unconfirmed.
	Expired int64
	// Confirmed counts speculative entries confirmed by a KV event.
	Confirmed int64
	// Events counts events received through Apply, skipped ones included.
	Events int64
	// UnknownRemovals counts BlockRemoved hashes the replica was not known
	// to hold (normal after a skipped BlockStored).
	UnknownRemovals int64
	// Skipped counts skipped events by reason; every reason is present.
	Skipped map[SkipReason]int64
	// Stored and Removed count the engine blocks of applied BlockStored
	// and BlockRemoved events by tier; both tiers are present.
	Stored, Removed map[Tier]int64
	// CPUEntries is the number of keys held in CPU tiers, over all
	// replicas.
	CPUEntries int64
	// CPUEvictions counts CPU-tier keys evicted because a replica's tier
	// was full.
	CPUEvictions int64
	// Replicas has one entry per replica the index has seen.
	Replicas map[string]ReplicaStats
}

// ReplicaStats describes one replica in Stats.
type ReplicaStats struct {
	// Model is the model registered with SetReplicaModel ("" if none).
	Model string
	// Entries is the number of keys the replica holds, speculative included.
	Entries int64
	// Speculative is the number of keys it holds only speculatively.
	Speculative int64
	// EngineBlocks is the number of engine block hashes tracked for it,
	// over its data-parallel ranks, GPU tier only.
	EngineBlocks int64
	// CPUEntries is the number of keys its CPU tier holds.
	CPUEntries int64
	// Ranks is the number of data-parallel ranks whose events it has
	// received (a batch without a rank counts as one).
	Ranks int
}

// skip counts n events, or parts of one, skipped for why.
func (ix *Index) skip(why SkipReason, n int) {
	for i, r := range skipReasons() {
		if r == why {
			ix.skipped[i].Add(int64(n))
			return
		}
	}
}

// Stats returns the index's current size and counters. It takes each
// replica's lock briefly and is meant for metrics scrapes, not hot paths.
func (ix *Index) Stats() Stats {
	ix.spec.mu.Lock()
	ix.expireLocked(ix.now().UnixNano(), -1)
	ix.spec.mu.Unlock()
	keys, pairs := ix.kt.counts()
	st := Stats{
		Keys:            keys,
		Entries:         pairs,
		Evictions:       ix.kt.evictions.Load(),
		Expired:         ix.expired.Load(),
		Confirmed:       ix.confirmed.Load(),
		Events:          ix.events.Load(),
		UnknownRemovals: ix.unknownRemovals.Load(),
		Skipped:         map[SkipReason]int64{},
		Replicas:        map[string]ReplicaStats{},
	}
	for i, why := range skipReasons() {
		st.Skipped[why] = ix.skipped[i].Load()
	}
	st.CPUEntries = ix.cpuKeys.Load()
	st.CPUEvictions = ix.cpuEvictions.Load()
	var stored, removed [numTiers]int64
	for _, r := range ix.reg.all() {
		r.mu.Lock()
		model := r.model
		for i := range numTiers {
			stored[i] += r.stored[i]
			removed[i] += r.removed[i]
		}
		r.mu.Unlock()
		rs := ReplicaStats{
			Model:        model,
			Entries:      r.entries.Load(),
			Speculative:  r.spec.Load(),
			EngineBlocks: r.engN.Load(),
			CPUEntries:   r.cpu.keysHeld.Load(),
			Ranks:        int(r.nRanks.Load()),
		}
		st.Speculative += rs.Speculative
		st.Replicas[r.name] = rs
	}
	st.Stored = map[Tier]int64{TierGPU: stored[tierGPU], TierCPU: stored[tierCPU]}
	st.Removed = map[Tier]int64{TierGPU: removed[tierGPU], TierCPU: removed[tierCPU]}
	return st
}
