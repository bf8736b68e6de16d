package kvevents

import "fmt"

// DecodeStats reports what Decode skipped without failing.
type DecodeStats struct {
	// UnknownEvents counts events skipped because their tag is not one of
	// the Type* constants (e.g. BlockInactive), or because a map event
	// carries no "type".
	UnknownEvents int
	// UnknownKeys counts fields skipped because this package does not
	// know them: unknown map keys of the batch, of events and of typed
	// extra keys, array elements beyond the known positions, and typed
	// extra keys of an unknown type (kept as ExtraLegacy).
	UnknownKeys int
}

// Decode parses one msgpack payload (the third frame of a KV-event
// message) into a Batch.
//
// It accepts the batch as vLLM's 3-element array [ts, events,
// data_parallel_rank] (a 2-element one leaves DPRank nil) or as a map with
// those keys; ts as a float or an integer; each event as a tagged array
// (vLLM ≤ 0.23, tag first, positional fields, trailing defaults omitted) or
// a tagged map (vLLM ≥ 0.26, tag under "type"), mixed freely. Hashes may be
// integers of any width (negative ones are reinterpreted as uint64) or byte
// strings (their last eight bytes, big-endian). A parent hash of 0 is kept as
// the hash 0, not taken for "no parent": only vLLM's nil means the run starts
// at block 0 (llm-d-inference-sim's 0 root in array mode then simply fails
// to resolve in the block index, which treats an unknown parent as a broken
// chain).
//
// Unknown event tags and unknown fields are skipped and counted in the
// returned DecodeStats. Malformed input (wrong types, truncated data,
// trailing bytes, lengths larger than the remaining input, nesting deeper
// than vLLM ever produces) is an error; Decode never panics, and the
// memory it allocates is proportional to len(payload), whatever lengths the
// payload declares. The returned Batch does not
// alias payload. Decode is safe for concurrent use.
func Decode(payload []byte) (Batch, DecodeStats, error) {
	d := decoder{r: reader{b: payload}}
	b, err := d.batch()
	if err == nil && d.r.remaining() > 0 {
		err = d.r.errAt("%d trailing bytes after the batch", d.r.remaining())
	}
	if err != nil {
		return Batch{}, d.stats, fmt.Errorf("kvevents: decode: %w", err)
	}
	return b, d.stats, nil
}

type decoder struct {
	r     reader
	stats DecodeStats
	a     arena
}

// arena hands out the small values of one decoded batch (event structs,
// the one-element hash slices of BlockRemoved, optional ints) from a few
// shared allocations instead of one each: vLLM sends a BlockRemoved per
// evicted block, so a batch can hold hundreds. A new slab is sized for
// the events still to decode (each needs one of most kinds), but for no
// more than the remaining bytes can hold, so that what the arena
// allocates stays proportional to the payload. Values stay valid after
// Decode returns: a full slab is replaced, never reused.
type arena struct {
	u64     []uint64
	ints    []int
	removed []BlockRemoved
	stored  []BlockStored
	// left is how many events, the current one included, remain to decode,
	// bounded by the remaining bytes.
	left int
}

// minEventBytes is the shortest encoding of an event the arena serves:
// a one-element array holding the tag "BlockStored".
const minEventBytes = 13

// grab returns n zeroed elements of *slab, replacing it with a larger one
// when it has no room.
func grab[T any](a *arena, slab *[]T, n int) []T {
	s := *slab
	if cap(s)-len(s) < n {
		s = make([]T, 0, max(n, 2*cap(s), a.left))
	}
	out := s[len(s) : len(s)+n : len(s)+n]
	*slab = s[:len(s)+n]
	return out
}

// smallHashes is the longest hash list taken from the arena; longer
// ones (a BlockStored of a whole prompt) get their own allocation.
const smallHashes = 8

// optInt reads an integer or nil, the int taken from the arena.
func (d *decoder) optInt(field string) (*int, error) {
	if d.r.isNil() {
		return nil, nil
	}
	v, err := d.r.intVal(field)
	if err != nil {
		return nil, err
	}
	p := &grab(&d.a, &d.a.ints, 1)[0]
	*p = v
	return p, nil
}

func (d *decoder) batch() (Batch, error) {
	var b Batch
	n, ok, err := d.r.arrayLen()
	if err != nil {
		return b, err
	}
	if ok {
		if n < 2 {
			return b, d.r.errAt("batch is an array of %d elements, want [ts, events, data_parallel_rank]", n)
		}
		if b.TS, err = d.r.float("ts"); err != nil {
			return b, err
		}
		if b.Events, err = d.events(); err != nil {
			return b, err
		}
		if n >= 3 {
			if b.DPRank, err = d.optInt("data_parallel_rank"); err != nil {
				return b, err
			}
		}
		for i := 3; i < n; i++ {
			d.stats.UnknownKeys++
			if err := d.r.skip(1); err != nil {
				return b, err
			}
		}
		return b, nil
	}
	n, ok, err = d.r.mapLen()
	if err != nil {
		return b, err
	}
	if !ok {
		return b, d.r.typeErr("batch", "array or map")
	}
	for range n {
		key, err := d.key()
		if err != nil {
			return b, err
		}
		switch string(key) {
		case "ts":
			b.TS, err = d.r.float("ts")
		case "events":
			b.Events, err = d.events()
		case "data_parallel_rank":
			b.DPRank, err = d.optInt("data_parallel_rank")
		default:
			d.stats.UnknownKeys++
			err = d.r.skip(1)
		}
		if err != nil {
			return b, err
		}
	}
	return b, nil
}

// key reads a map key, which must be a string.
func (d *decoder) key() ([]byte, error) {
	p, kind, err := d.r.strOrBin()
	if err != nil {
		return nil, err
	}
	if kind != rawStr {
		return nil, d.r.typeErr("map key", "string")
	}
	return p, nil
}

func (d *decoder) events() ([]Event, error) {
	n, err := d.r.optArrayLen("events")
	if err != nil || n == 0 {
		return nil, err
	}
	evs := make([]Event, 0, n)
	for i := range n {
		d.a.left = min(n-i, d.r.remaining()/minEventBytes+1)
		ev, err := d.event()
		if err != nil {
			return nil, err
		}
		if ev != nil {
			evs = append(evs, ev)
		}
	}
	if len(evs) == 0 {
		return nil, nil
	}
	return evs, nil
}

// event decodes one event; it returns nil, nil for a skipped unknown event.
func (d *decoder) event() (Event, error) {
	if n, ok, err := d.r.arrayLen(); err != nil {
		return nil, err
	} else if ok {
		return d.arrayEvent(n)
	}
	if n, ok, err := d.r.mapLen(); err != nil {
		return nil, err
	} else if ok {
		return d.mapEvent(n)
	}
	return nil, d.r.typeErr("event", "array or map")
}

// unknown skips a value the decoder does not know and counts it.
func (d *decoder) unknown() error {
	d.stats.UnknownKeys++
	return d.r.skip(1)
}
