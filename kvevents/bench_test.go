package kvevents

import (
	"syscall"
	"testing"
	"time"
)

// benchBatch is a realistic step: n BlockStored events of one 16-token
// block each (hashes above 2^63, realistic token IDs), as vLLM emits them
// with map events.
func benchBatch(n int) Batch {
	b := Batch{TS: 1789095808.8378847, DPRank: ptr(0), Events: make([]Event, n)}
	for i := range n {
		var parent *uint64
		if i > 0 {
			parent = ptr(uint64(1<<63) + uint64(i) - 1)
		}
		b.Events[i] = &BlockStored{
			BlockHashes:     []uint64{uint64(1<<63) + uint64(i)},
			ParentBlockHash: parent,
			TokenIDs:        tokens(151000+16*i, 16),
			BlockSize:       16,
			Medium:          MediumGPU,
			ExtraKeys:       [][]ExtraKey{nil},
			GroupIdx:        ptr(0),
			KVCacheSpecKind: "full_attention",
		}
	}
	return b
}

func benchPayload(tb testing.TB, f Format, n int) []byte {
	p, err := Encode(benchBatch(n), f)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func BenchmarkDecode(b *testing.B) {
	const events = 32
	for _, f := range []Format{FormatMap, FormatArray} {
		b.Run(f.String(), func(b *testing.B) {
			p := benchPayload(b, f, events)
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := Decode(p); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)*events/b.Elapsed().Seconds(), "events/s")
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	const events = 32
	batch := benchBatch(events)
	for _, f := range []Format{FormatMap, FormatArray} {
		b.Run(f.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Encode(batch, f); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)*events/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// stepBatch is one prefill step of a fresh 16k-token prompt as the
// simulator (like vLLM) publishes it: one single-block BlockRemoved per
// block the step evicted, then one BlockStored of the step's full blocks
// (512 of 16 tokens: max_num_batched_tokens 8,192).
func stepBatch(blocks int) Batch {
	b := Batch{TS: 1789095808.8378847, DPRank: ptr(0)}
	hs := make([]uint64, blocks)
	for i := range hs {
		hs[i] = uint64(1<<63) + uint64(i)*0x9E3779B97F4A7C15>>1
		b.Events = append(b.Events, &BlockRemoved{BlockHashes: []uint64{hs[i] ^ 0xfff}, Medium: MediumGPU, GroupIdx: ptr(0)})
	}
	b.Events = append(b.Events, &BlockStored{
		BlockHashes:     hs,
		ParentBlockHash: ptr(uint64(1<<63) + 7),
		TokenIDs:        tokens(140000, 16*blocks),
		BlockSize:       16,
		Medium:          MediumGPU,
		ExtraKeys:       make([][]ExtraKey, blocks),
		GroupIdx:        ptr(0),
		KVCacheSpecKind: "full_attention",
	})
	return b
}

// BenchmarkDecodeStep decodes stepBatch(512), half the KV events of a
// fresh 16k-token prompt. cpu-ns/op is the process's CPU time per decode,
// garbage collection included.
func BenchmarkDecodeStep(b *testing.B) {
	for _, f := range []Format{FormatMap, FormatArray} {
		b.Run(f.String(), func(b *testing.B) {
			p, err := Encode(stepBatch(512), f)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			for b.Loop() {
				if _, _, err := Decode(p); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
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
