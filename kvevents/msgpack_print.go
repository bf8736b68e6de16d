package kvevents

import (
	"encoding/hex"
	"strconv"
	"strings"
)

// printValue consumes one value and appends a printed form of it to sb:
// strings as themselves at the top level, quoted inside containers, byte
// strings in hex, containers in brackets. It is used for extra keys whose
// shape this package does not model, so that they survive as text.
func (r *reader) printValue(sb *strings.Builder, depth int) error {
	if depth > maxDepth {
		return errTooDeep
	}
	if n, ok, err := r.arrayLen(); err != nil {
		return err
	} else if ok {
		return r.printArray(sb, n, depth)
	}
	if n, ok, err := r.mapLen(); err != nil {
		return err
	} else if ok {
		return r.printMap(sb, n, depth)
	}
	return r.printScalar(sb, depth)
}

// printArray prints the n elements of an array whose header was read.
func (r *reader) printArray(sb *strings.Builder, n, depth int) error {
	sb.WriteByte('[')
	for i := range n {
		if i > 0 {
			sb.WriteString(", ")
		}
		if err := r.printValue(sb, depth+1); err != nil {
			return err
		}
	}
	sb.WriteByte(']')
	return nil
}

// printMap prints the n entries of a map whose header was read.
func (r *reader) printMap(sb *strings.Builder, n, depth int) error {
	sb.WriteByte('{')
	for i := range n {
		if i > 0 {
			sb.WriteString(", ")
		}
		if err := r.printValue(sb, depth+1); err != nil {
			return err
		}
		sb.WriteString(": ")
		if err := r.printValue(sb, depth+1); err != nil {
			return err
		}
	}
	sb.WriteByte('}')
	return nil
}

// printScalar prints a value that is not a container, an extension type
// as "ext:" and its encoding in hex.
func (r *reader) printScalar(sb *strings.Builder, depth int) error {
	start := r.off
	c, err := r.peek()
	if err != nil {
		return err
	}
	if p, kind, err := r.strOrBin(); err != nil {
		return err
	} else if kind == rawStr {
		if depth == 0 {
			sb.Write(p)
		} else {
			sb.WriteString(strconv.Quote(string(p)))
		}
		return nil
	} else if kind == rawBin {
		sb.WriteString("b'")
		sb.WriteString(hex.EncodeToString(p))
		sb.WriteByte('\'')
		return nil
	}
	if v, k, err := r.integer(); err != nil {
		return err
	} else if k == intUnsigned {
		sb.WriteString(strconv.FormatUint(v, 10))
		return nil
	} else if k == intSigned {
		sb.WriteString(strconv.FormatInt(int64(v), 10))
		return nil
	}
	switch c {
	case cNil:
		r.off++
		sb.WriteString("None")
		return nil
	case cTrue:
		r.off++
		sb.WriteString("True")
		return nil
	case cFalse:
		r.off++
		sb.WriteString("False")
		return nil
	case cFloat, cDouble:
		f, err := r.float("value")
		if err != nil {
			return err
		}
		sb.WriteString(strconv.FormatFloat(f, 'g', -1, 64))
		return nil
	}
	if err := r.skip(depth); err != nil {
		return err
	}
	sb.WriteString("ext:")
	sb.WriteString(hex.EncodeToString(r.b[start:r.off]))
	return nil
}
