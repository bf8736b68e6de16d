package blockindex

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmpath/warmpath/kvevents"
)

// Benchmark workload: a fleet of 64 replicas with engine block size 16 (our
// default too), conversations of 64–1000 blocks, 80% of them behind one of
// eight system prompts of 64–256 blocks, each conversation on one replica.
// A replica stores a system prompt once; later conversations continue from
// its last block, as vLLM's prefix cache would. Events carry 4 blocks each,
// batched 8 to a batch.
const (
	hotHolders      = 8
	benchReplicas   = 64
	benchBlock      = 16
	benchPairs      = 1_000_000
	benchPrompts    = 8
	benchPerEvent   = 4
	benchPerBatch   = 8
	benchPromptRate = 0.8
)

// fleetGen generates the benchmark workload deterministically.
type fleetGen struct {
	rng      *rand.Rand
	replicas []string
	engSeed  []uint64
	prompts  [][]uint32
	// promptHashes[r][p] are replica r's engine hashes of prompt p, once
	// stored there.
	promptHashes [][][]uint64
	pairs        int
	tokens       []uint32 // scratch: one conversation
	hashes       []uint64 // scratch: its engine hashes
}

func newFleetGen(seed uint64) *fleetGen {
	g := &fleetGen{rng: rand.New(rand.NewPCG(seed, 0xbe7c4))}
	for r := range benchReplicas {
		g.replicas = append(g.replicas, fmt.Sprintf("10.0.%d.%d:8000", r/16, r%16))
		g.engSeed = append(g.engSeed, g.rng.Uint64())
		g.promptHashes = append(g.promptHashes, make([][]uint64, benchPrompts))
	}
	for range benchPrompts {
		g.prompts = append(g.prompts, g.randTokens(nil, benchBlock*(64+g.rng.IntN(193))))
	}
	return g
}

func (g *fleetGen) randTokens(dst []uint32, n int) []uint32 {
	for range n {
		dst = append(dst, g.rng.Uint32N(150_000))
	}
	return dst
}

// engineHashes appends replica r's engine hashes of tokens' blocks, chained
// from prev: content-addressed like vLLM's, but cheap to compute.
func engineHashes(dst []uint64, prev uint64, tokens []uint32) []uint64 {
	for i := 0; i+benchBlock <= len(tokens); i += benchBlock {
		h := prev
		for _, t := range tokens[i : i+benchBlock] {
			h = (h ^ uint64(t)) * 0x100000001b3
		}
		h ^= h >> 31
		h *= 0x9E3779B97F4A7C15
		h ^= h >> 29
		prev = h | 1<<63
		dst = append(dst, prev)
	}
	return dst
}

// conversation generates one conversation on a random replica and passes
// its BlockStored batches to apply. It returns the pairs it added.
func (g *fleetGen) conversation(apply func(replica string, b kvevents.Batch)) int {
	r := g.rng.IntN(benchReplicas)
	total := 64 + g.rng.IntN(937)
	g.tokens = g.tokens[:0]
	start := 0         // first block to store
	var parent *uint64 // engine hash before block start
	prev := g.engSeed[r]
	p := -1
	if g.rng.Float64() < benchPromptRate {
		p = g.rng.IntN(benchPrompts)
		g.tokens = append(g.tokens, g.prompts[p]...)
		if hs := g.promptHashes[r][p]; hs != nil {
			start = len(hs)
			parent = &hs[len(hs)-1]
			prev = hs[len(hs)-1]
		}
	}
	prefix := len(g.tokens) / benchBlock
	g.tokens = g.randTokens(g.tokens, benchBlock*max(1, total-prefix))
	g.hashes = engineHashes(g.hashes[:0], prev, g.tokens[start*benchBlock:])
	if p >= 0 && parent == nil {
		g.promptHashes[r][p] = append([]uint64(nil), g.hashes[:prefix]...)
	}
	var b kvevents.Batch
	for i := 0; i < len(g.hashes); i += benchPerEvent {
		j := min(len(g.hashes), i+benchPerEvent)
		ev := &kvevents.BlockStored{
			BlockHashes:     g.hashes[i:j],
			ParentBlockHash: parent,
			TokenIDs:        g.tokens[(start+i)*benchBlock : (start+j)*benchBlock],
			BlockSize:       benchBlock,
			Medium:          kvevents.MediumGPU,
		}
		parent = &g.hashes[j-1]
		b.Events = append(b.Events, ev)
		if len(b.Events) == benchPerBatch {
			apply(g.replicas[r], b)
			b = kvevents.Batch{}
		}
	}
	if len(b.Events) > 0 {
		apply(g.replicas[r], b)
	}
	g.pairs += len(g.hashes)
	return len(g.hashes)
}

// fill applies conversations to ix until it holds about pairs (block,
// replica) pairs, and returns the exact number.
func (g *fleetGen) fill(tb testing.TB, ix *Index, pairs int) int {
	for _, r := range g.replicas {
		if err := ix.SetReplicaModel(r, "model"); err != nil {
			tb.Fatal(err)
		}
	}
	for g.pairs < pairs {
		g.conversation(ix.Apply)
	}
	return g.pairs
}

// BenchmarkMemory reports the heap bytes per tracked (block, replica) pair
// of an index filled with the benchmark workload (1 M pairs over 64
// replicas), engine tables and everything else included.
func BenchmarkMemory(b *testing.B) {
	b.ReportAllocs()
	var perPair float64
	var st Stats
	for b.Loop() {
		g := newFleetGen(1)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		ix := newIndex(b, Config{})
		pairs := g.fill(b, ix, benchPairs)
		runtime.GC()
		runtime.ReadMemStats(&after)
		st = ix.Stats()
		if st.Entries != int64(pairs) {
			b.Fatalf("index holds %d entries; workload stored %d", st.Entries, pairs)
		}
		perPair = float64(after.HeapAlloc-before.HeapAlloc) / float64(pairs)
		runtime.KeepAlive(ix) // g is garbage by now: its scratch is not counted
	}
	b.ReportMetric(perPair, "B/pair")
	b.ReportMetric(float64(st.Entries), "pairs")
	b.ReportMetric(float64(st.Keys), "keys")
}

// benchStream is a cyclic list of batches of one event each: per replica,
// conversations of 64–256 blocks stored 4 blocks an event, then evicted one
// BlockRemoved per block, interleaved across replicas. A whole cycle leaves
// the index as it found it.
func benchStream(g *fleetGen, events int) (replicas []int, batches []kvevents.Batch) {
	type conv struct {
		r      int
		stores []kvevents.Event
		rms    []kvevents.Event
	}
	var pending []conv
	for len(batches) < events {
		r := g.rng.IntN(benchReplicas)
		toks := g.randTokens(nil, benchBlock*(64+g.rng.IntN(193)))
		hs := engineHashes(nil, g.engSeed[r]^0xa11, toks)
		c := conv{r: r}
		var parent *uint64
		for i := 0; i < len(hs); i += benchPerEvent {
			j := min(len(hs), i+benchPerEvent)
			c.stores = append(c.stores, &kvevents.BlockStored{
				BlockHashes: hs[i:j], ParentBlockHash: parent,
				TokenIDs: toks[i*benchBlock : j*benchBlock], BlockSize: benchBlock, Medium: kvevents.MediumGPU,
			})
			parent = &hs[j-1]
		}
		for i := len(hs) - 1; i >= 0; i-- { // vLLM evicts a request's tail first
			c.rms = append(c.rms, &kvevents.BlockRemoved{BlockHashes: hs[i : i+1], Medium: kvevents.MediumGPU})
		}
		for _, e := range c.stores {
			replicas, batches = append(replicas, c.r), append(batches, kvevents.Batch{Events: []kvevents.Event{e}})
		}
		pending = append(pending, c)
		if len(pending) > 16 { // evict the oldest conversation
			old := pending[0]
			pending = pending[1:]
			for _, e := range old.rms {
				replicas, batches = append(replicas, old.r), append(batches, kvevents.Batch{Events: []kvevents.Event{e}})
			}
		}
	}
	for _, c := range pending {
		for _, e := range c.rms {
			replicas, batches = append(replicas, c.r), append(batches, kvevents.Batch{Events: []kvevents.Event{e}})
		}
	}
	return replicas, batches
}

// BenchmarkApply reports events applied per second on an index holding the
// 1 M-pair workload: BlockStored events of 4 blocks and BlockRemoved events
// of one block (as vLLM sends them), in about a 1:4 ratio.
func BenchmarkApply(b *testing.B) {
	g := newFleetGen(2)
	ix := newIndex(b, Config{})
	g.fill(b, ix, benchPairs)
	reps, batches := benchStream(g, 200_000)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		ix.Apply(g.replicas[reps[i]], batches[i])
		if i++; i == len(batches) {
			i = 0
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkApplyParallel is BenchmarkApply with one applying goroutine per
// GOMAXPROCS, each on its own replicas, as the subscribers run.
func BenchmarkApplyParallel(b *testing.B) {
	g := newFleetGen(3)
	ix := newIndex(b, Config{})
	g.fill(b, ix, benchPairs)
	reps, batches := benchStream(g, 200_000)
	// Split the stream by replica so that each goroutine owns whole
	// replicas and keeps their order.
	workers := runtime.GOMAXPROCS(0)
	streams := make([][]int, workers)
	for i, r := range reps {
		streams[r%workers] = append(streams[r%workers], i)
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := int(next.Add(1)-1) % workers
		s := streams[w]
		i := 0
		for pb.Next() {
			k := s[i]
			ix.Apply(g.replicas[reps[k]], batches[k])
			if i++; i == len(s) {
				i = 0
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// matchSetup builds the 16k-token scoring case: the 1 M-pair background, and
// a 1,000-block prompt whose first 64 blocks (its system prompt) are held by
// 32 of the 64 replicas and whose deeper prefix is held to depths from 1,000
// down to 1 by 8 of them.
func matchSetup(b *testing.B) (ix *Index, tokens []uint32, keys []uint64, cands []string) {
	g := newFleetGen(4)
	ix = newIndex(b, Config{})
	g.fill(b, ix, benchPairs)
	tokens = g.randTokens(nil, 1000*benchBlock)
	depth := map[int]int{0: 1000, 1: 900, 2: 750, 3: 500, 4: 250, 5: 100, 6: 10, 7: 1}
	for r := range benchReplicas {
		n := depth[r]
		if n == 0 && r < hotHolders {
			n = 64
		}
		if n == 0 {
			continue
		}
		hs := engineHashes(nil, g.engSeed[r]^0x16c, tokens[:n*benchBlock])
		var evs []kvevents.Event
		var parent *uint64
		for i := 0; i < n; i += benchPerEvent {
			j := min(n, i+benchPerEvent)
			evs = append(evs, &kvevents.BlockStored{
				BlockHashes: hs[i:j], ParentBlockHash: parent,
				TokenIDs: tokens[i*benchBlock : j*benchBlock], BlockSize: benchBlock,
			})
			parent = &hs[j-1]
		}
		ix.Apply(g.replicas[r], kvevents.Batch{Events: evs})
	}
	keys = ix.Keys(tokens, Root{Model: "model"})
	hits := ix.Match(keys, g.replicas, nil)
	for r, h := range hits {
		want := depth[r]
		if want == 0 && r < hotHolders {
			want = 64
		}
		if h.Blocks != want {
			b.Fatalf("replica %d matches %d blocks; want %d", r, h.Blocks, want)
		}
	}
	return ix, tokens, keys, g.replicas
}

// BenchmarkMatch16k reports the time to score a 16k-token prompt (1,000
// blocks, keys precomputed) against 64 replicas.
func BenchmarkMatch16k(b *testing.B) {
	ix, _, keys, cands := matchSetup(b)
	dst := make([]Hit, 0, len(cands))
	b.ReportAllocs()
	for b.Loop() {
		dst = ix.Match(keys, cands, dst)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(keys)), "ns/block")
}

// BenchmarkMatch16kOneHolder is BenchmarkMatch16k with the prompt held by
// one replica only: the cost of the walk itself.
func BenchmarkMatch16kOneHolder(b *testing.B) {
	g := newFleetGen(4)
	ix := newIndex(b, Config{})
	g.fill(b, ix, benchPairs)
	tokens := g.randTokens(nil, 1000*benchBlock)
	hs := engineHashes(nil, 7, tokens)
	ix.Apply(g.replicas[0], kvevents.Batch{Events: []kvevents.Event{&kvevents.BlockStored{BlockHashes: hs, TokenIDs: tokens, BlockSize: benchBlock}}})
	keys := ix.Keys(tokens, Root{Model: "model"})
	dst := make([]Hit, 0, len(g.replicas))
	b.ReportAllocs()
	for b.Loop() {
		dst = ix.Match(keys, g.replicas, dst)
	}
	if dst[0].Blocks != 1000 {
		b.Fatalf("matched %d blocks", dst[0].Blocks)
	}
}

// BenchmarkMatch16kCPU is BenchmarkMatch16k with a CPU tier: the
// replica holding the whole prompt on GPU holds it on CPU too, and eight
// replicas continue their GPU prefix on CPU to the end of the prompt. It
// measures the CPU pass Match adds once any replica offloads.
func BenchmarkMatch16kCPU(b *testing.B) {
	ix, tokens, keys, cands := matchSetup(b)
	for r := range hotHolders {
		hs := engineHashes(nil, uint64(r)^0xc9, tokens)
		ix.Apply(cands[r], kvevents.Batch{Events: []kvevents.Event{
			&kvevents.BlockStored{BlockHashes: hs, TokenIDs: tokens, BlockSize: benchBlock, Medium: kvevents.MediumCPU},
		}})
	}
	dst := make([]Hit, 0, len(cands))
	b.ReportAllocs()
	for b.Loop() {
		dst = ix.Match(keys, cands, dst)
	}
	if h := dst[1]; h.Blocks+h.CPU != 1000 {
		b.Fatalf("replica 1 matches %+v; want 1000 blocks over both tiers", h)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(keys)), "ns/block")
}

// BenchmarkKeys16k reports the time to compute the keys of a 16k-token
// prompt (1,000 blocks of 16 tokens).
func BenchmarkKeys16k(b *testing.B) {
	tokens := newFleetGen(5).randTokens(nil, 1000*benchBlock)
	h := Hasher{}
	root := Root{Model: "model", CacheSalt: "tenant"}
	dst := make([]uint64, 0, 1000)
	b.ReportAllocs()
	b.SetBytes(int64(4 * len(tokens)))
	for b.Loop() {
		dst = h.AppendKeys(dst[:0], tokens, root)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "ns/block")
}

// BenchmarkKeysMatch16k is the request-path total: keys from tokens, then
// Match against 64 replicas.
func BenchmarkKeysMatch16k(b *testing.B) {
	ix, tokens, _, cands := matchSetup(b)
	keys := make([]uint64, 0, 1000)
	dst := make([]Hit, 0, len(cands))
	root := Root{Model: "model"}
	b.ReportAllocs()
	for b.Loop() {
		keys = ix.AppendKeys(keys[:0], tokens, root)
		dst = ix.Match(keys, cands, dst)
	}
}

// BenchmarkMatch16kDuringApply is BenchmarkMatch16k while another goroutine
// applies the event stream as fast as it can: lookups do not wait for
// writers.
func BenchmarkMatch16kDuringApply(b *testing.B) {
	ix, _, keys, cands := matchSetup(b)
	g := newFleetGen(6)
	for _, r := range g.replicas {
		if err := ix.SetReplicaModel(r, "model"); err != nil {
			b.Fatal(err)
		}
	}
	reps, batches := benchStream(g, 100_000)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var applied atomic.Int64
	wg.Go(func() {
		for i := 0; ; i = (i + 1) % len(batches) {
			select {
			case <-stop:
				return
			default:
			}
			ix.Apply(g.replicas[reps[i]], batches[i])
			applied.Add(1)
		}
	})
	dst := make([]Hit, 0, len(cands))
	b.ReportAllocs()
	for b.Loop() {
		dst = ix.Match(keys, cands, dst)
	}
	close(stop)
	wg.Wait()
	b.ReportMetric(float64(applied.Load())/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkApproxKeys64KB reports the time to chunk-hash 64 KB of
// conversation text (about 16k tokens, 256 chunks).
func BenchmarkApproxKeys64KB(b *testing.B) {
	a, err := NewApprox(ApproxConfig{})
	if err != nil {
		b.Fatal(err)
	}
	text := conversation(1, 200)[:64*1024]
	dst := make([]uint64, 0, 256)
	root := Root{Model: "model"}
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		dst = a.AppendKeys(dst[:0], text, root)
	}
}

// BenchmarkApproxMatch reports the time to match 256 chunk keys against 64
// replicas, each remembering 4096 chunks, 8 of which hold the prompt to
// varying depths.
func BenchmarkApproxMatch(b *testing.B) {
	a, err := NewApprox(ApproxConfig{})
	if err != nil {
		b.Fatal(err)
	}
	root := Root{Model: "model"}
	var names []string
	for r := range benchReplicas {
		names = append(names, fmt.Sprintf("r%d", r))
		for c := range 16 {
			a.Record(names[r], a.AppendKeys(nil, conversation(1000*r+c, 40), root))
		}
	}
	text := conversation(7, 200)[:64*1024]
	keys := a.AppendKeys(nil, text, root)
	for r := range 8 {
		a.Record(names[r], keys[:256>>r])
	}
	dst := make([]Hit, 0, len(names))
	b.ReportAllocs()
	for b.Loop() {
		dst = a.Match(keys, names, dst)
	}
}

// BenchmarkSpeculate16k reports the cost of speculating a 16k-token prompt
// (1,000 keys) on one of 64 replicas and of expiring it after the TTL, on
// the 1 M-pair background, with about 100 prompts' entries live at a time
// (2 s of TTL at 50 prompts/s): what the gateway pays per routed long
// prompt, once on the request path (the add) and once later (the expiry).
func BenchmarkSpeculate16k(b *testing.B) {
	g := newFleetGen(5)
	clk := newFakeClock()
	ix := newIndex(b, Config{Now: clk.Now})
	g.fill(b, ix, benchPairs)
	const live, ttl = 100, 2 * time.Second
	prompts := make([][]uint64, 4*live)
	for i := range prompts {
		prompts[i] = ix.Keys(g.randTokens(nil, 1000*benchBlock), Root{Model: "model"})
	}
	step := ttl / live
	b.ReportAllocs()
	i := 0
	var add time.Duration
	for b.Loop() {
		t0 := time.Now()
		ix.AddSpeculative(g.replicas[i%len(g.replicas)], prompts[i%len(prompts)], ttl)
		add += time.Since(t0)
		clk.Advance(step)
		ix.maybeExpire(0)
		i++
	}
	// The request path pays the add; the expiry runs on the event path.
	b.ReportMetric(float64(add.Nanoseconds())/float64(b.N), "add-ns/op")
}

// BenchmarkApproxRecord reports the time to record 256 chunk keys of a new
// conversation on a replica whose LRU (4096 chunks) is full, so each
// record also evicts 256 keys.
func BenchmarkApproxRecord(b *testing.B) {
	a, err := NewApprox(ApproxConfig{Capacity: 4096})
	if err != nil {
		b.Fatal(err)
	}
	root := Root{Model: "model"}
	convs := make([][]uint64, 64)
	for i := range convs {
		convs[i] = a.AppendKeys(nil, conversation(i, 200)[:64*1024], root)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		a.Record("r", convs[i%len(convs)])
		i++
	}
}
