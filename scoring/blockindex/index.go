package blockindex

import (
	"fmt"
	"math"
	"math/bits"
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

// Index is what the KV-event subscriber feeds, rank by rank.
var (
	_ kvevents.Handler     = (*Index)(nil)
	_ kvevents.RankClearer = (*Index)(nil)
)
