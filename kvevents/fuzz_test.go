package kvevents

import (
	"bytes"
	"math"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzDecode checks that Decode never panics and that every batch it
// returns survives Encode and Decode again, in both layouts. Its seeds (the
// golden fixtures, encoder output of both layouts, hand-built odd shapes)
// run as part of the normal test suite.
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"legacy_array", "map_events", "bytes_hashes", "salted_map"} {
		f.Add(readFixture(f, name+".msgpack"))
	}
	for _, b := range roundTripBatches() {
		for _, fm := range []Format{FormatMap, FormatArray} {
			p, err := Encode(b, fm)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(p)
		}
	}
	f.Add(benchPayload(f, FormatMap, 4))
	// "type" after other fields, and twice: the map decoder rewinds.
	f.Add(mp(f, []any{1.0, []any{
		orderedMap(f, "block_hashes", []any{5}, "medium", "GPU", "type", "BlockRemoved"),
		orderedMap(f, "group_idx", 3, "type", "BlockStored", "block_hashes", []any{6}, "type", "BlockStored", "block_size", 1, "token_ids", []any{1}),
		orderedMap(f, "type", "Unknown", "x", 1),
	}, 1}))
	f.Add(mp(f, map[string]any{"ts": 1, "events": []any{[]any{"AllBlocksCleared"}}, "data_parallel_rank": nil}))
	f.Add(mp(f, []any{1.0, []any{[]any{"BlockStored", []any{[]byte{1, 2, 3}, -1}, 0, []any{1, 2}, 2, nil, "GPU", "l",
		[]any{[]any{"l", []any{"img", 3}, "salt", []byte{1}, 2.5, nil, map[string]any{"type": "mm", "hash": []byte{7}}}}}}, 0}))
	f.Add([]byte{0x93, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff})

	f.Fuzz(func(t *testing.T, payload []byte) {
		b, _, err := Decode(payload)
		if err != nil {
			return
		}
		for _, fm := range []Format{FormatMap, FormatArray} {
			want := b
			if fm == FormatArray {
				want = mapOnlyStripped(b)
			}
			p, err := Encode(b, fm)
			if err != nil {
				t.Fatalf("Encode(%s) of a decoded batch: %v\n%s", fm, err, dump(b))
			}
			got, st, err := Decode(p)
			if err != nil {
				t.Fatalf("Decode(Encode(%s)): %v\nbatch %s\npayload %x", fm, err, dump(b), p)
			}
			if st != (DecodeStats{}) {
				t.Errorf("Decode(Encode(%s)) skipped %+v", fm, st)
			}
			if !batchEqual(got, want) {
				t.Fatalf("Decode(Encode(%s)) =\n%s\nwant\n%s", fm, dump(got), dump(want))
			}
		}
	})
}

// batchEqual is reflect.DeepEqual, except that TS compares bit for bit so
// that NaN equals itself.
func batchEqual(a, b Batch) bool {
	if math.Float64bits(a.TS) != math.Float64bits(b.TS) {
		return false
	}
	a.TS, b.TS = 0, 0
	return reflect.DeepEqual(a, b)
}

// orderedMap encodes a msgpack map of the keys and values kv, alternating,
// in that order (a Go map's order is random).
func orderedMap(tb testing.TB, kv ...any) raw {
	tb.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.EncodeMapLen(len(kv) / 2); err != nil {
		tb.Fatal(err)
	}
	for _, v := range kv {
		if err := enc.Encode(v); err != nil {
			tb.Fatal(err)
		}
	}
	return buf.Bytes()
}
