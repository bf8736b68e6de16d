package blockindex

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

func newApprox(tb testing.TB, cfg ApproxConfig) *Approx {
	tb.Helper()
	a, err := NewApprox(cfg)
	if err != nil {
		tb.Fatalf("NewApprox(%+v): %v", cfg, err)
	}
	return a
}

// conversation returns the canonical text of a conversation of n turns.
func conversation(seed, n int) string {
	var b strings.Builder
	b.WriteString("<system>You are a coding agent. ")
	b.WriteString(strings.Repeat("Follow the repository's conventions. ", 8)) // 296 bytes in all
	b.WriteString("</system>")
	for i := range n {
		fmt.Fprintf(&b, "<user>turn %d of conversation %d: %s</user>", i, seed, strings.Repeat("please fix the tests ", 10+i))
		fmt.Fprintf(&b, "<assistant>done with turn %d: %s</assistant>", i, strings.Repeat("edited a file ", 8+i))
	}
	return b.String()
}

func TestApproxKeys(t *testing.T) {
	a := newApprox(t, ApproxConfig{ChunkBytes: 64})
	root := Root{Model: "m"}
	text := conversation(1, 3)
	k1 := a.AppendKeys(nil, text, root)
	if len(k1) != len(text)/64 {
		t.Fatalf("%d keys for %d bytes; want %d", len(k1), len(text), len(text)/64)
	}
	if k2 := a.AppendKeys(nil, text, root); !slices.Equal(k1, k2) {
		t.Errorf("keys not deterministic")
	}
	// A longer conversation shares the keys of its prefix's full chunks.
	longer := a.AppendKeys(nil, conversation(1, 4), root)
	if n := len(conversation(1, 3)) / 64; !slices.Equal(longer[:n-1], k1[:n-1]) {
		t.Errorf("the next turn does not share the previous turn's keys")
	}
	// Chained: the same chunk after a different prefix has another key.
	x := strings.Repeat("a", 64)
	ka := a.AppendKeys(nil, strings.Repeat("b", 64)+x, root)
	kb := a.AppendKeys(nil, strings.Repeat("c", 64)+x, root)
	if ka[1] == kb[1] {
		t.Errorf("chunk after different prefixes has the same key")
	}
	// The root matters, and approximate keys never equal precise ones.
	for _, r := range []Root{{Model: "m2"}, {Model: "m", CacheSalt: "s"}, {Model: "m", LoRA: "l"}} {
		if k := a.AppendKeys(nil, text, r); k[0] == k1[0] {
			t.Errorf("root %+v gives the same keys as %+v", r, root)
		}
	}
	if root.seed(approxTag) == root.Seed() {
		t.Errorf("approximate and precise seeds coincide")
	}
	if got := a.AppendKeys(nil, text[:63], root); len(got) != 0 {
		t.Errorf("a partial chunk got keys %x", got)
	}
}

func TestApproxRecordMatch(t *testing.T) {
	a := newApprox(t, ApproxConfig{})
	root := Root{Model: "m"}
	turn1 := a.AppendKeys(nil, conversation(1, 2), root)
	turn2 := a.AppendKeys(nil, conversation(1, 3), root)
	other := a.AppendKeys(nil, conversation(2, 3), root)
	a.Record("r1", turn1)
	a.Record("r2", other)
	tests := []struct {
		name  string
		keys  []uint64
		cands []string
		want  []int
	}{
		{"next turn", turn2, []string{"r1", "r2", "r3"}, []int{len(turn1), 1, 0}},
		{"same turn", turn1, []string{"r1"}, []int{len(turn1)}},
		{"other conversation", other, []string{"r1", "r2"}, []int{1, len(other)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := depths(a, tt.keys, tt.cands...); !equalInts(got, tt.want) {
				t.Errorf("depths = %v; want %v", got, tt.want)
			}
		})
	}
	// Both conversations share the system prompt's first chunk.
	if st := a.Stats(); st.Keys != st.Entries-1 {
		t.Errorf("keys %d, entries %d: want exactly one shared key", st.Keys, st.Entries)
	}
}

func TestApproxLRU(t *testing.T) {
	const capacity = 30
	a := newApprox(t, ApproxConfig{ChunkBytes: 64, Capacity: capacity})
	root := Root{Model: "m"}
	c1 := a.AppendKeys(nil, conversation(1, 3), root)
	c2 := a.AppendKeys(nil, conversation(2, 3), root)
	shared := 0
	for shared < len(c1) && c1[shared] == c2[shared] {
		shared++
	}
	n1, n2 := len(c1), len(c2)
	if shared == 0 || n2 >= capacity || n1+n2-shared <= capacity {
		t.Fatalf("test needs a shared prefix and conversations that overflow together: %d, %d, %d shared", n1, n2, shared)
	}
	a.Record("r", c1)
	a.Record("r", c2) // c2 is newer; the LRU forgets c1's deepest chunks first
	if got, want := depths(a, c1, "r")[0], shared+capacity-n2; got != want {
		t.Errorf("old conversation keeps %d chunks; want %d", got, want)
	}
	if got := depths(a, c2, "r")[0]; got != n2 {
		t.Errorf("new conversation keeps %d of %d chunks", got, n2)
	}
	st := a.Stats()
	if want := int64(n1 + n2 - shared - capacity); st.Replicas["r"].Entries != capacity || st.Evictions != want {
		t.Errorf("stats %+v; want %d entries and %d evictions", st, capacity, want)
	}
	// Shrinking the capacity evicts at once; Clear forgets everything.
	if err := a.SetCapacity("r", 5); err != nil {
		t.Fatal(err)
	}
	if got := depths(a, c2, "r")[0]; got != 5 {
		t.Errorf("after SetCapacity(5): depth %d; want 5", got)
	}
	a.Clear("r")
	if st := a.Stats(); st.Entries != 0 || st.Keys != 0 || st.Replicas["r"].Capacity != 5 {
		t.Errorf("after Clear: %+v; want empty, capacity kept", st)
	}
	if err := a.SetCapacity("r", 0); err != nil {
		t.Fatal(err)
	}
	if got := a.Stats().Replicas["r"].Capacity; got != 30 {
		t.Errorf("SetCapacity(0) left capacity %d; want the default 30", got)
	}
}

func TestApproxDefaults(t *testing.T) {
	a := newApprox(t, ApproxConfig{})
	a.Record("r", []uint64{1})
	if got, want := a.Stats().Replicas["r"].Capacity, DefaultApproxKVTokens*4/DefaultChunkBytes; got != want {
		t.Errorf("default capacity %d; want %d", got, want)
	}
	if a.ChunkBytes() != DefaultChunkBytes {
		t.Errorf("default chunk %d; want %d", a.ChunkBytes(), DefaultChunkBytes)
	}
	if got := ApproxCapacity(300_000, 256); got != 4687 {
		t.Errorf("ApproxCapacity(300000, 256) = %d; want 4687", got)
	}
	for _, cfg := range []ApproxConfig{{ChunkBytes: -1}, {Capacity: -1}} {
		if _, err := NewApprox(cfg); err == nil {
			t.Errorf("NewApprox(%+v) succeeded; want an error", cfg)
		}
	}
}

func TestApproxConcurrent(t *testing.T) {
	a := newApprox(t, ApproxConfig{ChunkBytes: 64, Capacity: 200})
	root := Root{Model: "m"}
	var convs [][]uint64
	for i := range 10 {
		convs = append(convs, a.AppendKeys(nil, conversation(i, 4), root))
	}
	names := []string{"r0", "r1", "r2", "r3"}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			dst := make([]Hit, 0, len(names))
			for i := range 300 {
				k := convs[(w+i)%len(convs)]
				a.Record(names[(w*i)%len(names)], k)
				dst = a.Match(k, names, dst)
				for _, h := range dst {
					if h.Blocks > len(k) {
						t.Errorf("hit %d > %d keys", h.Blocks, len(k))
						return
					}
				}
				if i%100 == 0 {
					a.Clear(names[w])
				}
			}
		})
	}
	wg.Wait()
	st := a.Stats()
	var sum int64
	for _, r := range st.Replicas {
		if r.Entries > 200 {
			t.Errorf("replica over capacity: %d", r.Entries)
		}
		sum += r.Entries
	}
	if sum != st.Entries {
		t.Errorf("replica entries sum to %d; table holds %d", sum, st.Entries)
	}
}

// Keys from outside AppendKeys may use all 64 bits: Record and Match must
// agree on them.
func TestApproxFullWidthKeys(t *testing.T) {
	a, err := NewApprox(ApproxConfig{})
	if err != nil {
		t.Fatal(err)
	}
	keys := []uint64{0xF000_0000_0000_0001, 0xE123_4567_89AB_CDEF, 0x8000_0000_0000_0000 | 42}
	a.Record("r", keys)
	if got := a.Match(keys, []string{"r"}, nil)[0].Blocks; got != len(keys) {
		t.Errorf("matched %d of %d full-width keys", got, len(keys))
	}
}
