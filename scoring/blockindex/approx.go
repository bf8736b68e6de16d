package blockindex

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/warmpath/warmpath/internal/lru"
)

// Defaults of ApproxConfig.
const (
	// DefaultChunkBytes is the default chunk size of an Approx: 256 bytes,
	// about 64 tokens at the usual ~4 bytes per token.
	DefaultChunkBytes = 256
	// DefaultApproxKVTokens is the KV capacity, in tokens, an Approx assumes
	// per replica when ApproxConfig.Capacity is 0.
	DefaultApproxKVTokens = 1 << 18
	// approxBytesPerToken converts between tokens and bytes of text.
	approxBytesPerToken = 4
	// approxShardBits sets an Approx's key table to 64 shards.
	approxShardBits = 6
)

// ApproxCapacity returns the number of chunks of chunkBytes bytes that
// cover kvTokens tokens of KV cache, at about four bytes of text per token:
// the per-replica capacity that makes an Approx forget about as fast as a
// replica of that size would. It is at least 1.
func ApproxCapacity(kvTokens, chunkBytes int) int {
	if chunkBytes <= 0 {
		chunkBytes = DefaultChunkBytes
	}
	return max(1, kvTokens*approxBytesPerToken/chunkBytes)
}

// ApproxConfig configures an Approx. The zero value is valid: every field has
// a default.
type ApproxConfig struct {
	// ChunkBytes is the size in bytes of the chunks the text is cut into;
	// default DefaultChunkBytes.
	ChunkBytes int
	// Capacity is the number of chunk keys remembered per replica, unless
	// SetCapacity says otherwise; default ApproxCapacity(
	// DefaultApproxKVTokens, ChunkBytes), i.e. 4096 chunks of 256 bytes.
	Capacity int
}

// ApproxStats is a snapshot of an Approx's size and counters.
type ApproxStats struct {
	// Keys is the number of distinct chunk keys held by some replica.
	Keys int64
	// Entries is the number of (key, replica) entries.
	Entries int64
	// Evictions counts entries dropped because a replica's LRU was full.
	Evictions int64
	// Replicas has one entry per replica recorded.
	Replicas map[string]ApproxReplicaStats
}

// ApproxReplicaStats describes one replica in ApproxStats.
type ApproxReplicaStats struct {
	// Entries is the number of chunk keys remembered for the replica.
	Entries int64
	// Capacity is its LRU capacity in chunks.
	Capacity int
}

// Approx is the approximate, tokenizer-free prefix index: it remembers, per
// replica, the chunk keys of the requests the gateway sent there, and matches
// a request against them like Index does. It sees no KV events, so it cannot
// know what an engine evicted, never cached (a request that failed, was
// preempted or is still queued), or received from another gateway; each
// replica's LRU is sized to forget at about the rate the engine would. The
// zero value is not valid; use NewApprox. An Approx is safe for concurrent
// use.
type Approx struct {
	chunk     int
	capacity  int
	kt        *keyTable
	reg       *registry[approxReplica]
	pool      sync.Pool // *matchScratch
	evictions atomic.Int64
}

// approxReplica is one replica's LRU of chunk keys.
type approxReplica struct {
	name string
	id   uint32

	mu       sync.Mutex // guards capacity and lru
	capacity int        // 0: the Approx's default
	lru      lru.Set[uint64]
}

// NewApprox returns an empty Approx.
func NewApprox(cfg ApproxConfig) (*Approx, error) {
	if cfg.ChunkBytes < 0 {
		return nil, fmt.Errorf("blockindex: negative ChunkBytes %d", cfg.ChunkBytes)
	}
	if cfg.Capacity < 0 {
		return nil, fmt.Errorf("blockindex: negative Capacity %d", cfg.Capacity)
	}
	if cfg.ChunkBytes == 0 {
		cfg.ChunkBytes = DefaultChunkBytes
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = ApproxCapacity(DefaultApproxKVTokens, cfg.ChunkBytes)
	}
	return &Approx{
		chunk:    cfg.ChunkBytes,
		capacity: cfg.Capacity,
		kt:       newKeyTable(approxShardBits, 0, nil),
		reg: newRegistry(func(name string, id uint32) *approxReplica {
			return &approxReplica{name: name, id: id}
		}),
	}, nil
}

// ChunkBytes returns the chunk size in bytes.
func (a *Approx) ChunkBytes() int { return a.chunk }

// AppendKeys appends the keys of text's full chunks to dst and returns the
// extended slice. text is the canonical text of the conversation (for
// example each message's role and content, tagged and concatenated in order)
// and must be built the same way for every request, so that a conversation's
// next turn starts with the same bytes. The keys are chained like Index
// keys, from a seed over root (Model, LoRA and CacheSalt) in a key space of
// their own:
//
//	key(i) = finish(xxh64(le64(key(i−1)) ‖ text[i·C : (i+1)·C]))
//
// A trailing partial chunk gets no key. AppendKeys allocates only when dst
// is too small.
func (a *Approx) AppendKeys(dst []uint64, text string, root Root) []uint64 {
	c := a.chunk
	n := len(text) / c
	if n == 0 {
		return dst
	}
	dst = slices.Grow(dst, n)
	prev := root.seed(approxTag)
	var d xxhash.Digest
	var p [8]byte
	for i := range n {
		d.Reset()
		binary.LittleEndian.PutUint64(p[:], prev)
		_, _ = d.Write(p[:])
		_, _ = d.WriteString(text[i*c : (i+1)*c])
		prev = finish(d.Sum64())
		dst = append(dst, prev)
	}
	return dst
}

// Record remembers that the gateway sent a request with keys to replica;
// call it once routing has chosen the replica (and again with the keys of
// prompt plus response once the response is complete, since the next turn
// will start with both). Keys are touched deepest first, so that a full LRU
// forgets the ends of conversations before their shared beginnings.
func (a *Approx) Record(replica string, keys []uint64) {
	if len(keys) == 0 {
		return
	}
	r, err := a.reg.intern(replica)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i] & keyMask
		if k == 0 {
			continue
		}
		if r.lru.Touch(k) {
			a.kt.add(k, r.id, false)
		}
	}
	a.trim(r)
}

// trim evicts r's least recently used keys beyond its capacity. The caller
// holds r.mu.
func (a *Approx) trim(r *approxReplica) {
	c := r.capacity
	if c == 0 {
		c = a.capacity
	}
	for r.lru.Len() > c {
		k, _ := r.lru.RemoveOldest()
		a.kt.remove(k, r.id, false)
		a.evictions.Add(1)
	}
}

// SetCapacity sets replica's LRU capacity in chunks (for example
// ApproxCapacity of its KV capacity in tokens), evicting at once if it
// shrank. A capacity ≤ 0 restores the default. It fails only when the Approx
// already holds the maximum number of replicas.
func (a *Approx) SetCapacity(replica string, chunks int) error {
	r, err := a.reg.intern(replica)
	if err != nil {
		return fmt.Errorf("blockindex: set capacity: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.capacity = max(0, chunks)
	a.trim(r)
	return nil
}

// Match reports, for each candidate replica, the longest run of keys from
// keys[0] recorded for it; see Index.Match for the shape of the result.
// Hit.Speculative is always 0.
func (a *Approx) Match(keys []uint64, candidates []string, dst []Hit) []Hit {
	return match(a.kt, a.reg, &a.pool, keys, candidates, dst)
}

// Clear forgets everything recorded for replica, keeping its capacity.
func (a *Approx) Clear(replica string) {
	r, ok := a.reg.get(replica)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, ok := r.lru.RemoveOldest(); ok; k, ok = r.lru.RemoveOldest() {
		a.kt.remove(k, r.id, false)
	}
	r.lru.Clear()
}

// Stats returns the Approx's current size and counters.
func (a *Approx) Stats() ApproxStats {
	keys, pairs := a.kt.counts()
	st := ApproxStats{
		Keys:      keys,
		Entries:   pairs,
		Evictions: a.evictions.Load(),
		Replicas:  map[string]ApproxReplicaStats{},
	}
	for _, r := range a.reg.all() {
		r.mu.Lock()
		c := r.capacity
		if c == 0 {
			c = a.capacity
		}
		st.Replicas[r.name] = ApproxReplicaStats{Entries: int64(r.lru.Len()), Capacity: c}
		r.mu.Unlock()
	}
	return st
}
