package blockindex

import (
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/warmpath/warmpath/kvevents"
)

// fakeClock is a settable clock for speculative TTLs.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// randTokens returns n pseudo-random token ids from a seeded source.
func randTokens(seed uint64, n int) []uint32 {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	t := make([]uint32, n)
	for i := range t {
		t[i] = rng.Uint32N(150_000)
	}
	return t
}

// concat returns a fresh slice holding the parts in order.
func concat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// engine models a vLLM replica's block hashing: content-addressed chained
// hashes with a per-engine seed and block size, different from ours, as
// PYTHONHASHSEED and the hash algorithm make them in reality.
type engine struct {
	seed      uint64
	blockSize int
}

// hashes returns the engine hashes of the full engine blocks of tokens.
func (e engine) hashes(tokens []uint32) []uint64 {
	var out []uint64
	prev := e.seed
	var b [4]byte
	for i := 0; (i+1)*e.blockSize <= len(tokens); i++ {
		d := xxhash.New()
		var p [8]byte
		binary.LittleEndian.PutUint64(p[:], prev^0xE9)
		_, _ = d.Write(p[:])
		for _, t := range tokens[i*e.blockSize : (i+1)*e.blockSize] {
			binary.LittleEndian.PutUint32(b[:], t)
			_, _ = d.Write(b[:])
		}
		prev = d.Sum64() | 1<<63 // above int64, as vLLM's are; never 0
		out = append(out, prev)
	}
	return out
}

// store returns BlockStored events for engine blocks [from, to) of tokens,
// perEvent blocks per event, chained through their parents as vLLM chains
// them.
func (e engine) store(tokens []uint32, from, to, perEvent int) []kvevents.Event {
	hs := e.hashes(tokens)
	var evs []kvevents.Event
	for i := from; i < to; i += perEvent {
		j := min(to, i+perEvent)
		ev := &kvevents.BlockStored{
			BlockHashes: append([]uint64(nil), hs[i:j]...),
			TokenIDs:    append([]uint32(nil), tokens[i*e.blockSize:j*e.blockSize]...),
			BlockSize:   e.blockSize,
			Medium:      kvevents.MediumGPU,
		}
		if i > 0 {
			p := hs[i-1]
			ev.ParentBlockHash = &p
		}
		evs = append(evs, ev)
	}
	return evs
}

// remove returns one BlockRemoved per engine block [from, to) of tokens, as
// vLLM emits them.
func (e engine) remove(tokens []uint32, from, to int) []kvevents.Event {
	hs := e.hashes(tokens)
	var evs []kvevents.Event
	for i := from; i < to; i++ {
		evs = append(evs, &kvevents.BlockRemoved{BlockHashes: []uint64{hs[i]}, Medium: kvevents.MediumGPU})
	}
	return evs
}

func batch(evs ...[]kvevents.Event) kvevents.Batch {
	var b kvevents.Batch
	for _, e := range evs {
		b.Events = append(b.Events, e...)
	}
	return b
}

// newIndex returns an index with the given block size and model "m" set for
// the named replicas, failing the test on error.
func newIndex(tb testing.TB, cfg Config, replicas ...string) *Index {
	tb.Helper()
	ix, err := New(cfg)
	if err != nil {
		tb.Fatalf("New(%+v): %v", cfg, err)
	}
	for _, r := range replicas {
		if err := ix.SetReplicaModel(r, "m"); err != nil {
			tb.Fatalf("SetReplicaModel(%q): %v", r, err)
		}
	}
	return ix
}

// depths returns Match's Blocks per candidate.
func depths(ix interface {
	Match([]uint64, []string, []Hit) []Hit
}, keys []uint64, cands ...string) []int {
	hits := ix.Match(keys, cands, nil)
	out := make([]int, len(hits))
	for i, h := range hits {
		out[i] = h.Blocks
	}
	return out
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// checkCounts verifies that per-replica counters add up to the table's.
func checkCounts(tb testing.TB, ix *Index) Stats {
	tb.Helper()
	st := ix.Stats()
	var sum, spec int64
	for name, r := range st.Replicas {
		if r.Entries < 0 || r.Speculative < 0 || r.Speculative > r.Entries {
			tb.Errorf("replica %q: entries %d, speculative %d", name, r.Entries, r.Speculative)
		}
		sum += r.Entries
		spec += r.Speculative
	}
	if sum != st.Entries {
		tb.Errorf("sum of replica entries = %d; table holds %d", sum, st.Entries)
	}
	if spec != st.Speculative {
		tb.Errorf("sum of replica speculative = %d; Stats.Speculative = %d", spec, st.Speculative)
	}
	if st.Keys > st.Entries {
		tb.Errorf("keys %d > entries %d", st.Keys, st.Entries)
	}
	return st
}
