package kvevents

// Batch is one published KV-event message: vLLM's EventBatch, the third
// frame of a ZMQ message whose first two frames are the topic and the
// sequence number.
type Batch struct {
	// TS is the wall-clock time the engine published the batch, in seconds
	// since the Unix epoch (Python's time.time()).
	TS float64
	// Events are in production order.
	Events []Event
	// DPRank is the data-parallel rank of the publishing engine, or nil
	// when the batch carries nil (or omits it).
	DPRank *int
}

// NoRank is the data-parallel rank of a batch that carries none (see
// Batch.Rank).
const NoRank = -1

// Rank returns b's data-parallel rank, or NoRank when the batch carries
// nil. Engines with data parallelism are one replica whose ranks each have
// their own KV cache, event stream and sequence numbers.
func (b Batch) Rank() int {
	if b.DPRank == nil {
		return NoRank
	}
	return *b.DPRank
}

// Event is one KV-cache event: *BlockStored, *BlockRemoved or
// *AllBlocksCleared.
type Event interface {
	// Type returns the event's wire tag ("BlockStored", …).
	Type() string
}

// Wire tags of the events this package understands.
const (
	TypeBlockStored      = "BlockStored"
	TypeBlockRemoved     = "BlockRemoved"
	TypeAllBlocksCleared = "AllBlocksCleared"
)

// Media reported by vLLM in the medium field.
const (
	MediumGPU     = "GPU"
	MediumCPU     = "CPU"
	MediumStorage = "STORAGE"
)

// BlockStored reports blocks that became full and cached, prompt and decode
// blocks alike. Hashes are the engine's opaque block IDs: uint64, or the last
// eight bytes, big-endian, of a bytes digest.
type BlockStored struct {
	// BlockHashes holds one engine hash per stored block.
	BlockHashes []uint64
	// ParentBlockHash is the engine hash of the block before the first one
	// of this event, or nil when the run starts at block 0.
	ParentBlockHash *uint64
	// TokenIDs are the tokens of these blocks only, normally
	// BlockSize × len(BlockHashes) of them. Offload events may carry none.
	TokenIDs []uint32
	// BlockSize is the number of tokens per block for this group.
	BlockSize int
	// LoRAID is the deprecated integer LoRA ID, nil when absent.
	LoRAID *int64
	// Medium is "GPU", "CPU", "STORAGE" or another engine-defined string;
	// empty when the engine sent nil.
	Medium string
	// LoRAName is the LoRA adapter name; empty when none.
	LoRAName string
	// ExtraKeys holds, per block, the extra hash keys the engine mixed into
	// that block's hash; nil when the event carries none. An entry is nil
	// for a block without extra keys.
	ExtraKeys [][]ExtraKey
	// CacheSalt is the request's cache_salt, surfaced from the extra keys of
	// block 0 (only present when this event starts at block 0).
	CacheSalt string
	// GroupIdx is the KV-cache group index, nil when absent.
	GroupIdx *int
	// KVCacheSpecKind is e.g. "full_attention" or "sliding_window"; empty
	// when absent.
	KVCacheSpecKind string
	// KVCacheSpecSlidingWindow is the sliding window size, nil when absent.
	KVCacheSpecSlidingWindow *int
	// EventVersion is the schema version of ExtraKeys; 0 when absent
	// (which vLLM means as version 1).
	EventVersion int
	// Locality and Ownership are main-branch fields ("LOCAL"/"REMOTE", the
	// offload tier); empty when absent.
	Locality, Ownership string
	// SessionID is the session of the request that stored or reused the
	// blocks, empty when absent.
	SessionID string
}

// Type implements Event.
func (*BlockStored) Type() string { return TypeBlockStored }

// Extra-key kinds, as tagged by vLLM's typed form. Raw tuples are mapped onto
// the same kinds where they can be told apart.
const (
	ExtraLoRA         = "lora"
	ExtraCacheSalt    = "cache_salt"
	ExtraMultimodal   = "mm"
	ExtraPromptEmbeds = "prompt_embeds"
	ExtraLegacy       = "legacy"
)

// ExtraKey is one extra hash key of a block.
type ExtraKey struct {
	// Kind is one of the Extra* constants.
	Kind string
	// Value is the LoRA name, the salt, the multimodal identifier, the
	// hex of a prompt-embeds digest, or the printed form of a legacy value.
	Value string
	// Modality is set for multimodal keys in the typed form.
	Modality string
	// Offset is a multimodal item's start relative to the block start.
	Offset int
}

// BlockRemoved reports blocks evicted from (or otherwise dropped by) a medium.
type BlockRemoved struct {
	// BlockHashes holds the engine hashes of the removed blocks; vLLM
	// sends one per event.
	BlockHashes []uint64
	// Medium as in BlockStored.
	Medium string
	// GroupIdx is the KV-cache group index, nil when absent.
	GroupIdx *int
	// Locality and Ownership as in BlockStored.
	Locality, Ownership string
}

// Type implements Event.
func (*BlockRemoved) Type() string { return TypeBlockRemoved }

// AllBlocksCleared reports that the engine reset its prefix cache.
type AllBlocksCleared struct{}

// Type implements Event.
func (*AllBlocksCleared) Type() string { return TypeAllBlocksCleared }
