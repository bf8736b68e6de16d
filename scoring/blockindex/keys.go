package blockindex

import (
	"encoding/binary"
	"math/bits"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockSize is the number of tokens per block a Hasher or an Index
// uses when none is configured. It matches vLLM's default --block-size.
const DefaultBlockSize = 16

// MaxBlockSize is the largest block size a Hasher or an Index accepts.
const MaxBlockSize = 1 << 16

const (
	// Keys are 61-bit; in a stored key word, the two bits above the key
	// hold its CLOCK counter (0–3), and the top bit is free for flags
	// elsewhere (auxFlag).
	keyBits    = 61
	keyMask    = uint64(1)<<keyBits - 1
	clockShift = keyBits
	clockMask  = uint64(3) << clockShift
	// clockInsert and clockHit are the counters a stored and a looked-up
	// key get: a key found by lookups survives three passes of the hand, a
	// key only stored survives one.
	clockInsert = uint64(1) << clockShift
	clockHit    = uint64(3) << clockShift

	// seedTag and approxTag separate the precise and the approximate key
	// spaces, and version the key formula: change them when it changes.
	seedTag   = "warmpath/blockindex/v1\x00"
	approxTag = "warmpath/blockindex/approx/v1\x00"
)

// Root identifies the chain a sequence of blocks hangs from. Its fields are
// folded into the chain seed, the value that stands in for the key of the
// block before block 0, so that every key of the chain depends on them.
type Root struct {
	// Model is the base model the replica serves, as registered with
	// Index.SetReplicaModel.
	Model string
	// LoRA is the LoRA adapter name, as vLLM reports it in lora_name
	// (typically the request's model field when it names an adapter); empty
	// for the base model.
	LoRA string
	// CacheSalt is the request's cache_salt; empty when none. vLLM mixes the
	// salt into the hash of block 0 only, and so, through the chain, into
	// every later block; folding it into the seed (block 0's parent input)
	// has the same effect.
	CacheSalt string
}

// Seed returns the chain seed of r: xxh64 over a version tag and the
// length-prefixed Model, LoRA and CacheSalt, reduced to 61 bits as every key
// is. The result is the same in every process.
func (r Root) Seed() uint64 { return r.seed(seedTag) }

func (r Root) seed(tag string) uint64 {
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(tag)
	writeField(&d, r.Model)
	writeField(&d, r.LoRA)
	writeField(&d, r.CacheSalt)
	return finish(d.Sum64())
}

// writeField writes s to d prefixed by its length (4 bytes, little-endian),
// so that ("ab", "c") and ("a", "bc") hash differently.
func writeField(d *xxhash.Digest, s string) {
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(s)))
	_, _ = d.Write(n[:])
	_, _ = d.WriteString(s)
}

// finish reduces a 64-bit hash to a key: 61 bits (the tables keep their
// bookkeeping above) and never 0 (0 marks an empty slot).
func finish(h uint64) uint64 {
	h &= keyMask
	if h == 0 {
		h = 1
	}
	return h
}

// Hasher computes chained block keys over token ids. The keys are the same
// on the event path (from BlockStored.TokenIDs) and on the request path (from
// a prompt's token ids), and in every process: there is no random seed.
//
// The key of block i (tokens[i·B : (i+1)·B], B the block size) is
//
//	key(i) = finish(xxh64(le32(t₀) ‖ … ‖ le32(t_{B−1}) ‖ le64(key(i−1))))
//
// with key(−1) = Root.Seed(), and finish clearing the top bit (and mapping 0
// to 1). Only full blocks get keys, as in vLLM. The zero Hasher uses
// DefaultBlockSize. A Hasher is a value; it is safe for concurrent use.
type Hasher struct {
	// BlockSize is the number of tokens per block; 0 means DefaultBlockSize.
	// Values above MaxBlockSize are treated as MaxBlockSize.
	BlockSize int
}

func (h Hasher) size() int {
	switch {
	case h.BlockSize <= 0:
		return DefaultBlockSize
	case h.BlockSize > MaxBlockSize:
		return MaxBlockSize
	}
	return h.BlockSize
}

// AppendKeys appends to dst the keys of the full blocks of tokens, chained
// from root's seed, and returns the extended slice. It allocates only when
// dst lacks the capacity for len(tokens)/BlockSize more keys.
func (h Hasher) AppendKeys(dst []uint64, tokens []uint32, root Root) []uint64 {
	return h.AppendChain(dst, root.Seed(), tokens)
}

// AppendChain is AppendKeys continuing a chain: parent is a Root.Seed or
// the key of the block before tokens[0]. It lets a caller extend the keys of
// a conversation turn by turn without rehashing the prefix, provided the
// previous turn ended on a block boundary.
func (h Hasher) AppendChain(dst []uint64, parent uint64, tokens []uint32) []uint64 {
	bs := h.size()
	n := len(tokens) / bs
	if n == 0 {
		return dst
	}
	dst = slices.Grow(dst, n)
	for i := range n {
		parent = blockKey(parent, tokens[i*bs:(i+1)*bs])
		dst = append(dst, parent)
	}
	return dst
}

// XXH64 primes.
const (
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
	prime3 uint64 = 1609587929392839161
	prime4 uint64 = 9650029242287828579
	prime5 uint64 = 2870177450012600261
)

func round(acc, input uint64) uint64 {
	acc += input * prime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * prime1
}

func mergeRound(acc, val uint64) uint64 {
	acc ^= round(0, val)
	return acc*prime1 + prime4
}

// blockKey returns finish(xxh64(le32(t₀) ‖ … ‖ le32(t_{n−1}) ‖ le64(parent))):
// XXH64 (seed 0) computed directly on 8-byte lanes assembled from the token
// ids and the parent, so that no byte buffer is filled. It equals
// xxhash.Sum64 over that little-endian serialization on every platform; the
// tests check it against the library.
//
// The parent comes last on purpose: a chain is hashed block after block, and
// with the parent in XXH64's tail (as it is whenever n is a multiple of 8)
// only the tail round and the avalanche wait for the previous block's key,
// while the stripes over this block's tokens run ahead.
func blockKey(parent uint64, t []uint32) uint64 {
	n := len(t)
	m := n + 2 // 32-bit words hashed: the tokens, then the parent's halves
	total := 4 * uint64(m)
	var h uint64
	i := 0 // next word
	if total >= 32 {
		var seed uint64 // XXH64's seed; a variable so that the sums wrap
		v1 := seed + prime1 + prime2
		v2 := seed + prime2
		v3 := seed
		v4 := seed - prime1
		stripes := m / 8
		for ; i+8 <= n; i += 8 {
			s := t[i : i+8]
			v1 = round(v1, uint64(s[0])|uint64(s[1])<<32)
			v2 = round(v2, uint64(s[2])|uint64(s[3])<<32)
			v3 = round(v3, uint64(s[4])|uint64(s[5])<<32)
			v4 = round(v4, uint64(s[6])|uint64(s[7])<<32)
			stripes--
		}
		for ; stripes > 0; stripes-- { // a stripe holding (part of) the parent
			v1 = round(v1, lane(t, parent, i))
			v2 = round(v2, lane(t, parent, i+2))
			v3 = round(v3, lane(t, parent, i+4))
			v4 = round(v4, lane(t, parent, i+6))
			i += 8
		}
		h = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = mergeRound(h, v1)
		h = mergeRound(h, v2)
		h = mergeRound(h, v3)
		h = mergeRound(h, v4)
	} else {
		h = prime5
	}
	h += total
	for ; i+2 <= m; i += 2 {
		h ^= round(0, lane(t, parent, i))
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
	}
	if i < m {
		h ^= word(t, parent, i) * prime1
		h = bits.RotateLeft64(h, 23)*prime2 + prime3
	}
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return finish(h)
}

// word returns 32-bit word i of the serialization t ‖ parent.
func word(t []uint32, parent uint64, i int) uint64 {
	switch n := len(t); {
	case i < n:
		return uint64(t[i])
	case i == n:
		return parent & 0xffffffff
	}
	return parent >> 32
}

// lane returns the 8-byte lane made of words i and i+1.
func lane(t []uint32, parent uint64, i int) uint64 {
	if i+1 < len(t) {
		return uint64(t[i]) | uint64(t[i+1])<<32
	}
	if i == len(t) {
		return parent
	}
	return word(t, parent, i) | word(t, parent, i+1)<<32
}

// blockKey2 is blockKey over the block made of x followed by y, which lets
// the event path complete a partial own block without joining slices. It is
// slower than blockKey and used only when the engine's and the index's block
// boundaries differ.
func blockKey2(parent uint64, x, y []uint32, scratch *[]uint32) uint64 {
	if len(y) == 0 {
		return blockKey(parent, x)
	}
	if len(x) == 0 {
		return blockKey(parent, y)
	}
	s := append(append((*scratch)[:0], x...), y...)
	*scratch = s
	return blockKey(parent, s)
}
