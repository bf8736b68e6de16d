package blockindex

import (
	"testing"

	"github.com/warmpath/warmpath/kvevents"
)

// rankBatch is batch(evs...) from data-parallel rank rank.
func rankBatch(rank int, evs ...[]kvevents.Event) kvevents.Batch {
	b := batch(evs...)
	b.DPRank = ptr(rank)
	return b
}

// TestRanksKeepTheirBlocks runs one replica with two data-parallel ranks:
// clearing, resetting or removing on one rank leaves what the other holds,
// a key both hold stays until both let go, and lookups score the ranks
// together.
func TestRanksKeepTheirBlocks(t *testing.T) {
	doc0, doc1 := randTokens(30, 16*6), randTokens(31, 16*4)
	eng := engine{seed: 1, blockSize: 16} // both ranks hash alike (one PYTHONHASHSEED)
	ix := newIndex(t, Config{}, "a")
	k0, k1 := ix.Keys(doc0, Root{Model: "m"}), ix.Keys(doc1, Root{Model: "m"})
	depth := func(keys []uint64) int { return depths(ix, keys, "a")[0] }
	check := func(step string, want0, want1 int) {
		t.Helper()
		if d0, d1 := depth(k0), depth(k1); d0 != want0 || d1 != want1 {
			t.Fatalf("%s: depths %d, %d; want %d, %d", step, d0, d1, want0, want1)
		}
		checkCounts(t, ix)
	}

	ix.Apply("a", rankBatch(0, eng.store(doc0, 0, 6, 3)))
	ix.Apply("a", rankBatch(1, eng.store(doc1, 0, 4, 2), eng.store(doc0, 0, 2, 2)))
	check("both ranks stored", 6, 4)
	if st := ix.Stats(); st.Replicas["a"].Ranks != 2 || st.Replicas["a"].EngineBlocks != 12 || st.Replicas["a"].Entries != 10 {
		t.Fatalf("stats %+v; want 2 ranks, 12 engine blocks, 10 entries", st.Replicas["a"])
	}

	ix.Apply("a", rankBatch(1, eng.remove(doc0, 0, 1)))
	check("rank 1 evicted a block rank 0 holds", 6, 4)

	ix.ClearRank("a", 1)
	check("rank 1 cleared", 6, 0)

	ix.Apply("a", rankBatch(1, eng.store(doc1, 0, 4, 4), eng.store(doc0, 0, 3, 3)))
	ix.Apply("a", rankBatch(0, []kvevents.Event{&kvevents.AllBlocksCleared{}}))
	check("rank 0 reset its prefix cache", 3, 4)

	ix.ClearRank("a", 7) // a rank never seen
	ix.ClearRank("b", 0) // a replica never seen
	check("unknown rank and replica", 3, 4)

	ix.Clear("a")
	check("replica cleared", 0, 0)
	if st := ix.Stats(); st.Entries != 0 || st.Replicas["a"].EngineBlocks != 0 {
		t.Errorf("after Clear: %d entries, %d engine blocks", st.Entries, st.Replicas["a"].EngineBlocks)
	}
}

// offload returns vLLM's native-offloading event for engine blocks
// [from, to) of tokens: a CPU BlockStored of their hashes, without tokens
// or parent.
func (e engine) offload(tokens []uint32, from, to int) []kvevents.Event {
	return []kvevents.Event{&kvevents.BlockStored{
		BlockHashes: e.hashes(tokens)[from:to], BlockSize: e.blockSize, Medium: kvevents.MediumCPU,
	}}
}

// cpuStore returns BlockStored events for engine blocks [from, to) on the
// CPU tier with tokens (LMCache's chunks), chained as on the GPU.
func (e engine) cpuStore(tokens []uint32, from, to int) []kvevents.Event {
	evs := e.store(tokens, from, to, to-from)
	for _, ev := range evs {
		ev.(*kvevents.BlockStored).Medium = "cpu"
	}
	return evs
}

func (e engine) cpuRemove(tokens []uint32, from, to int) []kvevents.Event {
	evs := e.remove(tokens, from, to)
	for _, ev := range evs {
		ev.(*kvevents.BlockRemoved).Medium = kvevents.MediumCPU
	}
	return evs
}

// TestCPUTier indexes blocks offloaded to CPU memory: they continue the
// GPU prefix in Hit.CPU, survive their GPU eviction, chain on their own
// (LMCache) and go when removed or cleared.
func TestCPUTier(t *testing.T) {
	doc := randTokens(40, 16*8)
	eng := engine{seed: 1, blockSize: 16}
	ix := newIndex(t, Config{}, "a", "b")
	keys := ix.Keys(doc, Root{Model: "m"})
	hit := func(step string, want Hit) {
		t.Helper()
		if got := ix.Match(keys, []string{"b", "a"}, nil)[1]; got != want {
			t.Fatalf("%s: Match = %+v; want %+v", step, got, want)
		}
	}
	ix.Apply("a", batch(eng.store(doc, 0, 6, 3), eng.offload(doc, 0, 6)))
	hit("stored and offloaded", Hit{Blocks: 6})
	ix.Apply("a", batch(eng.remove(doc, 3, 6)))
	hit("GPU evicted blocks 3-5", Hit{Blocks: 3, CPU: 3})
	ix.Apply("a", batch(eng.remove(doc, 0, 3)))
	hit("GPU evicted everything", Hit{CPU: 6})
	ix.Apply("a", batch(eng.cpuStore(doc, 6, 8)))
	hit("a CPU store with tokens continues the CPU chain", Hit{CPU: 8})
	ix.Apply("a", batch([]kvevents.Event{&kvevents.AllBlocksCleared{}}))
	hit("a prefix-cache reset keeps the CPU tier", Hit{CPU: 8})
	ix.Apply("a", batch(eng.cpuRemove(doc, 2, 3)))
	hit("a CPU removal", Hit{CPU: 2})
	ix.Apply("a", batch(eng.store(doc, 0, 4, 4)))
	hit("back on GPU", Hit{Blocks: 4, CPU: 4})

	st := ix.Stats()
	if st.Stored[TierGPU] != 10 || st.Stored[TierCPU] != 8 || st.Removed[TierGPU] != 6 || st.Removed[TierCPU] != 1 {
		t.Errorf("Stored %v, Removed %v; want GPU 10 and CPU 8 stored, GPU 6 and CPU 1 removed", st.Stored, st.Removed)
	}
	if st.CPUEntries != 7 || st.Replicas["a"].CPUEntries != 7 || st.Replicas["b"].CPUEntries != 0 {
		t.Errorf("CPU entries %d (a %d, b %d); want 7, 7, 0", st.CPUEntries, st.Replicas["a"].CPUEntries, st.Replicas["b"].CPUEntries)
	}
	if st.Skipped[SkipMedium] != 0 {
		t.Errorf("Skipped[medium] = %d; want 0", st.Skipped[SkipMedium])
	}

	ix.ClearRank("a", kvevents.NoRank)
	hit("rank cleared", Hit{})
	if st := ix.Stats(); st.CPUEntries != 0 || st.Entries != 0 {
		t.Errorf("after ClearRank: %d CPU entries, %d entries", st.CPUEntries, st.Entries)
	}
}

// TestCPUTierLRU bounds a replica's CPU tier: beyond its capacity the block
// least recently stored or loaded back to GPU goes first.
func TestCPUTierLRU(t *testing.T) {
	docs := [][]uint32{randTokens(50, 32), randTokens(51, 32), randTokens(52, 32)}
	eng := engine{seed: 1, blockSize: 16}
	ix := newIndex(t, Config{CPUMaxEntries: 1 << 20}, "a")
	if err := ix.SetCPUCapacity("a", 4); err != nil {
		t.Fatal(err)
	}
	cpu := func(d int) int {
		return ix.Match(ix.Keys(docs[d], Root{Model: "m"}), []string{"a"}, nil)[0].CPU
	}
	// Offload docs 0 and 1 (two blocks each) and evict them from the GPU.
	for d := range 2 {
		ix.Apply("a", batch(eng.store(docs[d], 0, 2, 2), eng.offload(docs[d], 0, 2), eng.remove(docs[d], 0, 2)))
	}
	if cpu(0) != 2 || cpu(1) != 2 {
		t.Fatalf("CPU depths %d, %d; want 2, 2", cpu(0), cpu(1))
	}
	// Doc 0 is loaded back (a GPU store of its keys touches it), then doc 2
	// is offloaded: doc 1 is the least recently used.
	ix.Apply("a", batch(eng.store(docs[0], 0, 2, 2), eng.remove(docs[0], 0, 2)))
	ix.Apply("a", batch(eng.store(docs[2], 0, 2, 2), eng.offload(docs[2], 0, 2), eng.remove(docs[2], 0, 2)))
	if cpu(0) != 2 || cpu(1) != 0 || cpu(2) != 2 {
		t.Errorf("CPU depths %d, %d, %d; want 2, 0, 2", cpu(0), cpu(1), cpu(2))
	}
	st := ix.Stats()
	if st.CPUEvictions != 2 || st.CPUEntries != 4 {
		t.Errorf("CPU evictions %d, entries %d; want 2, 4", st.CPUEvictions, st.CPUEntries)
	}
	if err := ix.SetCPUCapacity("a", 1); err != nil {
		t.Fatal(err)
	}
	if st := ix.Stats(); st.CPUEntries > 1 {
		t.Errorf("%d CPU entries after shrinking the tier to 1", st.CPUEntries)
	}
	if err := ix.SetCPUCapacity("a", -1); err == nil {
		t.Error("SetCPUCapacity(-1) succeeded")
	}
	if _, err := New(Config{CPUMaxEntries: -1}); err == nil {
		t.Error("New with negative CPUMaxEntries succeeded")
	}
}

// TestCPUTierMatchNoAlloc keeps Match allocation-free with a CPU tier.
func TestCPUTierMatchNoAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	doc := randTokens(60, 16*8)
	eng := engine{seed: 1, blockSize: 16}
	ix := newIndex(t, Config{}, "a", "b")
	ix.Apply("a", batch(eng.store(doc, 0, 8, 8), eng.offload(doc, 0, 8), eng.remove(doc, 4, 8)))
	keys := ix.Keys(doc, Root{Model: "m"})
	cands := []string{"a", "b", "a"}
	dst := make([]Hit, 0, len(cands))
	dst = ix.Match(keys, cands, dst) // warm the scratch pool
	if n := testing.AllocsPerRun(100, func() { dst = ix.Match(keys, cands, dst) }); n != 0 {
		t.Errorf("Match allocates %v times per call", n)
	}
	if dst[0] != (Hit{Blocks: 4, CPU: 4}) || dst[2] != dst[0] || dst[1] != (Hit{}) {
		t.Errorf("Match = %+v", dst)
	}
}
