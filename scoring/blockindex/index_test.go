package blockindex

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmpath/warmpath/kvevents"
)

func ptr[T any](v T) *T { return &v }

func TestStoreRemoveClear(t *testing.T) {
	doc := randTokens(10, 16*8) // 8 blocks
	eng := engine{seed: 1, blockSize: 16}
	tests := []struct {
		name string
		ops  func(ix *Index)
		want []int // depth for replicas a, b
		// entries held by a and b together, when not the sum of want.
		entries int
	}{
		{"nothing", func(*Index) {}, []int{0, 0}, 0},
		{"store all", func(ix *Index) {
			ix.Apply("a", batch(eng.store(doc, 0, 8, 4)))
		}, []int{8, 0}, 0},
		{"store in one-block events", func(ix *Index) {
			ix.Apply("a", batch(eng.store(doc, 0, 8, 1)))
		}, []int{8, 0}, 0},
		{"store across batches", func(ix *Index) {
			evs := eng.store(doc, 0, 8, 3)
			for _, e := range evs {
				ix.Apply("a", batch([]kvevents.Event{e}))
			}
		}, []int{8, 0}, 0},
		{"prefix only", func(ix *Index) {
			ix.Apply("b", batch(eng.store(doc, 0, 3, 2)))
		}, []int{0, 3}, 0},
		{"remove tail", func(ix *Index) {
			ix.Apply("a", batch(eng.store(doc, 0, 8, 4), eng.remove(doc, 5, 8)))
		}, []int{5, 0}, 0},
		{"remove middle block", func(ix *Index) {
			ix.Apply("a", batch(eng.store(doc, 0, 8, 4), eng.remove(doc, 2, 3)))
		}, []int{2, 0}, 7},
		{"remove unknown", func(ix *Index) {
			ix.Apply("a", batch(eng.store(doc, 0, 4, 4), engine{seed: 9, blockSize: 16}.remove(doc, 0, 4)))
		}, []int{4, 0}, 0},
		{"all blocks cleared", func(ix *Index) {
			ix.Apply("a", batch(eng.store(doc, 0, 8, 4), []kvevents.Event{&kvevents.AllBlocksCleared{}}))
			ix.Apply("b", batch(eng.store(doc, 0, 8, 4)))
		}, []int{0, 8}, 0},
		{"clear", func(ix *Index) {
			ix.Apply("a", batch(eng.store(doc, 0, 8, 4)))
			ix.Apply("b", batch(eng.store(doc, 0, 6, 4)))
			ix.Clear("a")
		}, []int{0, 6}, 0},
		{"clear then store again", func(ix *Index) {
			ix.Apply("a", batch(eng.store(doc, 0, 8, 4)))
			ix.Clear("a")
			ix.Apply("a", batch(eng.store(doc, 0, 2, 4)))
		}, []int{2, 0}, 0},
		{"re-store is idempotent", func(ix *Index) {
			ix.Apply("a", batch(eng.store(doc, 0, 8, 4)))
			ix.Apply("a", batch(eng.store(doc, 0, 8, 2))) // e.g. kv_cache_report_mode "full"
			ix.Apply("a", batch(eng.remove(doc, 6, 8)))
		}, []int{6, 0}, 0},
		{"re-store after eviction", func(ix *Index) {
			ix.Apply("a", batch(eng.store(doc, 0, 8, 4), eng.remove(doc, 4, 8), eng.store(doc, 4, 8, 4)))
		}, []int{8, 0}, 0},
		{"unknown parent skipped", func(ix *Index) {
			ix.Apply("a", batch(eng.store(doc, 0, 2, 2), eng.store(doc, 4, 8, 4)))
		}, []int{2, 0}, 0},
		{"other engine seed still matches", func(ix *Index) {
			ix.Apply("a", batch(engine{seed: 77, blockSize: 16}.store(doc, 0, 8, 4)))
			ix.Apply("b", batch(engine{seed: 78, blockSize: 16}.store(doc, 0, 5, 4)))
		}, []int{8, 5}, 0},
	}
	keys := Hasher{}.AppendKeys(nil, doc, Root{Model: "m"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := newIndex(t, Config{}, "a", "b")
			tt.ops(ix)
			if got := depths(ix, keys, "a", "b"); !equalInts(got, tt.want) {
				t.Errorf("depths = %v; want %v", got, tt.want)
			}
			want := tt.entries
			if want == 0 {
				want = tt.want[0] + tt.want[1]
			}
			st := checkCounts(t, ix)
			if got := st.Replicas["a"].Entries + st.Replicas["b"].Entries; got != int64(want) {
				t.Errorf("entries = %d; want %d", got, want)
			}
		})
	}
}

func TestUnknownParentCounted(t *testing.T) {
	ix := newIndex(t, Config{}, "a")
	doc := randTokens(11, 64)
	eng := engine{seed: 1, blockSize: 16}
	ix.Apply("a", batch(eng.store(doc, 2, 4, 2)))
	st := ix.Stats()
	if st.Skipped[SkipUnknownParent] != 1 || st.Entries != 0 {
		t.Errorf("skipped %v, entries %d; want one unknown_parent and no entries", st.Skipped, st.Entries)
	}
}

func TestSkips(t *testing.T) {
	doc := randTokens(12, 32)
	eng := engine{seed: 1, blockSize: 16}
	good := func() *kvevents.BlockStored { return eng.store(doc, 0, 2, 2)[0].(*kvevents.BlockStored) }
	tests := []struct {
		name   string
		ev     kvevents.Event
		reason SkipReason
	}{
		{"storage medium", func() kvevents.Event { e := good(); e.Medium = kvevents.MediumStorage; return e }(), SkipMedium},
		{"storage removal", &kvevents.BlockRemoved{BlockHashes: []uint64{1}, Medium: "storage"}, SkipMedium},
		{"cpu offload of an unknown block", func() kvevents.Event {
			e := good()
			e.Medium, e.TokenIDs = kvevents.MediumCPU, nil
			return e
		}(), SkipUnknownBlock},
		{"sliding window", func() kvevents.Event { e := good(); e.KVCacheSpecKind = "sliding_window"; return e }(), SkipAttentionKind},
		{"mamba", func() kvevents.Event { e := good(); e.KVCacheSpecKind = "mamba"; return e }(), SkipAttentionKind},
		{"short tokens", func() kvevents.Event { e := good(); e.TokenIDs = e.TokenIDs[:20]; return e }(), SkipTokenCount},
		{"zero block size", func() kvevents.Event { e := good(); e.BlockSize = 0; return e }(), SkipTokenCount},
		{"no tokens", func() kvevents.Event { e := good(); e.TokenIDs = nil; return e }(), SkipNoTokens},
		{"multimodal", func() kvevents.Event {
			e := good()
			e.ExtraKeys = [][]kvevents.ExtraKey{nil, {{Kind: kvevents.ExtraMultimodal, Value: "img"}}}
			return e
		}(), SkipExtraKeys},
		{"lora id only", func() kvevents.Event { e := good(); e.LoRAID = ptr(int64(3)); return e }(), SkipLoRAID},
		{"zero hash", func() kvevents.Event { e := good(); e.BlockHashes[1] = 0; return e }(), SkipZeroHash},
		{"unknown parent", func() kvevents.Event { e := good(); e.ParentBlockHash = ptr(uint64(42)); return e }(), SkipUnknownParent},
		{"unknown event", unknownEvent{}, SkipUnknownEvent},
	}
	keys := Hasher{}.AppendKeys(nil, doc, Root{Model: "m"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := newIndex(t, Config{}, "a")
			ix.Apply("a", kvevents.Batch{Events: []kvevents.Event{tt.ev}})
			st := ix.Stats()
			for why, n := range st.Skipped {
				want := int64(0)
				if why == tt.reason {
					want = 1
				}
				if n != want {
					t.Errorf("Skipped[%s] = %d; want %d", why, n, want)
				}
			}
			if got := depths(ix, keys, "a"); got[0] != 0 {
				t.Errorf("depth = %d after a skipped event; want 0", got[0])
			}
		})
	}
	// The accepted spellings of full attention and GPU are indexed.
	for _, kind := range []string{"", "full_attention", "mla_attention", "sink_full"} {
		for _, medium := range []string{"", "GPU", "gpu"} {
			ix := newIndex(t, Config{}, "a")
			e := good()
			e.KVCacheSpecKind, e.Medium = kind, medium
			ix.Apply("a", kvevents.Batch{Events: []kvevents.Event{e}})
			if got := depths(ix, keys, "a"); got[0] != 2 {
				t.Errorf("kind %q medium %q: depth %d; want 2", kind, medium, got[0])
			}
		}
	}
}

type unknownEvent struct{}

func (unknownEvent) Type() string { return "BlockInactive" }

func TestRootFromEvents(t *testing.T) {
	doc := randTokens(13, 64)
	eng := engine{seed: 1, blockSize: 16}
	withRoot := func(lora, salt string, extra bool) []kvevents.Event {
		evs := eng.store(doc, 0, 4, 2)
		e := evs[0].(*kvevents.BlockStored)
		if extra {
			e.ExtraKeys = [][]kvevents.ExtraKey{{{Kind: kvevents.ExtraLoRA, Value: lora}, {Kind: kvevents.ExtraCacheSalt, Value: salt}}, nil}
		} else {
			e.LoRAName, e.CacheSalt = lora, salt
		}
		return evs
	}
	tests := []struct {
		name string
		evs  []kvevents.Event
		root Root
		want int
	}{
		{"plain", withRoot("", "", false), Root{Model: "m"}, 4},
		{"plain vs other model", withRoot("", "", false), Root{Model: "other"}, 0},
		{"lora", withRoot("sql", "", false), Root{Model: "m", LoRA: "sql"}, 4},
		{"lora vs base", withRoot("sql", "", false), Root{Model: "m"}, 0},
		{"base vs lora", withRoot("", "", false), Root{Model: "m", LoRA: "sql"}, 0},
		{"salt", withRoot("", "t1", false), Root{Model: "m", CacheSalt: "t1"}, 4},
		{"salt vs other salt", withRoot("", "t1", false), Root{Model: "m", CacheSalt: "t2"}, 0},
		{"salt vs none", withRoot("", "t1", false), Root{Model: "m"}, 0},
		{"from extra keys", withRoot("sql", "t1", true), Root{Model: "m", LoRA: "sql", CacheSalt: "t1"}, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := newIndex(t, Config{}, "a")
			ix.Apply("a", batch(tt.evs))
			keys := ix.Keys(doc, tt.root)
			if got := depths(ix, keys, "a"); got[0] != tt.want {
				t.Errorf("depth = %d; want %d", got[0], tt.want)
			}
		})
	}
}

func TestSetReplicaModel(t *testing.T) {
	doc := randTokens(14, 64)
	eng := engine{seed: 1, blockSize: 16}
	ix := newIndex(t, Config{})
	ix.Apply("a", batch(eng.store(doc, 0, 4, 4))) // no model registered: Model ""
	if got := depths(ix, ix.Keys(doc, Root{}), "a"); got[0] != 4 {
		t.Errorf("unregistered model: depth %d under Root{}; want 4", got[0])
	}
	if err := ix.SetReplicaModel("a", "m"); err != nil {
		t.Fatal(err)
	}
	if got := depths(ix, ix.Keys(doc, Root{}), "a"); got[0] != 0 {
		t.Errorf("after a model change the replica should be cleared; depth %d", got[0])
	}
	ix.Apply("a", batch(eng.store(doc, 0, 4, 4)))
	if got := depths(ix, ix.Keys(doc, Root{Model: "m"}), "a"); got[0] != 4 {
		t.Errorf("depth %d under the registered model; want 4", got[0])
	}
	if err := ix.SetReplicaModel("a", "m"); err != nil {
		t.Fatal(err)
	}
	if got := depths(ix, ix.Keys(doc, Root{Model: "m"}), "a"); got[0] != 4 {
		t.Errorf("setting the same model again cleared the replica (depth %d)", got[0])
	}
	if got := ix.Stats().Replicas["a"].Model; got != "m" {
		t.Errorf("Stats model = %q; want m", got)
	}
}

// TestBlockSizeRatios stores a conversation with the engine's block size and
// matches it with ours, in both directions and with sizes that do not divide.
func TestBlockSizeRatios(t *testing.T) {
	tests := []struct {
		ours, engine int
	}{
		{16, 16}, {16, 64}, {64, 16}, {16, 48}, {48, 16}, {24, 16}, {16, 24}, {1, 16}, {16, 1},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("ours %d engine %d", tt.ours, tt.engine), func(t *testing.T) {
			const total = 16 * 48 // tokens: a multiple of every size above
			doc := randTokens(15, total)
			eng := engine{seed: 3, blockSize: tt.engine}
			nEng := total / tt.engine
			ix := newIndex(t, Config{BlockSize: tt.ours}, "a")
			keys := ix.Keys(doc, Root{Model: "m"})
			// Store in uneven events, as scheduler steps would.
			for from := 0; from < nEng; {
				to := min(nEng, from+1+from%3)
				ix.Apply("a", batch(eng.store(doc, from, to, 1+from%2)))
				from = to
				// Whatever has been stored is matched, own blocks that are not
				// yet complete excluded.
				if got, want := depths(ix, keys, "a")[0], to*tt.engine/tt.ours; got != want {
					t.Fatalf("after storing %d engine blocks: depth %d; want %d", to, got, want)
				}
			}
			// Evict engine blocks from the tail, one at a time. An own block
			// goes with the engine block that completed it.
			for n := nEng; n > 0; n-- {
				ix.Apply("a", batch(eng.remove(doc, n-1, n)))
				want := completedBefore(n-1, tt.engine, tt.ours)
				if got := depths(ix, keys, "a")[0]; got != want {
					t.Fatalf("after removing engine block %d: depth %d; want %d", n-1, got, want)
				}
			}
			if st := checkCounts(t, ix); st.Entries != 0 || st.Replicas["a"].EngineBlocks != 0 {
				t.Errorf("after removing everything: %d entries, %d engine blocks", st.Entries, st.Replicas["a"].EngineBlocks)
			}
		})
	}
}

// completedBefore returns the number of own blocks (of size ours) completed
// within the first n engine blocks (of size eng): floor(n·eng/ours).
func completedBefore(n, eng, ours int) int { return n * eng / ours }

func TestMatchLongestConsecutive(t *testing.T) {
	doc := randTokens(16, 16*6)
	ix := newIndex(t, Config{}, "a", "b", "c")
	keys := ix.Keys(doc, Root{Model: "m"})
	// a holds blocks 0, 1, 3, 4, 5 (a gap at 2), speculatively.
	ix.AddSpeculative("a", []uint64{keys[0], keys[1], keys[3], keys[4], keys[5]}, time.Minute)
	// b holds everything but block 0.
	ix.AddSpeculative("b", keys[1:], time.Minute)
	// c holds everything.
	ix.Apply("c", batch(engine{seed: 1, blockSize: 16}.store(doc, 0, 6, 6)))

	tests := []struct {
		name  string
		keys  []uint64
		cands []string
		want  []Hit
	}{
		{"all", keys, []string{"a", "b", "c"}, []Hit{{Blocks: 2, Speculative: 2}, {Blocks: 0, Speculative: 0}, {Blocks: 6, Speculative: 0}}},
		{"order follows candidates", keys, []string{"c", "a"}, []Hit{{Blocks: 6, Speculative: 0}, {Blocks: 2, Speculative: 2}}},
		{"unknown and duplicate names", keys, []string{"zz", "a", "a", "c", "zz"}, []Hit{{}, {Blocks: 2, Speculative: 2}, {Blocks: 2, Speculative: 2}, {Blocks: 6, Speculative: 0}, {}}},
		{"no candidates", keys, nil, []Hit{}},
		{"no keys", nil, []string{"a", "c"}, []Hit{{}, {}}},
		{"only the gap matters to a", keys[:2], []string{"a"}, []Hit{{Blocks: 2, Speculative: 2}}},
		{"keys from block 1 are not a prefix", keys[1:], []string{"a", "b", "c"}, []Hit{{Blocks: 1, Speculative: 1}, {Blocks: 5, Speculative: 5}, {Blocks: 5, Speculative: 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ix.Match(tt.keys, tt.cands, make([]Hit, 3))
			if len(got) != len(tt.want) {
				t.Fatalf("Match = %v; want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("Match = %v; want %v", got, tt.want)
					break
				}
			}
		})
	}
}

func TestMatchNoAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	doc := randTokens(17, 16*100)
	ix := newIndex(t, Config{}, "a", "b")
	ix.Apply("a", batch(engine{seed: 1, blockSize: 16}.store(doc, 0, 100, 4)))
	keys := ix.Keys(doc, Root{Model: "m"})
	cands := []string{"a", "b", "c"}
	dst := make([]Hit, 0, 3)
	ix.Match(keys, cands, dst) // warm the scratch pool
	if n := testing.AllocsPerRun(50, func() { dst = ix.Match(keys, cands, dst) }); n != 0 {
		t.Errorf("Match allocates %v times per call; want 0", n)
	}
}

func TestSpeculative(t *testing.T) {
	doc := randTokens(18, 16*4)
	eng := engine{seed: 1, blockSize: 16}
	type step struct {
		do   func(ix *Index, clk *fakeClock, keys []uint64)
		want Hit
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"expires", []step{
			{func(ix *Index, _ *fakeClock, k []uint64) { ix.AddSpeculative("a", k, 2*time.Second) }, Hit{Blocks: 4, Speculative: 4}},
			{func(_ *Index, c *fakeClock, _ []uint64) { c.Advance(1999 * time.Millisecond) }, Hit{Blocks: 4, Speculative: 4}},
			{func(_ *Index, c *fakeClock, _ []uint64) { c.Advance(time.Millisecond) }, Hit{Blocks: 0, Speculative: 0}},
		}},
		{"confirmed by events", []step{
			{func(ix *Index, _ *fakeClock, k []uint64) { ix.AddSpeculative("a", k, 2*time.Second) }, Hit{Blocks: 4, Speculative: 4}},
			{func(ix *Index, _ *fakeClock, _ []uint64) { ix.Apply("a", batch(eng.store(doc, 0, 2, 2))) }, Hit{Blocks: 4, Speculative: 2}},
			{func(_ *Index, c *fakeClock, _ []uint64) { c.Advance(3 * time.Second) }, Hit{Blocks: 2, Speculative: 0}},
			{func(ix *Index, _ *fakeClock, _ []uint64) { ix.Apply("a", batch(eng.remove(doc, 1, 2))) }, Hit{Blocks: 1, Speculative: 0}},
		}},
		{"confirmed, evicted, speculated again: the new deadline holds", []step{
			{func(ix *Index, _ *fakeClock, k []uint64) { ix.AddSpeculative("a", k, 2*time.Second) }, Hit{Blocks: 4, Speculative: 4}},
			{func(ix *Index, _ *fakeClock, _ []uint64) { ix.Apply("a", batch(eng.store(doc, 0, 4, 4))) }, Hit{Blocks: 4, Speculative: 0}},
			{func(ix *Index, _ *fakeClock, _ []uint64) { ix.Apply("a", batch(eng.remove(doc, 0, 4))) }, Hit{Blocks: 0, Speculative: 0}},
			{func(ix *Index, c *fakeClock, k []uint64) {
				c.Advance(time.Second)
				ix.AddSpeculative("a", k, 2*time.Second)
			}, Hit{Blocks: 4, Speculative: 4}},
			{func(_ *Index, c *fakeClock, _ []uint64) { c.Advance(1500 * time.Millisecond) }, Hit{Blocks: 4, Speculative: 4}},
			{func(_ *Index, c *fakeClock, _ []uint64) { c.Advance(500 * time.Millisecond) }, Hit{Blocks: 0, Speculative: 0}},
		}},
		{"refresh extends", []step{
			{func(ix *Index, _ *fakeClock, k []uint64) { ix.AddSpeculative("a", k, 2*time.Second) }, Hit{Blocks: 4, Speculative: 4}},
			{func(_ *Index, c *fakeClock, _ []uint64) { c.Advance(time.Second) }, Hit{Blocks: 4, Speculative: 4}},
			{func(ix *Index, _ *fakeClock, k []uint64) { ix.AddSpeculative("a", k[:2], 2*time.Second) }, Hit{Blocks: 4, Speculative: 4}},
			{func(_ *Index, c *fakeClock, _ []uint64) { c.Advance(1500 * time.Millisecond) }, Hit{Blocks: 2, Speculative: 2}},
			{func(_ *Index, c *fakeClock, _ []uint64) { c.Advance(time.Second) }, Hit{Blocks: 0, Speculative: 0}},
		}},
		{"shorter refresh does not shorten", []step{
			{func(ix *Index, _ *fakeClock, k []uint64) { ix.AddSpeculative("a", k, 5*time.Second) }, Hit{Blocks: 4, Speculative: 4}},
			{func(ix *Index, _ *fakeClock, k []uint64) { ix.AddSpeculative("a", k, time.Second) }, Hit{Blocks: 4, Speculative: 4}},
			{func(_ *Index, c *fakeClock, _ []uint64) { c.Advance(2 * time.Second) }, Hit{Blocks: 4, Speculative: 4}},
		}},
		{"real entries stay real", []step{
			{func(ix *Index, _ *fakeClock, _ []uint64) { ix.Apply("a", batch(eng.store(doc, 0, 4, 4))) }, Hit{Blocks: 4, Speculative: 0}},
			{func(ix *Index, _ *fakeClock, k []uint64) { ix.AddSpeculative("a", k, time.Second) }, Hit{Blocks: 4, Speculative: 0}},
			{func(_ *Index, c *fakeClock, _ []uint64) { c.Advance(2 * time.Second) }, Hit{Blocks: 4, Speculative: 0}},
		}},
		{"cleared", []step{
			{func(ix *Index, _ *fakeClock, k []uint64) { ix.AddSpeculative("a", k, time.Minute) }, Hit{Blocks: 4, Speculative: 4}},
			{func(ix *Index, _ *fakeClock, _ []uint64) { ix.Clear("a") }, Hit{Blocks: 0, Speculative: 0}},
			{func(ix *Index, c *fakeClock, k []uint64) {
				c.Advance(time.Hour)
				ix.AddSpeculative("a", k, time.Minute)
			}, Hit{Blocks: 4, Speculative: 4}},
			{func(ix *Index, _ *fakeClock, _ []uint64) {
				ix.Apply("a", kvevents.Batch{Events: []kvevents.Event{&kvevents.AllBlocksCleared{}}})
			}, Hit{Blocks: 0, Speculative: 0}},
		}},
		{"zero ttl adds nothing", []step{
			{func(ix *Index, _ *fakeClock, k []uint64) { ix.AddSpeculative("a", k, 0) }, Hit{Blocks: 0, Speculative: 0}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			ix := newIndex(t, Config{Now: clk.Now}, "a")
			keys := ix.Keys(doc, Root{Model: "m"})
			for i, s := range tt.steps {
				s.do(ix, clk, keys)
				if got := ix.Match(keys, []string{"a"}, nil)[0]; got != s.want {
					t.Fatalf("step %d: Match = %+v; want %+v", i, got, s.want)
				}
				st := checkCounts(t, ix)
				if st.Replicas["a"].Entries != int64(s.want.Blocks) || st.Replicas["a"].Speculative != int64(s.want.Speculative) {
					t.Fatalf("step %d: stats %+v; want %d entries, %d speculative", i, st.Replicas["a"], s.want.Blocks, s.want.Speculative)
				}
			}
		})
	}
}

// With a MatchGrace, Match leaves expired speculative entries to the event
// path for that long, and expires them itself after it.
func TestSpeculativeMatchGrace(t *testing.T) {
	doc := randTokens(20, 16*4)
	for _, tt := range []struct {
		name  string
		apply bool // an event batch arrives after the TTL
		after time.Duration
		want  Hit
	}{
		{"within the grace, no events", false, 2*time.Second + 50*time.Millisecond, Hit{Blocks: 4, Speculative: 4}},
		{"within the grace, an event batch", true, 2*time.Second + 50*time.Millisecond, Hit{}},
		{"past the grace", false, 2*time.Second + 100*time.Millisecond, Hit{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			ix := newIndex(t, Config{Now: clk.Now, MatchGrace: 100 * time.Millisecond}, "a", "b")
			keys := ix.Keys(doc, Root{Model: "m"})
			ix.AddSpeculative("a", keys, 2*time.Second)
			clk.Advance(tt.after)
			if tt.apply {
				other := randTokens(21, 16)
				ix.Apply("b", batch(engine{seed: 2, blockSize: 16}.store(other, 0, 1, 1)))
			}
			if got := ix.Match(keys, []string{"a"}, nil)[0]; got != tt.want {
				t.Fatalf("Match = %+v; want %+v", got, tt.want)
			}
		})
	}
	if _, err := New(Config{MatchGrace: -time.Second}); err == nil {
		t.Error("New accepted a negative MatchGrace")
	}
}

// A confirmed pair leaves its replica's deadlines at once, so that they
// hold only the pairs still awaiting events, and its expiry finds nothing
// to do.
func TestSpeculativeConfirmLeavesDeadlines(t *testing.T) {
	clk := newFakeClock()
	doc := randTokens(22, 16*4)
	ix := newIndex(t, Config{Now: clk.Now}, "a")
	keys := ix.Keys(doc, Root{Model: "m"})
	ix.AddSpeculative("a", keys, time.Second)
	r, _ := ix.reg.get("a")
	if n := r.specDeadlines.len(); n != 4 {
		t.Fatalf("%d deadlines after speculating 4 keys", n)
	}
	ix.Apply("a", batch(engine{seed: 1, blockSize: 16}.store(doc, 0, 3, 3)))
	if n := r.specDeadlines.len(); n != 1 {
		t.Fatalf("%d deadlines after confirming 3 of 4 keys; want 1", n)
	}
	clk.Advance(time.Second)
	if got := ix.Match(keys, []string{"a"}, nil)[0]; got != (Hit{Blocks: 3}) {
		t.Fatalf("Match after the TTL = %+v; want 3 real blocks", got)
	}
	if st := ix.Stats(); st.Confirmed != 3 || st.Expired != 1 || r.specDeadlines.len() != 0 {
		t.Errorf("confirmed %d, expired %d, %d deadlines left; want 3, 1, 0", st.Confirmed, st.Expired, r.specDeadlines.len())
	}
}

// A confirmation that finds its pair speculative again (evicted for
// capacity and speculated anew in between) keeps the new speculation's
// deadline, so that it still expires.
func TestSpeculativeConfirmKeepsRespeculatedDeadline(t *testing.T) {
	clk := newFakeClock()
	doc := randTokens(23, 16)
	ix := newIndex(t, Config{Now: clk.Now}, "a")
	keys := ix.Keys(doc, Root{Model: "m"})
	ix.AddSpeculative("a", keys, time.Second)
	r, _ := ix.reg.get("a")
	ix.confirm(r, keys[0]) // late: the pair is speculative again
	r.spec.Add(1)          // undo confirm's counting: the table did not confirm
	if _, ok := r.specDeadlines.get(keys[0]); !ok {
		t.Fatal("the speculative pair lost its deadline")
	}
	clk.Advance(time.Second)
	if got := ix.Match(keys, []string{"a"}, nil)[0]; got != (Hit{}) {
		t.Fatalf("Match after the TTL = %+v; want nothing", got)
	}
}

func TestSpeculativeCounters(t *testing.T) {
	clk := newFakeClock()
	doc := randTokens(19, 16*4)
	ix := newIndex(t, Config{Now: clk.Now}, "a")
	keys := ix.Keys(doc, Root{Model: "m"})
	ix.AddSpeculative("a", keys, time.Second)
	ix.Apply("a", batch(engine{seed: 1, blockSize: 16}.store(doc, 0, 1, 1)))
	clk.Advance(time.Second)
	st := ix.Stats()
	if st.Confirmed != 1 || st.Expired != 3 || st.Speculative != 0 || st.Entries != 1 {
		t.Errorf("confirmed %d, expired %d, speculative %d, entries %d; want 1, 3, 0, 1", st.Confirmed, st.Expired, st.Speculative, st.Entries)
	}
}

func TestCapacityEviction(t *testing.T) {
	const maxEntries = 100
	ix := newIndex(t, Config{MaxEntries: maxEntries}, "a", "b")
	eng := engine{seed: 1, blockSize: 16}
	var docs [][]uint32
	for i := range 20 {
		doc := randTokens(uint64(100+i), 16*20)
		docs = append(docs, doc)
		ix.Apply([]string{"a", "b"}[i%2], batch(eng.store(doc, 0, 20, 4)))
		// Keep the first conversation hot: it is looked up all the time.
		ix.Match(ix.Keys(docs[0], Root{Model: "m"}), []string{"a"}, nil)
		if st := ix.Stats(); st.Entries > maxEntries {
			t.Fatalf("after %d conversations: %d entries > MaxEntries %d", i+1, st.Entries, maxEntries)
		}
	}
	st := checkCounts(t, ix)
	if want := int64(20*20 - st.Entries); st.Evictions != want {
		t.Errorf("evictions = %d; want %d (stored − held)", st.Evictions, want)
	}
	if got := depths(ix, ix.Keys(docs[0], Root{Model: "m"}), "a")[0]; got != 20 {
		t.Errorf("the hot conversation kept %d of 20 blocks", got)
	}
	if got := depths(ix, ix.Keys(docs[19], Root{Model: "m"}), "b")[0]; got != 20 {
		t.Errorf("the newest conversation kept %d of 20 blocks", got)
	}
	// Engine tables follow: continuing an evicted chain is skipped, and
	// removing everything leaves nothing behind.
	for i, doc := range docs {
		ix.Apply([]string{"a", "b"}[i%2], batch(eng.remove(doc, 0, 20)))
	}
	if st := checkCounts(t, ix); st.Entries != 0 || st.Keys != 0 {
		t.Errorf("after removing everything: %d entries, %d keys", st.Entries, st.Keys)
	}
}

// TestEngineTablePurge checks that engine tables do not keep growing with
// blocks whose entries were evicted, when the engine never removes them.
func TestEngineTablePurge(t *testing.T) {
	ix := newIndex(t, Config{MaxEntries: 1000}, "a")
	eng := engine{seed: 1, blockSize: 16}
	for i := range 200 {
		ix.Apply("a", batch(eng.store(randTokens(uint64(1000+i), 16*50), 0, 50, 10)))
	}
	st := checkCounts(t, ix)
	if eb := st.Replicas["a"].EngineBlocks; eb > 4*1000 {
		t.Errorf("engine table holds %d blocks for %d entries; want it bounded near the entry count", eb, st.Entries)
	}
}

// TestSharedOwnKey: two engine blocks mapping to one own key (vLLM's partial
// entries, or extra keys the index ignores) keep it until both are removed.
func TestSharedOwnKey(t *testing.T) {
	doc := randTokens(20, 32)
	ix := newIndex(t, Config{}, "a")
	e1, e2 := engine{seed: 1, blockSize: 16}, engine{seed: 2, blockSize: 16}
	ix.Apply("a", batch(e1.store(doc, 0, 2, 2), e2.store(doc, 0, 2, 2)))
	keys := ix.Keys(doc, Root{Model: "m"})
	steps := []struct {
		evs  []kvevents.Event
		want int
	}{
		{e1.remove(doc, 1, 2), 2},
		{e1.remove(doc, 0, 1), 2},
		{e2.remove(doc, 1, 2), 1},
		{e2.remove(doc, 0, 1), 0},
	}
	for i, s := range steps {
		ix.Apply("a", batch(s.evs))
		if got := depths(ix, keys, "a")[0]; got != s.want {
			t.Fatalf("step %d: depth %d; want %d", i, got, s.want)
		}
	}
	if st := checkCounts(t, ix); st.Entries != 0 {
		t.Errorf("%d entries left", st.Entries)
	}
}

func TestGroupsAreSeparate(t *testing.T) {
	doc := randTokens(21, 32)
	eng := engine{seed: 1, blockSize: 16}
	ix := newIndex(t, Config{}, "a")
	g0 := eng.store(doc, 0, 2, 2)
	g1 := eng.store(doc, 0, 2, 2)
	g1[0].(*kvevents.BlockStored).GroupIdx = ptr(1)
	ix.Apply("a", batch(g0, g1))
	rm := eng.remove(doc, 0, 2)
	for _, e := range rm {
		e.(*kvevents.BlockRemoved).GroupIdx = ptr(1)
	}
	ix.Apply("a", batch(rm))
	if got := depths(ix, ix.Keys(doc, Root{Model: "m"}), "a")[0]; got != 2 {
		t.Errorf("removing group 1's blocks dropped group 0's: depth %d; want 2", got)
	}
}

func TestHotKeyManyReplicas(t *testing.T) {
	// A system prompt held by 64 replicas spills into overflow lists; then
	// replicas leave one by one and it returns inline.
	doc := randTokens(22, 16*10)
	ix := newIndex(t, Config{})
	eng := engine{seed: 1, blockSize: 16}
	var names []string
	for i := range 64 {
		names = append(names, fmt.Sprintf("r%02d", i))
		if err := ix.SetReplicaModel(names[i], "m"); err != nil {
			t.Fatal(err)
		}
		ix.Apply(names[i], batch(eng.store(doc, 0, 1+i%10, 4)))
	}
	keys := ix.Keys(doc, Root{Model: "m"})
	hits := ix.Match(keys, names, nil)
	for i, h := range hits {
		if h.Blocks != 1+i%10 {
			t.Fatalf("%s: depth %d; want %d", names[i], h.Blocks, 1+i%10)
		}
	}
	for i := range 62 {
		ix.Clear(names[i])
	}
	hits = ix.Match(keys, names, hits)
	for i, h := range hits {
		want := 0
		if i >= 62 {
			want = 1 + i%10
		}
		if h.Blocks != want {
			t.Fatalf("after clearing: %s depth %d; want %d", names[i], h.Blocks, want)
		}
	}
	checkCounts(t, ix)
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{{BlockSize: -1}, {BlockSize: MaxBlockSize + 1}, {MaxEntries: -1}} {
		if _, err := New(cfg); err == nil || !strings.HasPrefix(err.Error(), "blockindex: ") {
			t.Errorf("New(%+v) error = %v; want a blockindex error", cfg, err)
		}
	}
	if ix, err := New(Config{}); err != nil || ix.BlockSize() != DefaultBlockSize {
		t.Errorf("New(Config{}) = block size %v, %v; want %d, nil", ix.BlockSize(), err, DefaultBlockSize)
	}
}

// TestConcurrentApplyMatch runs event application for several replicas
// concurrently with lookups, speculative adds, clears and stats; run it with
// -race. It also checks that a lookup never sees more of a replica's prefix
// than that replica's writer ever stored.
func TestConcurrentApplyMatch(t *testing.T) {
	const (
		replicas = 6
		rounds   = 150
		blocks   = 40
	)
	clk := newFakeClock()
	ix := newIndex(t, Config{MaxEntries: 20000, Now: clk.Now})
	shared := randTokens(23, 16*10)
	var docs [][]uint32
	for i := range 8 {
		docs = append(docs, concat(shared, randTokens(uint64(200+i), 16*(blocks-10))))
	}
	var names []string
	for r := range replicas {
		names = append(names, fmt.Sprintf("r%d", r))
		if err := ix.SetReplicaModel(names[r], "m"); err != nil {
			t.Fatal(err)
		}
	}
	var keys [][]uint64
	for _, d := range docs {
		keys = append(keys, ix.Keys(d, Root{Model: "m"}))
	}
	var writers, readers sync.WaitGroup
	stop := make(chan struct{})
	for r := range replicas {
		writers.Go(func() {
			eng := engine{seed: uint64(r), blockSize: []int{16, 64, 8}[r%3]}
			nEng := blocks * 16 / eng.blockSize
			for i := range rounds {
				d := docs[(r+i)%len(docs)]
				b := rankBatch(i%2, eng.store(d, 0, nEng, 3)) // two data-parallel ranks
				if i%3 == 0 {
					b.Events = append(b.Events, eng.offload(d, 0, nEng/2)...) // and a CPU tier
				}
				ix.Apply(names[r], b)
				if i%7 == 0 {
					ix.Apply(names[r], rankBatch(i%2, eng.remove(d, nEng/2, nEng), eng.cpuRemove(d, 0, 1)))
				}
				if i%31 == 0 {
					ix.Clear(names[r])
				}
				if i%17 == 0 {
					ix.ClearRank(names[r], 1)
				}
				if i%40 == 0 {
					_ = ix.SetCPUCapacity(names[r], 5+i%20)
				}
			}
		})
	}
	for m := range 3 {
		readers.Go(func() {
			dst := make([]Hit, 0, replicas)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[(m+i)%len(keys)]
				dst = ix.Match(k, names, dst)
				for j, h := range dst {
					if h.Blocks+h.CPU > len(k) || h.Speculative > h.Blocks {
						t.Errorf("%s: hit %+v for %d keys", names[j], h, len(k))
						return
					}
				}
				if i%50 == 0 {
					ix.AddSpeculative(names[i%replicas], k[:10], time.Second)
					clk.Advance(100 * time.Millisecond)
				}
				if i%500 == 0 {
					_ = ix.Stats()
				}
			}
		})
	}
	writers.Wait()
	close(stop)
	readers.Wait()
	clk.Advance(time.Hour)
	for _, n := range names {
		ix.Clear(n)
	}
	if st := checkCounts(t, ix); st.Entries != 0 || st.Keys != 0 || st.CPUEntries != 0 {
		t.Errorf("after clearing all replicas: %d entries, %d keys, %d CPU entries", st.Entries, st.Keys, st.CPUEntries)
	}
}
