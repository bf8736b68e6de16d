package kvevents

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func ptr[T any](v T) *T { return &v }

// mp encodes v with the msgpack library's defaults, for hand-built inputs.
func mp(t testing.TB, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// raw is a pre-encoded msgpack value inside mp's input.
type raw []byte

var _ msgpack.CustomEncoder = raw(nil)

func (r raw) EncodeMsgpack(e *msgpack.Encoder) error {
	_, err := e.Writer().Write(r)
	return err
}

func tokens(first, n int) []uint32 {
	ts := make([]uint32, n)
	for i := range ts {
		ts[i] = uint32(first + i)
	}
	return ts
}

func TestDecodeShapes(t *testing.T) {
	big := uint64(15760518052499183552)
	tests := []struct {
		name      string
		in        []byte
		want      Batch
		wantStats DecodeStats
	}{
		{
			name: "map batch, int ts, nil rank",
			in: mp(t, map[string]any{"ts": 7, "events": []any{[]any{"AllBlocksCleared"}},
				"data_parallel_rank": nil}),
			want: Batch{TS: 7, Events: []Event{&AllBlocksCleared{}}},
		},
		{
			name: "map batch with unknown key",
			in:   mp(t, map[string]any{"ts": 1.5, "events": []any{}, "extra": "x"}),
			want: Batch{TS: 1.5}, wantStats: DecodeStats{UnknownKeys: 1},
		},
		{
			name: "two-element batch",
			in:   mp(t, []any{2.5, []any{}}),
			want: Batch{TS: 2.5},
		},
		{
			name: "four-element batch",
			in:   mp(t, []any{2.5, nil, 1, "future"}),
			want: Batch{TS: 2.5, DPRank: ptr(1)}, wantStats: DecodeStats{UnknownKeys: 1},
		},
		{
			name: "float32 ts",
			in:   mp(t, []any{float32(0.5), []any{}, 0}),
			want: Batch{TS: 0.5, DPRank: ptr(0)},
		},
		{
			name: "hash widths, negative and bytes",
			in: mp(t, []any{1.0, []any{
				[]any{"BlockRemoved", []any{int8(-1), int16(300), int32(-2), uint64(big), int64(-9),
					[]byte{1, 2}, bytes.Repeat([]byte{0xff}, 4), append(bytes.Repeat([]byte{9}, 24), 0, 0, 0, 0, 0, 0, 0, 42)}, nil},
			}, 0}),
			want: Batch{TS: 1, DPRank: ptr(0), Events: []Event{&BlockRemoved{BlockHashes: []uint64{
				math.MaxUint64, 300, math.MaxUint64 - 1, big, math.MaxUint64 - 8, 0x0102, 0xffffffff, 42,
			}}}},
		},
		{
			name: "array event with trailing fields and unknown positions",
			in: mp(t, []any{1.0, []any{
				[]any{"BlockStored", []any{uint64(big)}, int64(-5), []any{1, 300, 70000}, 3, 7, "CPU", "ad",
					nil, 2, "sliding_window", 128, "future"},
				[]any{"BlockRemoved", []any{1}, nil, 3, "future"},
				[]any{"AllBlocksCleared", "future"},
			}, 0}),
			want: Batch{TS: 1, DPRank: ptr(0), Events: []Event{
				&BlockStored{BlockHashes: []uint64{big}, ParentBlockHash: ptr(uint64(math.MaxUint64 - 4)),
					TokenIDs: []uint32{1, 300, 70000}, BlockSize: 3, LoRAID: ptr(int64(7)), Medium: "CPU", LoRAName: "ad",
					GroupIdx: ptr(2), KVCacheSpecKind: "sliding_window", KVCacheSpecSlidingWindow: ptr(128)},
				&BlockRemoved{BlockHashes: []uint64{1}, GroupIdx: ptr(3)},
				&AllBlocksCleared{},
			}},
			wantStats: DecodeStats{UnknownKeys: 3},
		},
		{
			name: "short legacy array keeps zero values",
			in:   mp(t, []any{1.0, []any{[]any{"BlockStored", []any{5}}}, 0}),
			want: Batch{TS: 1, DPRank: ptr(0), Events: []Event{&BlockStored{BlockHashes: []uint64{5}}}},
		},
		{
			name: "zero parent is a hash",
			in:   mp(t, []any{1.0, []any{[]any{"BlockStored", []any{5}, 0, []any{}, 16, nil, "GPU", nil}}, 0}),
			want: Batch{TS: 1, DPRank: ptr(0), Events: []Event{&BlockStored{BlockHashes: []uint64{5},
				ParentBlockHash: ptr(uint64(0)), BlockSize: 16, Medium: "GPU"}}},
		},
		{
			name: "map event, type last, unknown keys, main fields",
			in: mp(t, []any{1.0, []any{
				raw(mapOrdered(t, "block_hashes", []any{9}, "event_version", 2, "locality", "REMOTE", "ownership", "CPU",
					"session_id", "s1", "new_field", []any{1, 2}, "type", "BlockStored")),
				raw(mapOrdered(t, "type", "BlockRemoved", "block_hashes", []any{9}, "medium", "GPU",
					"locality", "LOCAL", "ownership", "GPU", "what", 1)),
				raw(mapOrdered(t, "type", "BlockInactive", "block_hashes", []any{9})),
				raw(mapOrdered(t, "block_hashes", []any{9})),
				raw(mapOrdered(t, "type", "AllBlocksCleared", "why", "reset")),
			}, 0}),
			want: Batch{TS: 1, DPRank: ptr(0), Events: []Event{
				&BlockStored{BlockHashes: []uint64{9}, EventVersion: 2, Locality: "REMOTE", Ownership: "CPU", SessionID: "s1"},
				&BlockRemoved{BlockHashes: []uint64{9}, Medium: "GPU", Locality: "LOCAL", Ownership: "GPU"},
				&AllBlocksCleared{},
			}},
			wantStats: DecodeStats{UnknownEvents: 2, UnknownKeys: 3},
		},
		{
			name: "raw extra keys",
			in: mp(t, []any{1.0, []any{
				[]any{"BlockStored", []any{1, 2, 3}, nil, []any{}, 16, nil, "GPU", "my-lora", []any{
					[]any{"my-lora", []any{"img0", -3}, "salt-1", []byte{0xab, 0xcd}},
					[]any{"my-lora", "odd", 42, []any{"x", "y"}},
					nil,
				}},
			}, 0}),
			want: Batch{TS: 1, DPRank: ptr(0), Events: []Event{&BlockStored{
				BlockHashes: []uint64{1, 2, 3}, BlockSize: 16, Medium: "GPU", LoRAName: "my-lora", CacheSalt: "salt-1",
				ExtraKeys: [][]ExtraKey{
					{{Kind: ExtraLoRA, Value: "my-lora"}, {Kind: ExtraMultimodal, Value: "img0", Offset: -3},
						{Kind: ExtraCacheSalt, Value: "salt-1"}, {Kind: ExtraPromptEmbeds, Value: "abcd"}},
					{{Kind: ExtraLoRA, Value: "my-lora"}, {Kind: ExtraLegacy, Value: "odd"}, {Kind: ExtraLegacy, Value: "42"},
						{Kind: ExtraLegacy, Value: `["x", "y"]`}},
					nil,
				},
			}}},
		},
		{
			name: "raw string with a parent is no salt",
			in: mp(t, []any{1.0, []any{
				[]any{"BlockStored", []any{1}, 7, []any{}, 16, nil, "GPU", nil, []any{[]any{"s"}}},
			}, 0}),
			want: Batch{TS: 1, DPRank: ptr(0), Events: []Event{&BlockStored{
				BlockHashes: []uint64{1}, ParentBlockHash: ptr(uint64(7)), BlockSize: 16, Medium: "GPU",
				ExtraKeys: [][]ExtraKey{{{Kind: ExtraLegacy, Value: "s"}}},
			}}},
		},
		{
			name: "typed extra keys",
			in: mp(t, []any{1.0, []any{
				raw(mapOrdered(t, "type", "BlockStored", "block_hashes", []any{1, 2}, "parent_block_hash", nil,
					"event_version", 2, "extra_keys", []any{
						[]any{
							map[string]any{"type": "lora", "name": "ad"},
							raw(mapOrdered(t, "type", "mm", "modality", "image", "hash", "h1", "block_offset", 4)),
							map[string]any{"type": "cache_salt", "salt": "s"},
							map[string]any{"type": "prompt_embeds", "hash": []byte{1, 255}},
							map[string]any{"type": "legacy", "value": []any{"a", 1}},
						},
						[]any{raw(mapOrdered(t, "type", "martian", "x", 1)), raw(mapOrdered(t, "type", "lora", "name", "ad", "v", 2))},
					})),
			}, 0}),
			want: Batch{TS: 1, DPRank: ptr(0), Events: []Event{&BlockStored{
				BlockHashes: []uint64{1, 2}, EventVersion: 2, LoRAName: "ad", CacheSalt: "s",
				ExtraKeys: [][]ExtraKey{
					{{Kind: ExtraLoRA, Value: "ad"}, {Kind: ExtraMultimodal, Modality: "image", Value: "h1", Offset: 4},
						{Kind: ExtraCacheSalt, Value: "s"}, {Kind: ExtraPromptEmbeds, Value: "01ff"},
						{Kind: ExtraLegacy, Value: `["a", 1]`}},
					{{Kind: ExtraLegacy, Value: `{"type": "martian", "x": 1}`}, {Kind: ExtraLoRA, Value: "ad"}},
				},
			}}},
			wantStats: DecodeStats{UnknownKeys: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, st, err := Decode(tt.in)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Decode =\n%s\nwant\n%s", dump(got), dump(tt.want))
			}
			if st != tt.wantStats {
				t.Errorf("stats = %+v; want %+v", st, tt.wantStats)
			}
		})
	}
}

// mapOrdered encodes a map with keys in the given order (Go maps have none).
func mapOrdered(t testing.TB, kv ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.EncodeMapLen(len(kv) / 2); err != nil {
		t.Fatal(err)
	}
	for _, v := range kv {
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func dump(b Batch) string {
	var sb strings.Builder
	sb.WriteString("ts=")
	sb.WriteString(ptrStr(&b.TS))
	sb.WriteString(" dp=")
	sb.WriteString(ptrStr(b.DPRank))
	for _, ev := range b.Events {
		sb.WriteString("\n  ")
		sb.WriteString(ev.Type())
		sb.WriteString(" ")
		sb.WriteString(ptrStr(&ev))
	}
	return sb.String()
}

func TestDecodeErrors(t *testing.T) {
	good := mp(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1, 2}, 16, nil, "GPU", nil}}, 0})
	deep := bytes.Repeat([]byte{0x91}, 100)
	deep = append(deep, 0xc0)
	tests := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"not a container", mp(t, 5)},
		{"truncated", good[:len(good)-3]},
		{"trailing garbage", append(append([]byte{}, good...), 0xc0)},
		{"one-element batch", mp(t, []any{1.0})},
		{"ts string", mp(t, []any{"now", []any{}, 0})},
		{"events not array", mp(t, []any{1.0, "x", 0})},
		{"event not container", mp(t, []any{1.0, []any{5}, 0})},
		{"empty event array", mp(t, []any{1.0, []any{[]any{}}, 0})},
		{"tag not string", mp(t, []any{1.0, []any{[]any{5}}, 0})},
		{"map event type not string", mp(t, []any{1.0, []any{map[string]any{"type": 5}}, 0})},
		{"map event non-string key", mp(t, []any{1.0, []any{map[int]any{1: 2}}, 0})},
		{"dp rank string", mp(t, []any{1.0, []any{}, "0"})},
		{"dp rank too big", mp(t, []any{1.0, []any{}, uint64(math.MaxUint64)})},
		{"hash string", mp(t, []any{1.0, []any{[]any{"BlockRemoved", []any{"x"}}}, 0})},
		{"hash float", mp(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1.5}}}, 0})},
		{"hashes not array", mp(t, []any{1.0, []any{[]any{"BlockRemoved", 5}}, 0})},
		{"negative token", mp(t, []any{1.0, []any{[]any{"BlockStored", []any{}, nil, []any{-1}}}, 0})},
		{"token above uint32", mp(t, []any{1.0, []any{[]any{"BlockStored", []any{}, nil, []any{1 << 32}}}, 0})},
		{"token string", mp(t, []any{1.0, []any{[]any{"BlockStored", []any{}, nil, []any{"a"}}}, 0})},
		{"block size string", mp(t, []any{1.0, []any{[]any{"BlockStored", []any{}, nil, []any{}, "16"}}, 0})},
		{"lora id too big", mp(t, []any{1.0, []any{[]any{"BlockStored", []any{}, nil, []any{}, 16, uint64(1 << 63)}}, 0})},
		{"medium int", mp(t, []any{1.0, []any{[]any{"BlockRemoved", []any{}, 5}}, 0})},
		{"extra keys not array", mp(t, []any{1.0, []any{[]any{"BlockStored", []any{}, nil, []any{}, 16, nil, nil, nil, 5}}, 0})},
		{"typed lora name int", mp(t, []any{1.0, []any{[]any{"BlockStored", []any{}, nil, []any{}, 16, nil, nil, nil,
			[]any{[]any{map[string]any{"type": "lora", "name": 5}}}}}, 0})},
		{"huge array32", []byte{0x93, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff}},
		{"huge map32", []byte{0xdf, 0xff, 0xff, 0xff, 0xff}},
		{"huge str32 key", []byte{0x81, 0xdb, 0xff, 0xff, 0xff, 0xff}},
		{"huge bin32 hash", []byte{0x93, 0x00, 0x91, 0x92, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0x91, 0xc6, 0x7f, 0xff, 0xff, 0xff}},
		{"huge ext in unknown key", []byte{0x81, 0xa1, 'x', 0xc9, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"deep nesting", append([]byte{0x93, 0x00, 0x91, 0x92, 0xa3, 'X', 'y', 'z'}, deep...)},
		{"invalid code", []byte{0x93, 0x00, 0x90, 0xc1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _, err := Decode(tt.in)
			if err == nil {
				t.Fatalf("Decode succeeded: %s", dump(b))
			}
			if !strings.HasPrefix(err.Error(), "kvevents: decode: ") {
				t.Errorf("error %q lacks the kvevents: decode: prefix", err)
			}
		})
	}
}

// roundTripBatches are hand-built batches whose CacheSalt and LoRAName
// agree with their ExtraKeys, as Decode would produce them.
func roundTripBatches() map[string]Batch {
	big := uint64(1<<63 + 12345)
	return map[string]Batch{
		"empty": {TS: 1789095808.25},
		"plain stored": {TS: 1789095808.8378847, DPRank: ptr(0), Events: []Event{
			&BlockStored{BlockHashes: []uint64{big, math.MaxUint64}, TokenIDs: tokens(151644, 32), BlockSize: 16, Medium: MediumGPU},
		}},
		"parent, lora, group, spec": {TS: 2, DPRank: ptr(3), Events: []Event{
			&BlockStored{BlockHashes: []uint64{1 << 63}, ParentBlockHash: ptr(uint64(math.MaxUint64)), TokenIDs: tokens(0, 16),
				BlockSize: 16, LoRAID: ptr(int64(-2)), Medium: MediumCPU, LoRAName: "adapter",
				ExtraKeys: [][]ExtraKey{{{Kind: ExtraLoRA, Value: "adapter"}}},
				GroupIdx:  ptr(1), KVCacheSpecKind: "sliding_window", KVCacheSpecSlidingWindow: ptr(4096)},
		}},
		"salted with lora and mm": {TS: 3, DPRank: ptr(0), Events: []Event{
			&BlockStored{BlockHashes: []uint64{7, 8}, TokenIDs: tokens(5, 32), BlockSize: 16, Medium: MediumGPU,
				LoRAName: "l", CacheSalt: "tenant-a", GroupIdx: ptr(0), KVCacheSpecKind: "full_attention",
				ExtraKeys: [][]ExtraKey{
					{{Kind: ExtraLoRA, Value: "l"}, {Kind: ExtraMultimodal, Value: "img", Offset: 3},
						{Kind: ExtraCacheSalt, Value: "tenant-a"}, {Kind: ExtraPromptEmbeds, Value: "00ff10"}},
					{{Kind: ExtraLoRA, Value: "l"}},
				}},
		}},
		"typed keys (event version 2)": {TS: 4, Events: []Event{
			&BlockStored{BlockHashes: []uint64{9}, TokenIDs: tokens(0, 16), BlockSize: 16, Medium: MediumGPU,
				CacheSalt: "s", EventVersion: 2,
				ExtraKeys: [][]ExtraKey{{{Kind: ExtraCacheSalt, Value: "s"},
					{Kind: ExtraMultimodal, Modality: "audio", Value: "a1", Offset: 0},
					{Kind: ExtraLegacy, Value: "x"}, {Kind: ExtraPromptEmbeds, Value: "not hex"}}}},
		}},
		"typed keys raw cannot carry": {TS: 4, Events: []Event{
			&BlockStored{BlockHashes: []uint64{9}, ParentBlockHash: ptr(uint64(1)), BlockSize: 16,
				ExtraKeys: [][]ExtraKey{{{Kind: ExtraCacheSalt, Value: "late-salt"},
					{Kind: ExtraMultimodal, Modality: "image", Value: "i", Offset: 2}}, {}, nil},
				CacheSalt: "late-salt"},
		}},
		"session and locality": {TS: 5, DPRank: ptr(1), Events: []Event{
			&BlockStored{BlockHashes: []uint64{1}, TokenIDs: tokens(1, 16), BlockSize: 16, Medium: MediumGPU,
				ExtraKeys: [][]ExtraKey{nil}, SessionID: "sess-7", Locality: "LOCAL", Ownership: "GPU"},
			&BlockRemoved{BlockHashes: []uint64{1}, Medium: MediumGPU, GroupIdx: ptr(0), Locality: "REMOTE", Ownership: "CPU"},
			&AllBlocksCleared{},
		}},
		"removed only": {TS: 6, DPRank: ptr(0), Events: []Event{
			&BlockRemoved{BlockHashes: []uint64{big}, Medium: MediumStorage},
			&BlockRemoved{BlockHashes: []uint64{3}},
		}},
		"a prefill step": stepBatch(40),
		"slabs outgrown": mixedBatch(),
	}
}

// mixedBatch interleaves events so that the decoder's arena replaces its
// slabs mid-batch: a stored event of many hashes among removals of up to
// smallHashes + 1, and group indexes on some events only.
func mixedBatch() Batch {
	b := Batch{TS: 7, DPRank: ptr(2)}
	for i := range 30 {
		hs := make([]uint64, 1+i%(smallHashes+1))
		for j := range hs {
			hs[j] = uint64(1000*i + j + 1)
		}
		var g *int
		if i%3 == 0 {
			g = ptr(i)
		}
		if i%7 == 3 {
			b.Events = append(b.Events, &BlockStored{BlockHashes: hs, TokenIDs: tokens(i, 16*len(hs)), BlockSize: 16,
				Medium: "STORAGE", GroupIdx: g, KVCacheSpecSlidingWindow: ptr(128 + i), KVCacheSpecKind: "sliding_window"})
			continue
		}
		b.Events = append(b.Events, &BlockRemoved{BlockHashes: hs, Medium: MediumCPU, GroupIdx: g, Locality: "LOCAL"})
	}
	return b
}

// Decoded events share the arena's slabs, but no value aliases another:
// growing one event's hashes or changing its group leaves the others.
func TestDecodeArenaDoesNotAlias(t *testing.T) {
	p, err := Encode(mixedBatch(), FormatMap)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range got.Events {
		switch e := ev.(type) {
		case *BlockRemoved:
			e.BlockHashes = append(e.BlockHashes, 0)
			if e.GroupIdx != nil {
				*e.GroupIdx = -1
			}
		case *BlockStored:
			e.BlockHashes = append(e.BlockHashes, 0)
			*e.KVCacheSpecSlidingWindow = -1
			if e.GroupIdx != nil {
				*e.GroupIdx = -1
			}
		}
		got.Events[i] = nil
		again, _, err := Decode(p)
		if err != nil {
			t.Fatal(err)
		}
		want := again.Events[i+1:]
		if !reflect.DeepEqual(got.Events[i+1:], want) {
			t.Fatalf("changing event %d changed the events after it", i)
		}
	}
	if *got.DPRank != 2 {
		t.Errorf("DPRank = %d after changing the events; want 2", *got.DPRank)
	}
}

// mapOnlyStripped returns b without the fields FormatArray cannot carry.
func mapOnlyStripped(b Batch) Batch {
	out := b
	out.Events = make([]Event, len(b.Events))
	for i, ev := range b.Events {
		switch e := ev.(type) {
		case *BlockStored:
			c := *e
			c.EventVersion, c.SessionID, c.Locality, c.Ownership = 0, "", "", ""
			out.Events[i] = &c
		case *BlockRemoved:
			c := *e
			c.Locality, c.Ownership = "", ""
			out.Events[i] = &c
		default:
			out.Events[i] = ev
		}
	}
	if len(out.Events) == 0 {
		out.Events = nil
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	for name, b := range roundTripBatches() {
		for _, f := range []Format{FormatMap, FormatArray} {
			t.Run(name+"/"+f.String(), func(t *testing.T) {
				want := b
				if f == FormatArray {
					want = mapOnlyStripped(b)
				}
				p, err := Encode(b, f)
				if err != nil {
					t.Fatalf("Encode: %v", err)
				}
				got, st, err := Decode(p)
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if st != (DecodeStats{}) {
					t.Errorf("stats = %+v; want zero", st)
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("Decode(Encode(b)) =\n%s\nwant\n%s", dump(got), dump(want))
				}
			})
		}
	}
}

func TestEncodeSaltSynthesis(t *testing.T) {
	b := Batch{TS: 1, Events: []Event{&BlockStored{BlockHashes: []uint64{1, 2}, BlockSize: 16, CacheSalt: "t"}}}
	p, err := Encode(b, FormatMap)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	e := got.Events[0].(*BlockStored)
	want := [][]ExtraKey{{{Kind: ExtraCacheSalt, Value: "t"}}, nil}
	if e.CacheSalt != "t" || !reflect.DeepEqual(e.ExtraKeys, want) {
		t.Errorf("got salt %q keys %#v; want t, %#v", e.CacheSalt, e.ExtraKeys, want)
	}
	if b.Events[0].(*BlockStored).ExtraKeys != nil {
		t.Error("Encode modified its input")
	}
}

func TestEncodeErrors(t *testing.T) {
	tests := []struct {
		name string
		b    Batch
		f    Format
	}{
		{"bad format", Batch{}, Format(7)},
		{"nil event", Batch{Events: []Event{nil}}, FormatMap},
		{"nil stored", Batch{Events: []Event{(*BlockStored)(nil)}}, FormatMap},
		{"foreign event", Batch{Events: []Event{fakeEvent{}}}, FormatArray},
		{"unknown extra kind", Batch{Events: []Event{&BlockStored{ExtraKeys: [][]ExtraKey{{{Kind: "x"}}}}}}, FormatMap},
		{"salt disagrees", Batch{Events: []Event{&BlockStored{CacheSalt: "a",
			ExtraKeys: [][]ExtraKey{{{Kind: ExtraCacheSalt, Value: "b"}}}}}}, FormatMap},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Encode(tt.b, tt.f); err == nil {
				t.Error("Encode succeeded")
			}
		})
	}
}

type fakeEvent struct{}

func (fakeEvent) Type() string { return "Fake" }

func TestTopic(t *testing.T) {
	tests := []struct{ topic, replica, model string }{
		{"kv@10.0.0.7:8000@qwen3-32b", "10.0.0.7:8000", "qwen3-32b"},
		{"kv@pod@", "pod", ""},
		{"", "", ""},
		{"plain", "plain", ""},
		{"a@b", "a@b", ""},
		{"kv@a@b@c", "kv@a@b@c", ""},
		{"x@pod@m", "pod", "m"},
	}
	for _, tt := range tests {
		r, m := ParseTopic(tt.topic)
		if r != tt.replica || m != tt.model {
			t.Errorf("ParseTopic(%q) = %q, %q; want %q, %q", tt.topic, r, m, tt.replica, tt.model)
		}
	}
	if r, m := ParseTopic(Topic("10.0.0.7:8000", "m")); r != "10.0.0.7:8000" || m != "m" {
		t.Errorf("ParseTopic(Topic(...)) = %q, %q", r, m)
	}
}

func TestParseSeq(t *testing.T) {
	if _, err := ParseSeq([]byte{1, 2, 3}); err == nil {
		t.Error("ParseSeq accepted 3 bytes")
	}
	if got, err := ParseSeq(seqFrame(EndSeq)); err != nil || got != EndSeq {
		t.Errorf("ParseSeq(seqFrame(EndSeq)) = %d, %v", got, err)
	}
}

func TestOffsetEndpoint(t *testing.T) {
	tests := []struct {
		ep   string
		rank int
		want string
	}{
		{"tcp://10.0.0.7:5558", 0, "tcp://10.0.0.7:5558"},
		{"tcp://10.0.0.7:5558", 2, "tcp://10.0.0.7:5560"},
		{"tcp://*:5557", 1, "tcp://*:5558"},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558"},
		{"inproc://kv", 3, "inproc://kv_dp3"},
		{"ipc:///tmp/kv", 1, "ipc:///tmp/kv"},
		{"tcp://host", 1, "tcp://host"},
	}
	for _, tt := range tests {
		if got := OffsetEndpoint(tt.ep, tt.rank); got != tt.want {
			t.Errorf("OffsetEndpoint(%q, %d) = %q; want %q", tt.ep, tt.rank, got, tt.want)
		}
	}
}

func TestBindsEndpoint(t *testing.T) {
	for ep, want := range map[string]bool{
		"tcp://*:5557": true, "tcp://[::]:5557": true, "ipc:///tmp/x": true, "inproc://x": true,
		"tcp://127.0.0.1:5557": false, "tcp://gateway:5557": false,
	} {
		if got := bindsEndpoint(ep); got != want {
			t.Errorf("bindsEndpoint(%q) = %v; want %v", ep, got, want)
		}
	}
}

func TestParseReplayReply(t *testing.T) {
	s5 := seqFrame(5)
	end := seqFrame(EndSeq)
	tests := []struct {
		name      string
		frames    [][]byte
		seq       uint64
		end, ok   bool
		wantBytes string
	}{
		{"legacy", [][]byte{{}, s5, []byte("p")}, 5, false, true, "p"},
		{"with topic", [][]byte{{}, []byte("kv@a@b"), s5, []byte("p")}, 5, false, true, "p"},
		{"no delimiter", [][]byte{s5, []byte("p")}, 5, false, true, "p"},
		{"legacy end", [][]byte{{}, end, {}}, EndSeq, true, true, ""},
		{"topic end", [][]byte{{}, {}, end, {}}, EndSeq, true, true, ""},
		{"end by empty payload", [][]byte{{}, s5, {}}, 5, true, true, ""},
		{"end seq with payload", [][]byte{{}, end, []byte("x")}, EndSeq, true, true, ""},
		{"short seq, empty payload", [][]byte{{}, {1}, {}}, 0, true, true, ""},
		{"short seq", [][]byte{{}, {1}, []byte("p")}, 0, false, false, ""},
		{"one frame", [][]byte{{}, []byte("p")}, 0, false, false, ""},
		{"too many", [][]byte{{}, {}, {}, s5, []byte("p")}, 0, false, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seq, p, end, ok := parseReplayReply(tt.frames)
			if ok != tt.ok || end != tt.end || (ok && !end && seq != tt.seq) || string(p) != tt.wantBytes {
				t.Errorf("parseReplayReply = %d, %q, end %v, ok %v; want %d, %q, %v, %v",
					seq, p, end, ok, tt.seq, tt.wantBytes, tt.end, tt.ok)
			}
		})
	}
}

func TestCheckPortLayout(t *testing.T) {
	for _, tt := range []struct {
		events, replay string
		size           int
		want           string // substring of the error; "" for none
	}{
		{"tcp://*:5557", "tcp://*:5558", 1, ""},
		{"tcp://*:5557", "tcp://*:5558", 2, "rank 1's events port 5558 is rank 0's replay port"},
		{"tcp://*:5558", "tcp://*:5557", 2, "rank 0's events port 5558 is rank 1's replay port"},
		{"tcp://*:5557", "tcp://0.0.0.0:5560", 4, "rank 3's events port 5560 is rank 0's replay port"},
		{"tcp://*:5557", "tcp://*:5561", 4, ""},
		{"tcp://*:5557", "tcp://*:5557", 1, "rank 0's events port 5557 is rank 0's replay port"},
		{"tcp://10.0.0.1:5557", "tcp://10.0.0.2:5558", 2, ""},
		{"tcp://10.0.0.1:5557", "tcp://*:5558", 2, "overlap"},
		{"tcp://*:5557", "", 8, ""},
		{"ipc:///tmp/kv", "ipc:///tmp/kv-replay", 4, ""},
		{"tcp://*:65535", "", 2, "past 65535"},
		{"tcp://*:5557", "tcp://*:65535", 2, "past 65535"},
		{"tcp://*:5557", "tcp://*:5567", 0, "size 0"},
	} {
		err := CheckPortLayout(tt.events, tt.replay, tt.size)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("CheckPortLayout(%s, %s, %d) = %v; want nil", tt.events, tt.replay, tt.size, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("CheckPortLayout(%s, %s, %d) = %v; want an error containing %q", tt.events, tt.replay, tt.size, err, tt.want)
		}
	}
}
