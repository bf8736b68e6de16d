package misses

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// fingerprintVersion is the first byte of an encoded Fingerprint.
const fingerprintVersion = 1

// errCorrupt is returned for bytes that are not an encoded Fingerprint.
var errCorrupt = errors.New("misses: corrupt fingerprint")

// MarshalBinary encodes the fingerprint compactly (about its Size), for a
// store the gateway processes share.
func (f *Fingerprint) MarshalBinary() ([]byte, error) {
	b := make([]byte, 0, f.Size())
	b = append(b, fingerprintVersion)
	for _, v := range [...]int{f.GranuleBytes, f.Bytes, f.BlockTokens, f.Tokens, len(f.Parts)} {
		if v < 0 {
			return nil, fmt.Errorf("misses: negative field %d in fingerprint", v)
		}
		b = binary.AppendUvarint(b, uint64(v))
	}
	for _, p := range f.Parts {
		b = append(b, byte(p.Part))
		b = binary.AppendVarint(b, int64(p.Index))
		b = binary.AppendUvarint(b, uint64(len(p.Role)))
		b = append(b, p.Role...)
		b = binary.AppendUvarint(b, uint64(max(0, p.Len)))
		b = binary.LittleEndian.AppendUint64(b, p.Hash)
	}
	b = binary.AppendUvarint(b, uint64(len(f.Tools)))
	for _, h := range f.Tools {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	b = binary.AppendUvarint(b, uint64(len(f.Granules)))
	for _, h := range f.Granules {
		b = binary.LittleEndian.AppendUint32(b, h)
	}
	b = binary.AppendUvarint(b, uint64(len(f.Blocks)))
	for _, h := range f.Blocks {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary encoded. The bytes come from
// a store, so every count is checked against what is left of them.
func (f *Fingerprint) UnmarshalBinary(data []byte) error {
	d := decoder{b: data}
	if d.byte() != fingerprintVersion {
		return errCorrupt
	}
	var g Fingerprint
	g.GranuleBytes, g.Bytes, g.BlockTokens, g.Tokens = d.int(), d.int(), d.int(), d.int()
	n := d.count(1 + 1 + 1 + 1 + 8)
	for range n {
		var p PartPrint
		p.Part = Part(d.byte())
		p.Index = int32(d.varint())
		p.Role = canonicalRole(string(d.bytes(d.count(1))))
		p.Len = int32(d.int())
		p.Hash = d.u64()
		g.Parts = append(g.Parts, p)
	}
	for range d.count(8) {
		g.Tools = append(g.Tools, d.u64())
	}
	for range d.count(4) {
		g.Granules = append(g.Granules, uint32(d.u64n(4)))
	}
	for range d.count(8) {
		g.Blocks = append(g.Blocks, d.u64())
	}
	if d.err || len(d.b) != 0 || g.GranuleBytes == 0 && len(g.Granules) > 0 {
		return errCorrupt
	}
	*f = g
	return nil
}

// decoder reads an encoded Fingerprint; err is sticky, and a failed read
// returns zero.
type decoder struct {
	b   []byte
	err bool
}

func (d *decoder) byte() byte  { return byte(d.u64n(1)) }
func (d *decoder) u64() uint64 { return d.u64n(8) }

// u64n reads a little-endian unsigned integer of n bytes.
func (d *decoder) u64n(n int) uint64 {
	if d.err || len(d.b) < n {
		d.err = true
		return 0
	}
	var v uint64
	for i := n - 1; i >= 0; i-- {
		v = v<<8 | uint64(d.b[i])
	}
	d.b = d.b[n:]
	return v
}

// int reads a uvarint that fits an int32.
func (d *decoder) int() int {
	v, n := binary.Uvarint(d.b)
	if d.err || n <= 0 || v > math.MaxInt32 {
		d.err = true
		return 0
	}
	d.b = d.b[n:]
	return int(v)
}

func (d *decoder) varint() int {
	v, n := binary.Varint(d.b)
	if d.err || n <= 0 || v < math.MinInt32 || v > math.MaxInt32 {
		d.err = true
		return 0
	}
	d.b = d.b[n:]
	return int(v)
}

// count reads a count of items of at least size bytes each, no more
// than the bytes left can hold.
func (d *decoder) count(size int) int {
	n := d.int()
	if n > len(d.b)/size {
		d.err = true
		return 0
	}
	return n
}

func (d *decoder) bytes(n int) []byte {
	if d.err || len(d.b) < n {
		d.err = true
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}
