package blockindex

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestKeysGolden pins the key formula: keys must be the same in every
// process and release, or a rolling upgrade would split the index.
func TestKeysGolden(t *testing.T) {
	tokens := make([]uint32, 40)
	for i := range tokens {
		tokens[i] = uint32(i * 7)
	}
	tests := []struct {
		name string
		bs   int
		root Root
		want []uint64
	}{
		{"plain", 16, Root{Model: "m"}, []uint64{0x10ef9240e8e27894, 0x9ee3b2b601d3ab7}},
		{"salted", 16, Root{Model: "m", CacheSalt: "tenant-a"}, []uint64{0x10b0374d283bf60, 0x13f5de286b6ea785}},
		{"block 8", 8, Root{Model: "m", LoRA: "sql"}, []uint64{0xea85bd509c13ec, 0x26af926f9be8b54, 0xbeb8b806c1a1380, 0x1e55f275c8f46834, 0xf29ed57ef08c77b}},
		{"shorter than a block", 300, Root{Model: "m"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Hasher{BlockSize: tt.bs}.AppendKeys(nil, tokens, tt.root)
			if !slices.Equal(got, tt.want) {
				t.Errorf("keys = %#x; want %#x", got, tt.want)
			}
		})
	}
}

// TestSeedFormula checks Root.Seed against the documented formula.
func TestSeedFormula(t *testing.T) {
	for _, r := range []Root{{}, {Model: "m"}, {Model: "m", LoRA: "l", CacheSalt: "s"}} {
		b := []byte("warmpath/blockindex/v1\x00")
		for _, f := range []string{r.Model, r.LoRA, r.CacheSalt} {
			b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
			b = append(b, f...)
		}
		want := xxhash.Sum64(b) & (1<<61 - 1)
		if got := r.Seed(); got != want {
			t.Errorf("%+v.Seed() = %#x; want %#x", r, got, want)
		}
	}
}

func TestKeysDeterministicAndChained(t *testing.T) {
	a := randTokens(1, 64)
	b := randTokens(2, 64)
	shared := randTokens(3, 16)
	h := Hasher{}
	root := Root{Model: "m"}

	if k1, k2 := h.AppendKeys(nil, a, root), h.AppendKeys(nil, a, root); !slices.Equal(k1, k2) {
		t.Fatalf("same input, different keys: %x vs %x", k1, k2)
	}
	// The same block after different prefixes must get different keys.
	ka := h.AppendKeys(nil, concat(a, shared), root)
	kb := h.AppendKeys(nil, concat(b, shared), root)
	if ka[4] == kb[4] {
		t.Errorf("block after different prefixes has the same key %x", ka[4])
	}
	// A shared prefix gives shared keys, then they diverge.
	kc := h.AppendKeys(nil, concat(a[:32], b[32:]), root)
	if !slices.Equal(ka[:2], kc[:2]) || ka[2] == kc[2] {
		t.Errorf("prefix keys %x vs %x: want equal first two, then different", ka[:3], kc[:3])
	}
	// Keys are 61-bit and nonzero.
	for _, k := range ka {
		if k == 0 || k > keyMask {
			t.Errorf("key %#x is not a nonzero 61-bit value", k)
		}
	}
	// Only full blocks get keys.
	if n := len(h.AppendKeys(nil, a[:47], root)); n != 2 {
		t.Errorf("47 tokens gave %d keys; want 2", n)
	}
	// AppendChain continues a chain.
	whole := h.AppendKeys(nil, a, root)
	part := h.AppendKeys(nil, a[:32], root)
	part = h.AppendChain(part, part[1], a[32:])
	if !slices.Equal(whole, part) {
		t.Errorf("AppendChain = %x; want %x", part, whole)
	}
	// Both hashing paths (stack buffer, streamed) follow the documented formula.
	for _, bs := range []int{1, 2, 3, 5, 6, 7, 8, 13, 14, 15, 16, 17, 24, 64, 255, 256, 300} {
		tokens := randTokens(uint64(bs), 2*bs)
		got := Hasher{BlockSize: bs}.AppendKeys(nil, tokens, root)
		k0 := refKey(root.Seed(), tokens[:bs])
		want := []uint64{k0, refKey(k0, tokens[bs:])}
		if !slices.Equal(got, want) {
			t.Errorf("block size %d: keys %x; want %x", bs, got, want)
		}
	}
}

// refKey is the documented block-key formula, spelled out.
func refKey(parent uint64, block []uint32) uint64 {
	var b []byte
	for _, t := range block {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	b = binary.LittleEndian.AppendUint64(b, parent)
	h := xxhash.Sum64(b) & (1<<61 - 1)
	if h == 0 {
		h = 1
	}
	return h
}

func TestKeysRoot(t *testing.T) {
	tokens := randTokens(5, 64)
	base := Root{Model: "m"}
	baseKeys := Hasher{}.AppendKeys(nil, tokens, base)
	tests := []struct {
		name string
		root Root
	}{
		{"other model", Root{Model: "m2"}},
		{"lora", Root{Model: "m", LoRA: "sql"}},
		{"salt", Root{Model: "m", CacheSalt: "tenant-a"}},
		{"other salt", Root{Model: "m", CacheSalt: "tenant-b"}},
		{"fields not confusable", Root{Model: "", LoRA: "m"}},
		{"fields not confusable 2", Root{Model: "m", LoRA: "", CacheSalt: "x"}},
	}
	seen := map[uint64]string{baseKeys[0]: "base"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Hasher{}.AppendKeys(nil, tokens, tt.root)
			for i := range got {
				if got[i] == baseKeys[i] {
					t.Errorf("key %d equals the base root's", i)
				}
			}
			if prev, ok := seen[got[0]]; ok {
				t.Errorf("block 0 key collides with %s", prev)
			}
			seen[got[0]] = tt.name
		})
	}
}

func TestAppendKeysNoAlloc(t *testing.T) {
	tokens := randTokens(6, 16*1000)
	dst := make([]uint64, 0, 1000)
	root := Root{Model: "m", CacheSalt: "s"}
	h := Hasher{}
	if n := testing.AllocsPerRun(20, func() { dst = h.AppendKeys(dst[:0], tokens, root) }); n != 0 {
		t.Errorf("AppendKeys allocates %v times per call; want 0", n)
	}
	ax, err := NewApprox(ApproxConfig{})
	if err != nil {
		t.Fatal(err)
	}
	text := string(make([]byte, 64*1024))
	if n := testing.AllocsPerRun(20, func() { dst = ax.AppendKeys(dst[:0], text, root) }); n != 0 {
		t.Errorf("Approx.AppendKeys allocates %v times per call; want 0", n)
	}
}
