package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// msgpack format codes (https://github.com/msgpack/msgpack/blob/master/spec.md).
// They are constants here, unlike msgpcode's variables, so that the
// switches below compile to jump tables.
const (
	cPosFixHigh = 0x7f
	cFixMapLow  = 0x80
	cFixMapHigh = 0x8f
	cFixMapMask = 0x0f
	cFixArrLow  = 0x90
	cFixArrHigh = 0x9f
	cFixArrMask = 0x0f
	cFixStrLow  = 0xa0
	cFixStrHigh = 0xbf
	cFixStrMask = 0x1f
	cNil        = 0xc0
	cFalse      = 0xc2
	cTrue       = 0xc3
	cBin8       = 0xc4
	cBin16      = 0xc5
	cBin32      = 0xc6
	cExt8       = 0xc7
	cExt16      = 0xc8
	cExt32      = 0xc9
	cFloat      = 0xca
	cDouble     = 0xcb
	cUint8      = 0xcc
	cUint16     = 0xcd
	cUint32     = 0xce
	cUint64     = 0xcf
	cInt8       = 0xd0
	cInt16      = 0xd1
	cInt32      = 0xd2
	cInt64      = 0xd3
	cFixExt1    = 0xd4
	cFixExt2    = 0xd5
	cFixExt4    = 0xd6
	cFixExt8    = 0xd7
	cFixExt16   = 0xd8
	cStr8       = 0xd9
	cStr16      = 0xda
	cStr32      = 0xdb
	cArray16    = 0xdc
	cArray32    = 0xdd
	cMap16      = 0xde
	cMap32      = 0xdf
	cNegFixLow  = 0xe0
)

// maxDepth bounds the nesting of msgpack containers the decoder follows.
// vLLM payloads nest seven levels deep at most (batch, events, event,
// extra_keys, block tuple, key, value); anything far deeper is hostile.
const maxDepth = 32

var (
	errTruncated = errors.New("truncated input")
	errTooDeep   = errors.New("msgpack nesting too deep")
)

// reader is a bounds-checked cursor over one msgpack payload. Every length
// it reports has been checked against the bytes that remain, so callers may
// allocate from it.
type reader struct {
	b   []byte
	off int
}

func (r *reader) remaining() int { return len(r.b) - r.off }

func (r *reader) errAt(format string, args ...any) error {
	return fmt.Errorf("offset %d: %s", r.off, fmt.Sprintf(format, args...))
}

func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errTruncated
	}
	return r.b[r.off], nil
}

func (r *reader) next(n int) ([]byte, error) {
	if n < 0 || n > r.remaining() {
		return nil, errTruncated
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p, nil
}

func (r *reader) byte1() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errTruncated
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

func (r *reader) uintN(n int) (uint64, error) {
	p, err := r.next(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(p[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), nil
	default:
		return binary.BigEndian.Uint64(p), nil
	}
}

// isNil consumes a nil and reports true, or consumes nothing.
func (r *reader) isNil() bool {
	if r.off < len(r.b) && r.b[r.off] == cNil {
		r.off++
		return true
	}
	return false
}

// arrayLen reads an array header. ok is false (and nothing is consumed)
// when the next value is not an array.
func (r *reader) arrayLen() (n int, ok bool, err error) {
	// Every element takes at least one byte.
	return r.containerLen(cFixArrLow, cFixArrHigh, cFixArrMask, cArray16, cArray32, 1, "array")
}

// optArrayLen reads a nil (n = 0) or an array header; anything else is a
// type error naming field.
func (r *reader) optArrayLen(field string) (int, error) {
	if r.isNil() {
		return 0, nil
	}
	n, ok, err := r.arrayLen()
	if err == nil && !ok {
		err = r.typeErr(field, "array")
	}
	return n, err
}

// mapLen reads a map header. ok is false (and nothing is consumed) when
// the next value is not a map.
func (r *reader) mapLen() (n int, ok bool, err error) {
	// Every entry takes at least two bytes.
	return r.containerLen(cFixMapLow, cFixMapHigh, cFixMapMask, cMap16, cMap32, 2, "map")
}

// containerLen reads an array or map header given its type codes: a fix
// range with its length mask, and the 16- and 32-bit forms. A length that
// cannot fit in the bytes left, at minBytes an element, is an error.
func (r *reader) containerLen(fixLow, fixHigh, fixMask, c16, c32 byte, minBytes int, what string) (n int, ok bool, err error) {
	c, err := r.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c >= fixLow && c <= fixHigh:
		r.off++
		n = int(c & fixMask)
	case c == c16 || c == c32:
		r.off++
		size := 2
		if c == c32 {
			size = 4
		}
		v, err := r.uintN(size)
		if err != nil {
			return 0, false, err
		}
		n = int(v)
	default:
		return 0, false, nil
	}
	if n > r.remaining()/minBytes {
		return 0, false, r.errAt("%s of %d elements with %d bytes left", what, n, r.remaining())
	}
	return n, true, nil
}

// rawKind tells strings from byte strings.
type rawKind int

const (
	rawNone rawKind = iota
	rawStr
	rawBin
)

// strOrBin reads a str or bin value without copying. kind is rawNone (and
// nothing is consumed) when the next value is neither.
func (r *reader) strOrBin() (p []byte, kind rawKind, err error) {
	c, err := r.peek()
	if err != nil {
		return nil, rawNone, err
	}
	var n uint64
	switch {
	case c >= cFixStrLow && c <= cFixStrHigh:
		r.off++
		n, kind = uint64(c&cFixStrMask), rawStr
	case c == cStr8 || c == cBin8:
		r.off++
		n, err = r.uintN(1)
	case c == cStr16 || c == cBin16:
		r.off++
		n, err = r.uintN(2)
	case c == cStr32 || c == cBin32:
		r.off++
		n, err = r.uintN(4)
	default:
		return nil, rawNone, nil
	}
	if err != nil {
		return nil, rawNone, err
	}
	if kind == rawNone {
		kind = rawStr
		if c == cBin8 || c == cBin16 || c == cBin32 {
			kind = rawBin
		}
	}
	if n > uint64(r.remaining()) {
		return nil, rawNone, r.errAt("string of %d bytes with %d bytes left", n, r.remaining())
	}
	p, _ = r.next(int(n))
	return p, kind, nil
}

// optString reads a str, a bin (taken as its bytes) or nil (as "").
func (r *reader) optString(field string) (string, error) {
	if r.isNil() {
		return "", nil
	}
	p, kind, err := r.strOrBin()
	if err != nil {
		return "", err
	}
	if kind == rawNone {
		return "", r.typeErr(field, "string")
	}
	return string(p), nil
}

// intKind describes a decoded msgpack integer.
type intKind int

const (
	intNone intKind = iota
	intUnsigned
	intSigned // negative, or from a signed encoding; v holds the two's complement
)

// integer reads any msgpack integer. k is intNone (and nothing is consumed)
// when the next value is not an integer.
func (r *reader) integer() (v uint64, k intKind, err error) {
	c, err := r.peek()
	if err != nil {
		return 0, intNone, err
	}
	switch {
	case c <= cPosFixHigh:
		r.off++
		return uint64(c), intUnsigned, nil
	case c >= cNegFixLow:
		r.off++
		return uint64(int64(int8(c))), intSigned, nil
	}
	switch c {
	case cUint8, cUint16, cUint32, cUint64:
		r.off++
		v, err = r.uintN(1 << (c - cUint8))
		return v, intUnsigned, err
	case cInt8:
		r.off++
		v, err = r.uintN(1)
		return uint64(int64(int8(v))), intSigned, err
	case cInt16:
		r.off++
		v, err = r.uintN(2)
		return uint64(int64(int16(v))), intSigned, err
	case cInt32:
		r.off++
		v, err = r.uintN(4)
		return uint64(int64(int32(v))), intSigned, err
	case cInt64:
		r.off++
		v, err = r.uintN(8)
		return v, intSigned, err
	}
	return 0, intNone, nil
}

func (r *reader) typeErr(field, want string) error {
	c, _ := r.peek()
	return r.errAt("%s: got msgpack code 0x%02x, want %s", field, c, want)
}

// int64Val reads an integer that must fit an int64.
func (r *reader) int64Val(field string) (int64, error) {
	v, k, err := r.integer()
	if err != nil {
		return 0, err
	}
	switch k {
	case intNone:
		return 0, r.typeErr(field, "integer")
	case intUnsigned:
		if v > math.MaxInt64 {
			return 0, r.errAt("%s: %d out of range", field, v)
		}
	}
	return int64(v), nil
}

// intVal reads an integer that must fit an int.
func (r *reader) intVal(field string) (int, error) {
	v, err := r.int64Val(field)
	if err != nil {
		return 0, err
	}
	if v > math.MaxInt || v < math.MinInt {
		return 0, r.errAt("%s: %d out of range", field, v)
	}
	return int(v), nil
}

// optInt reads an integer or nil.
func (r *reader) optInt(field string) (*int, error) {
	if r.isNil() {
		return nil, nil
	}
	v, err := r.intVal(field)
	if err != nil {
		return nil, err
	}
	return &v, nil
}

// hash reads a block hash: an integer of any width (negative ones as their
// two's complement) or a byte string folded to its last eight bytes,
// big-endian.
func (r *reader) hash(field string) (uint64, error) {
	v, k, err := r.integer()
	if err != nil {
		return 0, err
	}
	if k != intNone {
		return v, nil
	}
	p, kind, err := r.strOrBin()
	if err != nil {
		return 0, err
	}
	if kind != rawBin {
		return 0, r.typeErr(field, "integer or bytes")
	}
	return foldHash(p), nil
}

// foldHash returns the last eight bytes of p as a big-endian uint64,
// left-padding shorter digests with zeros.
func foldHash(p []byte) uint64 {
	if len(p) >= 8 {
		return binary.BigEndian.Uint64(p[len(p)-8:])
	}
	var v uint64
	for _, b := range p {
		v = v<<8 | uint64(b)
	}
	return v
}

// float reads a float32, float64 or integer as a float64.
func (r *reader) float(field string) (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case cDouble:
		r.off++
		v, err := r.uintN(8)
		return math.Float64frombits(v), err
	case cFloat:
		r.off++
		v, err := r.uintN(4)
		return float64(math.Float32frombits(uint32(v))), err
	}
	v, k, err := r.integer()
	if err != nil {
		return 0, err
	}
	switch k {
	case intUnsigned:
		return float64(v), nil
	case intSigned:
		return float64(int64(v)), nil
	}
	return 0, r.typeErr(field, "number")
}

// skip consumes one value of any type.
func (r *reader) skip(depth int) error {
	if depth > maxDepth {
		return errTooDeep
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	if n, ok, err := r.arrayLen(); err != nil {
		return err
	} else if ok {
		for range n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	if n, ok, err := r.mapLen(); err != nil {
		return err
	} else if ok {
		for range 2 * n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	if _, kind, err := r.strOrBin(); err != nil || kind != rawNone {
		return err
	}
	if _, k, err := r.integer(); err != nil || k != intNone {
		return err
	}
	r.off++
	switch c {
	case cNil, cTrue, cFalse:
		return nil
	case cFloat:
		_, err = r.next(4)
	case cDouble:
		_, err = r.next(8)
	case cFixExt1:
		_, err = r.next(2)
	case cFixExt2:
		_, err = r.next(3)
	case cFixExt4:
		_, err = r.next(5)
	case cFixExt8:
		_, err = r.next(9)
	case cFixExt16:
		_, err = r.next(17)
	case cExt8, cExt16, cExt32:
		var n uint64
		n, err = r.uintN(1 << (c - cExt8))
		if err == nil {
			if n >= uint64(r.remaining()) {
				return errTruncated
			}
			_, err = r.next(int(n) + 1)
		}
	default:
		r.off--
		return r.errAt("invalid msgpack code 0x%02x", c)
	}
	return err
}
