package blockindex

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmpath/warmpath/kvevents"
)

// DefaultMaxEntries is the default bound on (key, replica) entries: 16 Mi,
// about 256 M tokens of KV cache at 16-token blocks, and roughly 0.8 GiB at
// the measured cost per entry (see the package benchmarks).
const DefaultMaxEntries = 1 << 24

// Config configures an Index. The zero value is valid: every field has a
// default.
type Config struct {
	// BlockSize is the number of tokens per block of the index's own keys;
	// default DefaultBlockSize (16). It need not equal the engines' block
	// size, which arrives with each event, but costs least when it divides
	// it (see the package doc).
	BlockSize int
	// MaxEntries bounds the (key, replica) entries the index holds,
	// speculative ones included; default DefaultMaxEntries. Beyond it, keys
	// are evicted by an approximate LRU (CLOCK). It must not be negative.
	MaxEntries int
	// CPUMaxEntries bounds, per replica, the keys of its CPU tier (blocks
	// offloaded to CPU memory, see the package doc); default
	// DefaultCPUMaxEntries. SetCPUCapacity overrides it per replica. It
	// must not be negative.
	CPUMaxEntries int
	// Now returns the current time, for speculative TTLs; nil means
	// time.Now.
	Now func() time.Time
	// MatchGrace is how long past their TTL speculative entries may still
	// be counted by Match: for that long Match leaves their expiry to
	// Apply, which runs on the event path, so lookups rarely pay for it.
	// Zero (the default) expires them at the first Match after the TTL.
	// It must not be negative.
	MatchGrace time.Duration
}

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

// Index is the precise prefix index: for each own block key, the replicas
// whose KV cache holds that block, kept up to date by vLLM KV events. The
// zero value is not valid; use New. An Index is safe for concurrent use.
type Index struct {
	hasher Hasher
	now    func() time.Time
	// matchGrace is Config.MatchGrace.
	matchGrace time.Duration
	kt         *keyTable
	reg        *registry[replica]
	spec       specState
	pool       sync.Pool // *matchScratch

	cpuCap int // default per-replica CPU-tier bound

	skipped         [numSkipReasons]atomic.Int64
	events          atomic.Int64
	expired         atomic.Int64
	confirmed       atomic.Int64
	unknownRemovals atomic.Int64
	cpuKeys         atomic.Int64 // keys in all CPU tiers; 0 skips Match's CPU pass
	cpuEvictions    atomic.Int64
}

// replica is the per-replica state of an Index: one routing target. Its
// data-parallel ranks are separate KV caches with separate engine-hash
// spaces (rankState), but hold keys in the key table under the replica's
// one id, so lookups score the ranks together.
type replica struct {
	name string
	id   uint32

	entries atomic.Int64 // pairs held, speculative included
	spec    atomic.Int64 // speculative pairs held
	engN    atomic.Int64 // engine blocks over all ranks, for Stats
	nRanks  atomic.Int32 // len(ranks), for Stats

	mu       sync.Mutex // guards the fields below; held for a whole batch
	model    string
	ranks    []*rankState     // in order of first appearance; usually one
	dup      map[uint64]int32 // own key → extra engine blocks (of any rank) that map to it
	purgedAt int64            // kt.evictions at the last purge
	keys     []uint64         // scratch: own keys of one engine block
	part     []uint32         // scratch: tokens of the current partial own block
	join     []uint32         // scratch for blockKey2
	stored   [numTiers]int64  // engine blocks of applied BlockStored, by tier, for Stats
	removed  [numTiers]int64  // the same for BlockRemoved

	cpu cpuTier // guarded by its own lock for readers; writers hold mu too

	// specDeadlines maps the keys of r's unconfirmed speculative pairs to
	// their latest deadline (Unix nanoseconds). Guarded by Index.spec.mu.
	specDeadlines u64Map[int64]
}

// rankState is what one data-parallel rank of a replica contributed: its
// engine-hash maps, per tier. It is guarded by the replica's mu.
type rankState struct {
	rank int                  // kvevents.Batch.Rank
	eng  engTable             // GPU: engine hash → chain state
	aux  map[uint64]*engAux   // GPU: engine hash → extra state, for auxFlag values
	cpu  map[uint64]*cpuBlock // CPU: engine hash → block in the replica's CPU tier

	_ [64]byte // written on every store: keep other replicas' ranks off its cache lines
}

// rankState returns r's state for rank, adding it if new. The caller holds
// r.mu.
func (r *replica) rankState(rank int) *rankState {
	for _, st := range r.ranks {
		if st.rank == rank {
			return st
		}
	}
	st := &rankState{rank: rank}
	r.ranks = append(r.ranks, st)
	r.nRanks.Store(int32(len(r.ranks)))
	return st
}

// countEngine refreshes r.engN. The caller holds r.mu.
func (r *replica) countEngine() {
	n := 0
	for _, st := range r.ranks {
		n += st.eng.len()
	}
	r.engN.Store(int64(n))
}

// New returns an empty Index.
func New(cfg Config) (*Index, error) {
	if cfg.BlockSize < 0 || cfg.BlockSize > MaxBlockSize {
		return nil, fmt.Errorf("blockindex: block size %d outside [1, %d]", cfg.BlockSize, MaxBlockSize)
	}
	if cfg.MaxEntries < 0 {
		return nil, fmt.Errorf("blockindex: negative MaxEntries %d", cfg.MaxEntries)
	}
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.CPUMaxEntries < 0 {
		return nil, fmt.Errorf("blockindex: negative CPUMaxEntries %d", cfg.CPUMaxEntries)
	}
	if cfg.CPUMaxEntries == 0 {
		cfg.CPUMaxEntries = DefaultCPUMaxEntries
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MatchGrace < 0 {
		return nil, fmt.Errorf("blockindex: negative MatchGrace %v", cfg.MatchGrace)
	}
	ix := &Index{
		hasher:     Hasher{BlockSize: cfg.BlockSize},
		now:        cfg.Now,
		matchGrace: cfg.MatchGrace,
		cpuCap:     cfg.CPUMaxEntries,
	}
	ix.spec.next.Store(math.MaxInt64)
	ix.reg = newRegistry(func(name string, id uint32) *replica {
		r := &replica{name: name, id: id}
		r.cpu.init(ix.cpuCap)
		return r
	})
	ix.kt = newKeyTable(shardBitsFor(cfg.MaxEntries), cfg.MaxEntries, ix.evicted)
	return ix, nil
}

// shardBitsFor picks the shard count for a bound of maxEntries: about 4096
// entries a shard at the bound, at most 256 shards, so that small indexes
// keep an exact bound and large ones spread their locks.
func shardBitsFor(maxEntries int) uint {
	b := uint(bits.Len(uint(maxEntries / 4096)))
	return min(b, 8)
}

// evicted is the keyTable's eviction callback.
func (ix *Index) evicted(id uint32, spec bool) {
	if r := ix.reg.byID(id); r != nil {
		r.entries.Add(-1)
		if spec {
			r.spec.Add(-1)
		}
	}
}

func (ix *Index) skip(why SkipReason, n int) {
	for i, r := range skipReasons() {
		if r == why {
			ix.skipped[i].Add(int64(n))
			return
		}
	}
}

// BlockSize returns the number of tokens per block of the index's keys.
func (ix *Index) BlockSize() int { return ix.hasher.size() }

// AppendKeys appends the keys of tokens' full blocks, rooted at root, to dst
// and returns the extended slice; see Hasher. It is the request-side half of
// the key computation the event path uses, and allocates only when dst is
// too small.
func (ix *Index) AppendKeys(dst []uint64, tokens []uint32, root Root) []uint64 {
	return ix.hasher.AppendKeys(dst, tokens, root)
}

// Keys returns the keys of tokens' full blocks, rooted at root.
func (ix *Index) Keys(tokens []uint32, root Root) []uint64 {
	return ix.hasher.AppendKeys(nil, tokens, root)
}

// SetReplicaModel registers replica as serving model, which becomes
// Root.Model for the chains its events start. Call it before the replica's
// events arrive; requests must use the same name in their Root. Changing a
// replica's model clears the replica. It fails only when the index already
// holds the maximum number of replicas.
func (ix *Index) SetReplicaModel(replica, model string) error {
	r, err := ix.reg.intern(replica)
	if err != nil {
		return fmt.Errorf("blockindex: set model: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.model == model {
		return nil
	}
	ix.clearLocked(r)
	r.model = model
	return nil
}

// Match reports, for each candidate replica, the longest run of keys from
// keys[0] that it holds on GPU (any of its data-parallel ranks), and how
// far its CPU tier continues that run (Hit.CPU). The result is dst[:0]
// grown to len(candidates) and aligned with candidates; unknown names get
// a zero Hit. The walk stops at the first key no still-matching candidate
// holds, so its cost is about one lock-free table read per matched key
// plus one, whatever the number of replicas; the CPU pass runs only for
// replicas whose CPU tier holds keys. Match does not allocate once dst has
// the capacity.
func (ix *Index) Match(keys []uint64, candidates []string, dst []Hit) []Hit {
	ix.maybeExpire(int64(ix.matchGrace))
	dst = match(ix.kt, ix.reg, &ix.pool, keys, candidates, dst)
	if ix.cpuKeys.Load() > 0 {
		ix.matchCPU(keys, candidates, dst)
	}
	return dst
}

// Apply applies one batch of replica's KV events, in order, to the state
// of the batch's data-parallel rank (kvevents.Batch.Rank). It implements
// kvevents.Handler: batches of one replica and rank must come in sequence
// order; other batches may be applied concurrently with each other and
// with lookups. Events the index cannot use are skipped and counted (see
// SkipReason).
func (ix *Index) Apply(replica string, b kvevents.Batch) {
	if len(b.Events) == 0 {
		return
	}
	ix.events.Add(int64(len(b.Events)))
	r, err := ix.reg.intern(replica)
	if err != nil {
		ix.skip(SkipReplicaLimit, len(b.Events))
		return
	}
	ix.maybeExpire(0)
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.rankState(b.Rank())
	for _, ev := range b.Events {
		switch e := ev.(type) {
		case *kvevents.BlockStored:
			if e != nil {
				ix.applyStored(r, st, e)
			}
		case *kvevents.BlockRemoved:
			if e != nil {
				ix.applyRemoved(r, st, e)
			}
		case *kvevents.AllBlocksCleared:
			ix.clearRankLocked(r, st, false)
		default:
			ix.skip(SkipUnknownEvent, 1)
		}
	}
}

// Clear drops everything the index holds for replica, every rank and tier
// and its speculative entries, keeping its registered model. Call it when
// a replica leaves the fleet. It implements kvevents.Handler, for
// subscribers that know no ranks; they prefer ClearRank.
func (ix *Index) Clear(replica string) {
	r, ok := ix.reg.get(replica)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ix.clearLocked(r)
}

// ClearRank drops what one data-parallel rank of replica contributed, in
// both tiers, and the replica's speculative entries, leaving the blocks
// its other ranks hold. It implements kvevents.RankClearer: the
// subscriber calls it when that rank's engine restarted, its event stream
// has a gap it cannot repair, or a subscriber first joins it. rank is
// kvevents.Batch.Rank of the rank's batches (kvevents.NoRank for batches
// without one).
func (ix *Index) ClearRank(replica string, rank int) {
	r, ok := ix.reg.get(replica)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, st := range r.ranks {
		if st.rank == rank {
			ix.clearRankLocked(r, st, true)
			return
		}
	}
	ix.clearSpeculative(r) // a rank not seen yet: nothing else to drop
}

// clearLocked drops r's entries and engine state, all ranks and tiers.
// The caller holds r.mu.
func (ix *Index) clearLocked(r *replica) {
	for _, st := range r.ranks {
		ix.dropGPU(r, st)
		ix.cpuDropRank(r, st)
	}
	r.dup = nil
	r.engN.Store(0)
	ix.clearSpeculative(r)
}

// clearRankLocked drops the GPU-tier blocks of r's rank st, releasing
// their keys (a key stays while another rank's block maps to it), and r's
// speculative entries; withCPU drops the rank's CPU-tier blocks too. An
// AllBlocksCleared event keeps them: vLLM's prefix-cache reset leaves the
// offloading connector's cache alone by default. The caller holds r.mu.
func (ix *Index) clearRankLocked(r *replica, st *rankState, withCPU bool) {
	if withCPU {
		ix.cpuDropRank(r, st)
	}
	if len(r.ranks) == 1 {
		ix.dropGPU(r, st) // no other rank shares keys: no reference counting
		r.dup = nil
	} else {
		st.eng.all(func(k, v uint64) {
			if v&auxFlag == 0 {
				ix.release(r, v)
				return
			}
			for _, o := range st.aux[k].own {
				ix.release(r, o)
			}
		})
		st.eng, st.aux = engTable{}, nil
	}
	r.countEngine()
	ix.clearSpeculative(r)
}

// dropGPU drops the pairs of st's GPU engine blocks, whatever else
// references them, and empties st's engine table. The caller holds r.mu.
func (ix *Index) dropGPU(r *replica, st *rankState) {
	st.eng.all(func(k, v uint64) {
		if v&auxFlag == 0 {
			ix.drop(r, v)
			return
		}
		for _, o := range st.aux[k].own {
			ix.drop(r, o)
		}
	})
	st.eng, st.aux = engTable{}, nil
}

// drop removes the pair (k, r) from the key table, whatever references it.
func (ix *Index) drop(r *replica, k uint64) {
	if removed, spec := ix.kt.remove(k, r.id, false); removed {
		r.entries.Add(-1)
		if spec {
			r.spec.Add(-1)
		}
	}
}

// release removes one engine block's reference to own key k: the pair
// itself goes when no other engine block of r maps to k.
func (ix *Index) release(r *replica, k uint64) {
	if d := r.dup[k]; d > 0 {
		if d == 1 {
			delete(r.dup, k)
		} else {
			r.dup[k] = d - 1
		}
		return
	}
	ix.drop(r, k)
}

// numTiers is the number of Tier values; tierGPU and tierCPU index arrays.
const (
	tierGPU = iota
	tierCPU
	numTiers
	tierOther = -1
)

// tierOf maps an event's medium to a tier: vLLM sends "GPU" and "CPU", and
// an empty medium means GPU (as llm-d treats it); case is ignored.
func tierOf(medium string) int {
	switch {
	case medium == "" || medium == kvevents.MediumGPU || strings.EqualFold(medium, kvevents.MediumGPU):
		return tierGPU
	case medium == kvevents.MediumCPU || strings.EqualFold(medium, kvevents.MediumCPU):
		return tierCPU
	}
	return tierOther
}

func fullAttention(kind string) bool {
	switch kind {
	case "", "full_attention", "mla_attention", "sink_full":
		return true
	}
	return false
}

// groupMix is folded into engine hashes so that KV-cache groups of one
// replica keep separate engine-hash spaces. Group 0 (and none) leaves the
// hashes as they are.
func groupMix(g *int) uint64 {
	if g == nil || *g == 0 {
		return 0
	}
	return uint64(*g+1) * fib
}

func unsupportedExtras(extra [][]kvevents.ExtraKey) bool {
	for _, blk := range extra {
		for _, x := range blk {
			if x.Kind == kvevents.ExtraMultimodal || x.Kind == kvevents.ExtraPromptEmbeds {
				return true
			}
		}
	}
	return false
}

// rootOf returns the Root of a chain that e starts (its parent is the root),
// falling back to block 0's extra keys for the LoRA name and the salt.
func rootOf(r *replica, e *kvevents.BlockStored) (Root, bool) {
	root := Root{Model: r.model, LoRA: e.LoRAName, CacheSalt: e.CacheSalt}
	if (root.LoRA == "" || root.CacheSalt == "") && len(e.ExtraKeys) > 0 {
		for _, x := range e.ExtraKeys[0] {
			switch {
			case x.Kind == kvevents.ExtraLoRA && root.LoRA == "":
				root.LoRA = x.Value
			case x.Kind == kvevents.ExtraCacheSalt && root.CacheSalt == "":
				root.CacheSalt = x.Value
			}
		}
	}
	if root.LoRA == "" && e.LoRAID != nil && *e.LoRAID != 0 {
		return root, false
	}
	return root, true
}

// applyStored applies one BlockStored to rank st of r, GPU or CPU tier.
// The caller holds r.mu.
//
// The engine's blocks are a run of tokens continuing the chain at the
// parent; own blocks are cut from that run at multiples of the index's block
// size, carrying an unfinished own block over in the engine block's entry
// (engAux.partial), so any ratio of the two block sizes works. A CPU store
// without tokens is an offload of blocks the GPU tier knows (applyOffload).
func (ix *Index) applyStored(r *replica, st *rankState, e *kvevents.BlockStored) {
	n := len(e.BlockHashes)
	tier := tierOf(e.Medium)
	switch {
	case tier == tierOther:
		ix.skip(SkipMedium, 1)
		return
	case !fullAttention(e.KVCacheSpecKind):
		ix.skip(SkipAttentionKind, 1)
		return
	case n == 0:
		return
	case len(e.TokenIDs) == 0 && tier == tierCPU:
		ix.applyOffload(r, st, e)
		return
	case len(e.TokenIDs) == 0:
		ix.skip(SkipNoTokens, 1)
		return
	case e.BlockSize <= 0 || len(e.TokenIDs) != e.BlockSize*n:
		ix.skip(SkipTokenCount, 1)
		return
	case unsupportedExtras(e.ExtraKeys):
		ix.skip(SkipExtraKeys, 1)
		return
	}
	g := groupMix(e.GroupIdx)
	for _, h := range e.BlockHashes {
		if h^g == 0 {
			ix.skip(SkipZeroHash, 1)
			return
		}
	}
	var state uint64
	part := r.part[:0]
	atRoot := false
	if p := e.ParentBlockHash; p == nil || *p == 0 {
		root, ok := rootOf(r, e)
		if !ok {
			ix.skip(SkipLoRAID, 1)
			return
		}
		state, atRoot = root.Seed(), true
	} else {
		var ok bool
		if state, part, atRoot, ok = st.chainAt(*p^g, tier, part); !ok {
			ix.skip(SkipUnknownParent, 1)
			return
		}
	}
	r.stored[tier] += int64(n)
	bs, es := ix.hasher.size(), e.BlockSize
	for j, h := range e.BlockHashes {
		toks := e.TokenIDs[j*es : (j+1)*es]
		keys := r.keys[:0]
		if len(part) > 0 {
			if need := bs - len(part); len(toks) >= need {
				state = blockKey2(state, part, toks[:need], &r.join)
				keys = append(keys, state)
				toks = toks[need:]
				part = part[:0]
			}
		}
		for len(toks) >= bs {
			state = blockKey(state, toks[:bs])
			keys = append(keys, state)
			toks = toks[bs:]
		}
		part = append(part, toks...)
		if len(keys) > 0 {
			atRoot = false
		}
		if tier == tierGPU {
			ix.record(r, st, h^g, state, keys, part, atRoot)
		} else {
			ix.cpuRecord(r, st, h^g, state, keys, part, atRoot)
		}
		r.keys = keys
	}
	r.part = part
}

// chainAt returns the chain state at the end of engine block eh of st:
// the state word, the partial own block (appended to part), and whether
// the chain is still at its root. A CPU store may continue a chain of its
// own tier (LMCache's chunks) or of the GPU tier. The caller holds the
// replica's mu.
func (st *rankState) chainAt(eh uint64, tier int, part []uint32) (state uint64, _ []uint32, atRoot, ok bool) {
	if tier == tierCPU {
		if b := st.cpu[eh]; b != nil {
			return b.state, append(part, b.part...), b.root, true
		}
	}
	v, ok := st.eng.get(eh)
	if !ok {
		return 0, part, false, false
	}
	if v&auxFlag != 0 {
		a := st.aux[eh]
		part = append(part, a.partial...)
		atRoot = a.root
	}
	return v &^ auxFlag, part, atRoot, true
}

// record stores engine block eh of r: its chain state, the own keys it
// completes and its trailing partial own block. Storing a block again is
// idempotent. The caller holds r.mu.
func (ix *Index) record(r *replica, st *rankState, eh, state uint64, keys []uint64, part []uint32, atRoot bool) {
	old, existed := st.eng.get(eh)
	var oldKeys []uint64
	var one [1]uint64
	if existed {
		if old&auxFlag == 0 {
			one[0] = old
			oldKeys = one[:]
		} else {
			oldKeys = st.aux[eh].own
		}
		for _, k := range oldKeys {
			if !contains(keys, k) {
				ix.release(r, k) // the block changed content: rare, but keep pairs exact
			}
		}
	}
	for _, k := range keys {
		switch ix.kt.add(k, r.id, false) {
		case addedNew:
			r.entries.Add(1)
		case addedConfirm:
			ix.confirm(r, k)
		case addedExisting:
			// Another engine block of r already maps to k (a re-stored
			// block maps to its own keys and is not counted).
			if !contains(oldKeys, k) {
				if r.dup == nil {
					r.dup = map[uint64]int32{}
				}
				r.dup[k]++
			}
		}
	}
	if r.cpu.n > 0 {
		r.cpu.touch(keys) // a GPU store of an offloaded block: the engine loaded it back
	}
	v := state
	if len(keys) != 1 || len(part) > 0 {
		v |= auxFlag
		if st.aux == nil {
			st.aux = map[uint64]*engAux{}
		}
		a := st.aux[eh]
		if a == nil {
			a = new(engAux)
			st.aux[eh] = a
		}
		a.own = append(a.own[:0], keys...)
		a.partial = append(a.partial[:0], part...)
		a.root = atRoot && len(keys) == 0
	} else if existed && old&auxFlag != 0 {
		delete(st.aux, eh)
	}
	if !existed && st.eng.full() {
		ix.purge(r, st)
	}
	st.eng.put(eh, v)
	if !existed {
		r.engN.Add(1)
	}
}

func contains(s []uint64, k uint64) bool {
	for _, x := range s {
		if x == k {
			return true
		}
	}
	return false
}

// purge drops, before the engine table of r's rank st grows, the engine
// blocks of r (every rank) none of whose own keys r still holds: their
// entries were evicted for capacity, so the chain is broken there anyway.
// This bounds engine tables by the entries the index keeps rather than by
// what the engines hold. It runs only when evictions happened since the
// last purge, and forces st's table to grow when it freed little, so its
// cost stays amortized O(1) per stored block. The caller holds r.mu.
func (ix *Index) purge(r *replica, st *rankState) {
	ev := ix.kt.evictions.Load()
	if ev == r.purgedAt {
		return
	}
	r.purgedAt = ev
	for _, rs := range r.ranks {
		ix.purgeRank(r, rs)
	}
	r.countEngine()
	if st.eng.len()*2*loadDen > len(st.eng.s)*loadNum {
		st.eng.resize(len(st.eng.s) + len(st.eng.s)/2)
	}
}

func (ix *Index) purgeRank(r *replica, st *rankState) {
	var stale []uint64
	st.eng.all(func(k, v uint64) {
		if v&auxFlag == 0 {
			if !ix.kt.holds(v, r.id) {
				stale = append(stale, k)
			}
			return
		}
		a := st.aux[k]
		if len(a.own) == 0 {
			if !a.root && !ix.kt.holds(v&^auxFlag, r.id) {
				stale = append(stale, k)
			}
			return
		}
		for _, o := range a.own {
			if ix.kt.holds(o, r.id) {
				return
			}
		}
		stale = append(stale, k)
	})
	for _, k := range stale {
		v, _ := st.eng.del(k)
		own := []uint64{v}
		if v&auxFlag != 0 {
			own = st.aux[k].own
			delete(st.aux, k)
		}
		for _, o := range own {
			if d := r.dup[o]; d > 1 {
				r.dup[o] = d - 1
			} else if d == 1 {
				delete(r.dup, o)
			}
		}
	}
}

// applyRemoved applies one BlockRemoved to rank st of r. The caller
// holds r.mu.
func (ix *Index) applyRemoved(r *replica, st *rankState, e *kvevents.BlockRemoved) {
	tier := tierOf(e.Medium)
	if tier == tierOther {
		ix.skip(SkipMedium, 1)
		return
	}
	r.removed[tier] += int64(len(e.BlockHashes))
	g := groupMix(e.GroupIdx)
	for _, h := range e.BlockHashes {
		eh := h ^ g
		if eh == 0 {
			continue
		}
		if tier == tierCPU {
			if !ix.cpuRemove(r, st, eh) {
				ix.unknownRemovals.Add(1)
			}
			continue
		}
		v, ok := st.eng.del(eh)
		if !ok {
			ix.unknownRemovals.Add(1)
			continue
		}
		r.engN.Add(-1)
		if v&auxFlag == 0 {
			ix.release(r, v)
			continue
		}
		for _, o := range st.aux[eh].own {
			ix.release(r, o)
		}
		delete(st.aux, eh)
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

// Index is what the KV-event subscriber feeds, rank by rank.
var (
	_ kvevents.Handler     = (*Index)(nil)
	_ kvevents.RankClearer = (*Index)(nil)
)
