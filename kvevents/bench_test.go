package kvevents

import (
	"testing"
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
