package blockindex

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/warmpath/warmpath/kvevents"
)

// The fresh 16k-token workload of `warmpath overhead`: four replicas, each
// with a KV cache of ingestResident prompts of 1,000 blocks; every request
// is a new prompt, routed round the replicas at 50 per second. Per request
// the gateway speculates its 1,000 keys, then ingests what the simulator
// publishes for it: two prefill steps of 8,192 tokens (vLLM's default
// max_num_batched_tokens), each a batch of one BlockStored of 512 blocks
// (the sequence's full blocks, as vLLM's cache_full_blocks reports them)
// after one single-block BlockRemoved per block the step evicted (the
// oldest prompt's), all in vLLM's map layout.
const (
	ingestReplicas = 4
	ingestBlocks   = 1000
	ingestStep     = 512 // blocks per prefill step
	ingestResident = 8   // prompts a replica's cache holds
	ingestCycle    = 12  // prompts per replica before the workload repeats
	ingestInterval = 20 * time.Millisecond
	ingestTTL      = 2 * time.Second
)

// ingestRequest is one request of the workload, encoded.
type ingestRequest struct {
	replica  string
	keys     []uint64 // the prompt's keys, as routing computes them
	payloads [][]byte // its KV-event batches, in publication order
}

// ingestWorkload builds ingestReplicas × ingestCycle requests, in the
// order they are sent. Repeating it is consistent: request j evicts the
// blocks of request j − ingestResident of its replica, modulo the cycle.
func ingestWorkload(tb testing.TB, ix *Index, f kvevents.Format) []ingestRequest {
	g := newFleetGen(7)
	type prompt struct {
		tokens []uint32
		hashes []uint64
	}
	prompts := make([][]prompt, ingestReplicas)
	for r := range prompts {
		for range ingestCycle {
			t := g.randTokens(nil, ingestBlocks*benchBlock)
			prompts[r] = append(prompts[r], prompt{t, engineHashes(nil, g.engSeed[r], t)})
		}
	}
	var reqs []ingestRequest
	for j := range ingestCycle {
		for r := range ingestReplicas {
			name := fmt.Sprintf("10.0.0.%d:8000", r)
			if err := ix.SetReplicaModel(name, "model"); err != nil {
				tb.Fatal(err)
			}
			p := prompts[r][j]
			old := prompts[r][(j+ingestCycle-ingestResident)%ingestCycle].hashes
			req := ingestRequest{replica: name, keys: ix.Keys(p.tokens, Root{Model: "model"})}
			for lo := 0; lo < ingestBlocks; lo += ingestStep {
				hi := min(ingestBlocks, lo+ingestStep)
				req.payloads = append(req.payloads, encodeStep(tb, f, p.tokens, p.hashes, old, lo, hi))
			}
			reqs = append(reqs, req)
		}
	}
	return reqs
}

// encodeStep encodes the batch of one prefill step storing blocks [lo, hi)
// of a prompt, after evicting the same blocks of an older one.
func encodeStep(tb testing.TB, f kvevents.Format, tokens []uint32, hashes, evict []uint64, lo, hi int) []byte {
	b := kvevents.Batch{TS: 1789095808.8378847, DPRank: new(0)}
	for _, h := range evict[lo:hi] {
		b.Events = append(b.Events, &kvevents.BlockRemoved{BlockHashes: []uint64{h}, Medium: kvevents.MediumGPU, GroupIdx: new(0)})
	}
	st := &kvevents.BlockStored{
		BlockHashes:     hashes[lo:hi],
		TokenIDs:        tokens[lo*benchBlock : hi*benchBlock],
		BlockSize:       benchBlock,
		Medium:          kvevents.MediumGPU,
		ExtraKeys:       make([][]kvevents.ExtraKey, hi-lo),
		GroupIdx:        new(0),
		KVCacheSpecKind: "full_attention",
		SessionID:       "",
	}
	if lo > 0 {
		st.ParentBlockHash = new(hashes[lo-1])
	}
	b.Events = append(b.Events, st)
	p, err := kvevents.Encode(b, f)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// ingest runs one request's KV work: the speculative add routing makes,
// then decoding and applying each of its batches.
func ingest(tb testing.TB, ix *Index, clk *fakeClock, req ingestRequest) {
	ix.AddSpeculative(req.replica, req.keys, ingestTTL)
	for _, p := range req.payloads {
		b, _, err := kvevents.Decode(p)
		if err != nil {
			tb.Fatal(err)
		}
		ix.Apply(req.replica, b)
	}
	clk.Advance(ingestInterval)
}

// cpuTime is the process's user and system CPU time (the garbage
// collector's included), steadier than wall time on a shared machine.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIngest16kFresh reports the KV-event work the gateway does per
// fresh 16k-token request of the overhead workload (see ingestWorkload):
// speculating its keys, decoding its batches, applying their stores and
// evictions, and expiring the speculation (by Apply, past the TTL and the
// gateway's match grace). cpu-ns/op is the process's CPU time per request,
// garbage collection included; decode-ns/op is the decoding alone.
func BenchmarkIngest16kFresh(b *testing.B) {
	clk := newFakeClock()
	ix := newIndex(b, Config{Now: clk.Now, MatchGrace: 250 * time.Millisecond})
	reqs := ingestWorkload(b, ix, kvevents.FormatMap)
	for range 2 {
		for _, req := range reqs {
			ingest(b, ix, clk, req)
		}
	}
	if st := ix.Stats(); st.Entries > int64(ingestReplicas*(ingestResident+ingestTTL/ingestInterval/ingestReplicas+1)*ingestBlocks) {
		b.Fatalf("workload not in steady state: %d entries", st.Entries)
	}
	b.ReportAllocs()
	i := 0
	cpu0 := cpuTime(b)
	for b.Loop() {
		ingest(b, ix, clk, reqs[i])
		if i++; i == len(reqs) {
			i = 0
		}
	}
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
	b.StopTimer()
	var dec time.Duration
	const n = 20
	for k := range n {
		t0 := time.Now()
		for _, p := range reqs[k].payloads {
			if _, _, err := kvevents.Decode(p); err != nil {
				b.Fatal(err)
			}
		}
		dec += time.Since(t0)
	}
	b.ReportMetric(float64(dec.Nanoseconds())/n, "decode-ns/op")
}
