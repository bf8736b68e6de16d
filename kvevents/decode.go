package kvevents

import (
	"encoding/hex"
	"fmt"
	"strings"
)

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

func (d *decoder) arrayEvent(n int) (Event, error) {
	if n == 0 {
		return nil, d.r.errAt("empty event array")
	}
	tag, kind, err := d.r.strOrBin()
	if err != nil {
		return nil, err
	}
	if kind != rawStr {
		return nil, d.r.typeErr("event tag", "string")
	}
	switch string(tag) {
	case TypeBlockStored:
		e := &grab(&d.a, &d.a.stored, 1)[0]
		for i := 1; i < n; i++ {
			if i > int(fSlidingWindow) {
				if err := d.unknown(); err != nil {
					return nil, err
				}
				continue
			}
			if err := d.storedField(e, sfield(i)); err != nil {
				return nil, err
			}
		}
		e.finish()
		return e, nil
	case TypeBlockRemoved:
		e := &grab(&d.a, &d.a.removed, 1)[0]
		for i := 1; i < n; i++ {
			var err error
			switch i {
			case 1:
				err = d.hashes(&e.BlockHashes)
			case 2:
				err = d.str(&e.Medium, "medium")
			case 3:
				e.GroupIdx, err = d.optInt("group_idx")
			default:
				err = d.unknown()
			}
			if err != nil {
				return nil, err
			}
		}
		return e, nil
	case TypeAllBlocksCleared:
		for i := 1; i < n; i++ {
			if err := d.unknown(); err != nil {
				return nil, err
			}
		}
		return &AllBlocksCleared{}, nil
	}
	d.stats.UnknownEvents++
	for range n - 1 {
		if err := d.r.skip(1); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// unknown skips a value the decoder does not know and counts it.
func (d *decoder) unknown() error {
	d.stats.UnknownKeys++
	return d.r.skip(1)
}

func (d *decoder) mapEvent(n int) (Event, error) {
	// msgspec writes "type" first, but a map may hold it anywhere: find it,
	// then decode the fields from the start, or, when it came first, from
	// the field after it.
	start := d.r.off
	var tag []byte
	for i := range n {
		key, err := d.key()
		if err != nil {
			return nil, err
		}
		if string(key) == "type" {
			p, kind, err := d.r.strOrBin()
			if err != nil {
				return nil, err
			}
			if kind != rawStr {
				return nil, d.r.typeErr("event type", "string")
			}
			tag = p
			if i == 0 {
				start, n = d.r.off, n-1
			}
			break
		}
		if err := d.r.skip(1); err != nil {
			return nil, err
		}
	}
	d.r.off = start
	switch string(tag) {
	case TypeBlockStored:
		e := &grab(&d.a, &d.a.stored, 1)[0]
		for range n {
			key, err := d.key()
			if err != nil {
				return nil, err
			}
			if f, ok := storedKey(key); ok {
				err = d.storedField(e, f)
			} else if string(key) == "type" {
				err = d.r.skip(1)
			} else {
				err = d.unknown()
			}
			if err != nil {
				return nil, err
			}
		}
		e.finish()
		return e, nil
	case TypeBlockRemoved:
		e := &grab(&d.a, &d.a.removed, 1)[0]
		for range n {
			key, err := d.key()
			if err != nil {
				return nil, err
			}
			switch string(key) {
			case "type":
				err = d.r.skip(1)
			case "block_hashes":
				err = d.hashes(&e.BlockHashes)
			case "medium":
				err = d.str(&e.Medium, "medium")
			case "group_idx":
				e.GroupIdx, err = d.optInt("group_idx")
			case "locality":
				err = d.str(&e.Locality, "locality")
			case "ownership":
				err = d.str(&e.Ownership, "ownership")
			default:
				err = d.unknown()
			}
			if err != nil {
				return nil, err
			}
		}
		return e, nil
	case TypeAllBlocksCleared:
		for range n {
			key, err := d.key()
			if err != nil {
				return nil, err
			}
			if string(key) == "type" {
				err = d.r.skip(1)
			} else {
				err = d.unknown()
			}
			if err != nil {
				return nil, err
			}
		}
		return &AllBlocksCleared{}, nil
	}
	d.stats.UnknownEvents++
	for range 2 * n {
		if err := d.r.skip(1); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// sfield numbers BlockStored's fields; values 1–11 are also their
// positions in the legacy array layout (the tag is at 0).
type sfield int

const (
	fBlockHashes sfield = iota + 1
	fParent
	fTokenIDs
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
	// Fields below exist only in the map layout.
	fEventVersion
	fLocality
	fOwnership
	fSessionID
)

// storedKey maps a BlockStored map key to its field. A switch beats a map
// lookup here: Go compiles it to a few length and byte comparisons.
func storedKey(key []byte) (sfield, bool) {
	switch string(key) {
	case "block_hashes":
		return fBlockHashes, true
	case "parent_block_hash":
		return fParent, true
	case "token_ids":
		return fTokenIDs, true
	case "block_size":
		return fBlockSize, true
	case "lora_id":
		return fLoRAID, true
	case "medium":
		return fMedium, true
	case "lora_name":
		return fLoRAName, true
	case "extra_keys":
		return fExtraKeys, true
	case "group_idx":
		return fGroupIdx, true
	case "kv_cache_spec_kind":
		return fSpecKind, true
	case "kv_cache_spec_sliding_window":
		return fSlidingWindow, true
	case "event_version":
		return fEventVersion, true
	case "locality":
		return fLocality, true
	case "ownership":
		return fOwnership, true
	case "session_id":
		return fSessionID, true
	}
	return 0, false
}

func (d *decoder) storedField(e *BlockStored, f sfield) error {
	r := &d.r
	var err error
	switch f {
	case fBlockHashes:
		return d.hashes(&e.BlockHashes)
	case fParent:
		if r.isNil() {
			e.ParentBlockHash = nil
			return nil
		}
		h, err := r.hash("parent_block_hash")
		if err != nil {
			return err
		}
		e.ParentBlockHash = &h
	case fTokenIDs:
		return d.tokens(&e.TokenIDs)
	case fBlockSize:
		if r.isNil() {
			e.BlockSize = 0
			return nil
		}
		e.BlockSize, err = r.intVal("block_size")
	case fLoRAID:
		if r.isNil() {
			e.LoRAID = nil
			return nil
		}
		v, err := r.int64Val("lora_id")
		if err != nil {
			return err
		}
		e.LoRAID = &v
	case fMedium:
		return d.str(&e.Medium, "medium")
	case fLoRAName:
		return d.str(&e.LoRAName, "lora_name")
	case fExtraKeys:
		return d.extraKeys(e)
	case fGroupIdx:
		e.GroupIdx, err = d.optInt("group_idx")
	case fSpecKind:
		return d.str(&e.KVCacheSpecKind, "kv_cache_spec_kind")
	case fSlidingWindow:
		e.KVCacheSpecSlidingWindow, err = r.optInt("kv_cache_spec_sliding_window")
	case fEventVersion:
		if r.isNil() {
			e.EventVersion = 0
			return nil
		}
		e.EventVersion, err = r.intVal("event_version")
	case fLocality:
		return d.str(&e.Locality, "locality")
	case fOwnership:
		return d.str(&e.Ownership, "ownership")
	case fSessionID:
		return d.str(&e.SessionID, "session_id")
	}
	return err
}

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

// extraKeys decodes the per-block extra keys. Raw strings are left with an
// empty Kind; finish classifies them once lora_name and the parent are
// known (map keys may come in any order).
func (d *decoder) extraKeys(e *BlockStored) error {
	e.ExtraKeys = nil
	n, err := d.r.optArrayLen("extra_keys")
	if err != nil || n == 0 {
		return err
	}
	eks := make([][]ExtraKey, n)
	for i := range eks {
		if d.r.isNil() {
			continue
		}
		m, ok, err := d.r.arrayLen()
		if err != nil {
			return err
		}
		if !ok {
			// Tolerate a bare key where a tuple belongs.
			k, err := d.extraKey()
			if err != nil {
				return err
			}
			eks[i] = []ExtraKey{k}
			continue
		}
		ks := make([]ExtraKey, m)
		for j := range ks {
			if ks[j], err = d.extraKey(); err != nil {
				return err
			}
		}
		eks[i] = ks
	}
	e.ExtraKeys = eks
	return nil
}

// extraKey decodes one key of a block's extra-key tuple: a typed map, or a
// raw string, [identifier, offset] pair or byte string.
func (d *decoder) extraKey() (ExtraKey, error) {
	r := &d.r
	start := r.off
	if n, ok, err := r.mapLen(); err != nil {
		return ExtraKey{}, err
	} else if ok {
		k, known, err := d.typedExtraKey(n)
		if err != nil || known {
			return k, err
		}
		// A map that is not a known typed key: keep its printed form.
		d.stats.UnknownKeys++
		r.off = start
		return d.legacyKey()
	}
	if p, kind, err := r.strOrBin(); err != nil {
		return ExtraKey{}, err
	} else if kind == rawStr {
		return ExtraKey{Value: string(p)}, nil // classified in finish
	} else if kind == rawBin {
		return ExtraKey{Kind: ExtraPromptEmbeds, Value: hex.EncodeToString(p)}, nil
	}
	if n, ok, err := r.arrayLen(); err != nil {
		return ExtraKey{}, err
	} else if ok && n == 2 {
		if p, kind, err := r.strOrBin(); err == nil && kind == rawStr {
			if v, k, err := r.integer(); err == nil && k != intNone && (k == intSigned || v <= 1<<63-1) {
				return ExtraKey{Kind: ExtraMultimodal, Value: string(p), Offset: int(int64(v))}, nil
			}
		}
	}
	r.off = start
	return d.legacyKey()
}

func (d *decoder) legacyKey() (ExtraKey, error) {
	var sb strings.Builder
	if err := d.r.printValue(&sb, 0); err != nil {
		return ExtraKey{}, err
	}
	return ExtraKey{Kind: ExtraLegacy, Value: sb.String()}, nil
}

// typedExtraKey decodes main's tagged extra-key structs. known is false
// when the map has no "type" string or an unknown one; the caller then
// rewinds.
func (d *decoder) typedExtraKey(n int) (k ExtraKey, known bool, err error) {
	r := &d.r
	start := r.off
	var kind string
	for range n {
		key, kerr := d.key()
		if kerr != nil {
			return k, false, nil // not ours: print it
		}
		if string(key) == "type" {
			p, rk, err := r.strOrBin()
			if err != nil {
				return k, false, err
			}
			if rk == rawStr {
				kind = string(p)
			}
			break
		}
		if err := r.skip(2); err != nil {
			return k, false, err
		}
	}
	switch kind {
	case ExtraLoRA, ExtraCacheSalt, ExtraMultimodal, ExtraPromptEmbeds, ExtraLegacy:
	default:
		return k, false, nil
	}
	r.off = start
	k.Kind = kind
	for range n {
		key, err := d.key()
		if err != nil {
			return k, false, err
		}
		switch {
		case string(key) == "type":
			err = r.skip(2)
		case kind == ExtraLoRA && string(key) == "name",
			kind == ExtraCacheSalt && string(key) == "salt":
			k.Value, err = r.optString(string(key))
		case kind == ExtraMultimodal && string(key) == "modality":
			k.Modality, err = r.optString("modality")
		case kind == ExtraMultimodal && string(key) == "hash":
			k.Value, err = d.hexOrString("hash")
		case kind == ExtraMultimodal && string(key) == "block_offset":
			var off *int
			off, err = r.optInt("block_offset")
			if off != nil {
				k.Offset = *off
			}
		case kind == ExtraPromptEmbeds && string(key) == "hash":
			k.Value, err = d.hexOrString("hash")
		case kind == ExtraLegacy && string(key) == "value":
			var sb strings.Builder
			err = r.printValue(&sb, 0)
			k.Value = sb.String()
		default:
			d.stats.UnknownKeys++
			err = r.skip(2)
		}
		if err != nil {
			return k, false, err
		}
	}
	return k, true, nil
}

// hexOrString reads a str as itself or a bin as lowercase hex.
func (d *decoder) hexOrString(field string) (string, error) {
	if d.r.isNil() {
		return "", nil
	}
	p, kind, err := d.r.strOrBin()
	if err != nil {
		return "", err
	}
	switch kind {
	case rawStr:
		return string(p), nil
	case rawBin:
		return hex.EncodeToString(p), nil
	}
	return "", d.r.typeErr(field, "string or bytes")
}

// finish classifies raw string extra keys and surfaces LoRAName and
// CacheSalt.
func (e *BlockStored) finish() {
	if e.LoRAName == "" {
		for _, ks := range e.ExtraKeys {
			for _, k := range ks {
				if k.Kind == ExtraLoRA {
					e.LoRAName = k.Value
					goto classify
				}
			}
		}
	}
classify:
	for i, ks := range e.ExtraKeys {
		for j := range ks {
			if ks[j].Kind == "" {
				ks[j].Kind = e.rawStringKind(i, ks[j].Value)
			}
		}
	}
	e.CacheSalt = ""
	if len(e.ExtraKeys) > 0 {
		for _, k := range e.ExtraKeys[0] {
			if k.Kind == ExtraCacheSalt {
				e.CacheSalt = k.Value
				break
			}
		}
	}
}

// rawStringKind tells what a raw (untyped) string extra key of block i
// means. vLLM's released versions put only two kinds of string in the
// tuple: the LoRA name (on every block) and the cache salt (only on the
// block starting at token 0, i.e. entry 0 of an event without a parent).
// Anything else is kept as ExtraLegacy.
func (e *BlockStored) rawStringKind(i int, s string) string {
	switch {
	case s != "" && s == e.LoRAName:
		return ExtraLoRA
	case i == 0 && e.ParentBlockHash == nil:
		return ExtraCacheSalt
	}
	return ExtraLegacy
}
