package kvevents

// str reads a str, a bin or nil (as "") into *dst; the values vLLM uses
// for media, attention kinds and the offload fields are not allocated.
func (d *decoder) str(dst *string, field string) error {
	*dst = ""
	if d.r.isNil() {
		return nil
	}
	p, kind, err := d.r.strOrBin()
	if err != nil {
		return err
	}
	if kind == rawNone {
		return d.r.typeErr(field, "string")
	}
	*dst = intern(p)
	return nil
}

// intern returns p as a string, without allocating for the few values
// every event repeats.
func intern(p []byte) string {
	switch string(p) {
	case MediumGPU:
		return MediumGPU
	case MediumCPU:
		return MediumCPU
	case "full_attention":
		return "full_attention"
	case "LOCAL":
		return "LOCAL"
	case "REMOTE":
		return "REMOTE"
	}
	return string(p)
}

func (d *decoder) hashes(dst *[]uint64) error {
	*dst = nil
	n, err := d.r.optArrayLen("block_hashes")
	if err != nil || n == 0 {
		return err
	}
	var hs []uint64
	if n <= smallHashes {
		hs = grab(&d.a, &d.a.u64, n)
	} else {
		hs = make([]uint64, n)
	}
	for i := range hs {
		if hs[i], err = d.r.hash("block hash"); err != nil {
			return err
		}
	}
	*dst = hs
	return nil
}

func (d *decoder) tokens(dst *[]uint32) error {
	*dst = nil
	n, err := d.r.optArrayLen("token_ids")
	if err != nil || n == 0 {
		return err
	}
	ts := make([]uint32, n)
	b := d.r.b
	for i := range ts {
		// Fast path for the encodings msgspec uses for token IDs.
		if off := d.r.off; off < len(b) {
			switch c := b[off]; {
			case c <= cPosFixHigh:
				ts[i] = uint32(c)
				d.r.off++
				continue
			case c == cUint8 && off+2 <= len(b):
				ts[i] = uint32(b[off+1])
				d.r.off += 2
				continue
			case c == cUint16 && off+3 <= len(b):
				ts[i] = uint32(b[off+1])<<8 | uint32(b[off+2])
				d.r.off += 3
				continue
			case c == cUint32 && off+5 <= len(b):
				ts[i] = uint32(b[off+1])<<24 | uint32(b[off+2])<<16 | uint32(b[off+3])<<8 | uint32(b[off+4])
				d.r.off += 5
				continue
			}
		}
		v, k, err := d.r.integer()
		if err != nil {
			return err
		}
		if k == intNone {
			return d.r.typeErr("token id", "integer")
		}
		if k == intSigned && int64(v) < 0 || v > 1<<32-1 {
			return d.r.errAt("token id %d out of range", int64(v))
		}
		ts[i] = uint32(v)
	}
	*dst = ts
	return nil
}
