package kvevents

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Format selects how Encode lays out events. The batch itself is always the
// 3-element array [ts, events, data_parallel_rank].
type Format int

const (
	// FormatMap encodes events as maps tagged by "type", as vLLM ≥ 0.26
	// does. It is the zero value and carries every field of the event
	// types.
	FormatMap Format = iota
	// FormatArray encodes events as arrays tagged at index 0, as vLLM
	// ≤ 0.23 does. Fields that only exist in the map layout
	// (BlockStored.EventVersion, SessionID, Locality and Ownership;
	// BlockRemoved.Locality and Ownership) are not encoded.
	FormatArray
)

// String returns "map" or "array".
func (f Format) String() string {
	switch f {
	case FormatMap:
		return "map"
	case FormatArray:
		return "array"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// Encode returns the msgpack payload of b as vLLM (msgspec, omit_defaults)
// would produce it: fields without a default are always present (nil
// pointers and empty strings as msgpack nil, nil slices as empty arrays);
// fields with a default (ExtraKeys, GroupIdx, KVCacheSpecKind,
// KVCacheSpecSlidingWindow and the map-only fields) are left out when they
// hold their zero value (in the array layout only trailing ones); hashes
// and token IDs are unsigned integers in the smallest width; TS is a
// float64; DPRank is always present (nil when unset).
//
// Extra keys use vLLM's released raw-tuple form (strings, [identifier,
// offset] pairs, bytes) unless EventVersion ≥ 2, which selects main's typed
// form. A key that the raw form cannot carry faithfully (a multimodal key
// with a Modality, a string whose kind Decode would guess differently, a
// prompt-embeds value that is not lowercase hex) is written in the typed
// form even then, so that Decode(Encode(b)) reproduces it. A non-empty
// CacheSalt that block 0's extra keys do not already hold is added to them
// (as vLLM does, it only makes sense for an event without a parent).
//
// Decode(Encode(b, f)) equals b for every batch Decode can return (minus
// the map-only fields under FormatArray), and for batches built by hand
// whose CacheSalt and LoRAName agree with their ExtraKeys. Encode is safe
// for concurrent use.
func Encode(b Batch, f Format) ([]byte, error) {
	if f != FormatMap && f != FormatArray {
		return nil, fmt.Errorf("kvevents: encode: unknown format %d", int(f))
	}
	var buf bytes.Buffer
	buf.Grow(encodedSizeHint(b))
	w := writer{e: msgpack.NewEncoder(&buf)}
	w.arrayLen(3)
	w.float(b.TS)
	w.arrayLen(len(b.Events))
	for i, ev := range b.Events {
		if err := w.event(ev, f); err != nil {
			return nil, fmt.Errorf("kvevents: encode event %d: %w", i, err)
		}
	}
	w.optInt(b.DPRank)
	if w.err != nil {
		return nil, fmt.Errorf("kvevents: encode: %w", w.err)
	}
	return buf.Bytes(), nil
}

func encodedSizeHint(b Batch) int {
	n := 16
	for _, ev := range b.Events {
		switch e := ev.(type) {
		case *BlockStored:
			if e == nil {
				continue
			}
			n += 200 + 9*len(e.BlockHashes) + 5*len(e.TokenIDs)
		case *BlockRemoved:
			if e == nil {
				continue
			}
			n += 48 + 9*len(e.BlockHashes)
		default:
			n += 32
		}
	}
	return n
}

// writer wraps a msgpack.Encoder and keeps its first error.
type writer struct {
	e   *msgpack.Encoder
	err error
}

func (w *writer) keep(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *writer) arrayLen(n int)  { w.keep(w.e.EncodeArrayLen(n)) }
func (w *writer) mapLen(n int)    { w.keep(w.e.EncodeMapLen(n)) }
func (w *writer) str(s string)    { w.keep(w.e.EncodeString(s)) }
func (w *writer) nil()            { w.keep(w.e.EncodeNil()) }
func (w *writer) uint(v uint64)   { w.keep(w.e.EncodeUint(v)) }
func (w *writer) int(v int64)     { w.keep(w.e.EncodeInt(v)) }
func (w *writer) float(v float64) { w.keep(w.e.EncodeFloat64(v)) }
func (w *writer) bytes(p []byte)  { w.keep(w.e.EncodeBytes(p)) }
func (w *writer) key(k string)    { w.str(k) }
func (w *writer) tag(t string)    { w.str(t) }
func (w *writer) optStr(s string) {
	if s == "" {
		w.nil()
		return
	}
	w.str(s)
}

func (w *writer) optInt(p *int) {
	if p == nil {
		w.nil()
		return
	}
	w.int(int64(*p))
}

func (w *writer) hashes(hs []uint64) {
	w.arrayLen(len(hs))
	for _, h := range hs {
		w.uint(h)
	}
}

func (w *writer) optHash(p *uint64) {
	if p == nil {
		w.nil()
		return
	}
	w.uint(*p)
}

func (w *writer) tokens(ts []uint32) {
	w.arrayLen(len(ts))
	for _, t := range ts {
		w.uint(uint64(t))
	}
}

func (w *writer) event(ev Event, f Format) error {
	switch e := ev.(type) {
	case *BlockStored:
		if e == nil {
			return errors.New("nil *BlockStored")
		}
		return w.stored(e, f)
	case *BlockRemoved:
		if e == nil {
			return errors.New("nil *BlockRemoved")
		}
		w.removed(e, f)
	case *AllBlocksCleared:
		if f == FormatMap {
			w.mapLen(1)
			w.key("type")
		} else {
			w.arrayLen(1)
		}
		w.tag(TypeAllBlocksCleared)
	case nil:
		return errors.New("nil event")
	default:
		return fmt.Errorf("unsupported event type %T", ev)
	}
	return nil
}

func (w *writer) stored(e *BlockStored, f Format) error {
	eks, err := e.extraKeysToEncode()
	if err != nil {
		return err
	}
	if f == FormatArray {
		w.storedArray(e, eks)
	} else {
		w.storedMap(e, eks)
	}
	return nil
}

// storedArray writes e in the legacy array layout, with trailing fields
// omitted from the last one set.
func (w *writer) storedArray(e *BlockStored, eks [][]ExtraKey) {
	last := int(fLoRAName)
	switch {
	case e.KVCacheSpecSlidingWindow != nil:
		last = int(fSlidingWindow)
	case e.KVCacheSpecKind != "":
		last = int(fSpecKind)
	case e.GroupIdx != nil:
		last = int(fGroupIdx)
	case eks != nil:
		last = int(fExtraKeys)
	}
	w.arrayLen(last + 1)
	w.tag(TypeBlockStored)
	w.storedFields(e, false)
	for i := int(fExtraKeys); i <= last; i++ {
		switch sfield(i) {
		case fExtraKeys:
			w.extraKeys(e, eks)
		case fGroupIdx:
			w.optInt(e.GroupIdx)
		case fSpecKind:
			w.optStr(e.KVCacheSpecKind)
		case fSlidingWindow:
			w.optInt(e.KVCacheSpecSlidingWindow)
		}
	}
}

// storedMap writes e in the map layout, with the optional keys only when
// set.
func (w *writer) storedMap(e *BlockStored, eks [][]ExtraKey) {
	n := 8
	for _, present := range []bool{
		eks != nil, e.EventVersion != 0, e.GroupIdx != nil, e.KVCacheSpecKind != "",
		e.KVCacheSpecSlidingWindow != nil, e.Locality != "", e.Ownership != "", e.SessionID != "",
	} {
		if present {
			n++
		}
	}
	w.mapLen(n)
	w.key("type")
	w.tag(TypeBlockStored)
	w.storedFields(e, true)
	if eks != nil {
		w.key("extra_keys")
		w.extraKeys(e, eks)
	}
	if e.EventVersion != 0 {
		w.key("event_version")
		w.int(int64(e.EventVersion))
	}
	if e.GroupIdx != nil {
		w.key("group_idx")
		w.optInt(e.GroupIdx)
	}
	if e.KVCacheSpecKind != "" {
		w.key("kv_cache_spec_kind")
		w.str(e.KVCacheSpecKind)
	}
	if e.KVCacheSpecSlidingWindow != nil {
		w.key("kv_cache_spec_sliding_window")
		w.optInt(e.KVCacheSpecSlidingWindow)
	}
	if e.Locality != "" {
		w.key("locality")
		w.str(e.Locality)
	}
	if e.Ownership != "" {
		w.key("ownership")
		w.str(e.Ownership)
	}
	if e.SessionID != "" {
		w.key("session_id")
		w.str(e.SessionID)
	}
}

// storedFields writes BlockStored's seven always-encoded fields, preceded
// by their keys in the map layout.
func (w *writer) storedFields(e *BlockStored, keyed bool) {
	k := func(s string) {
		if keyed {
			w.key(s)
		}
	}
	k("block_hashes")
	w.hashes(e.BlockHashes)
	k("parent_block_hash")
	w.optHash(e.ParentBlockHash)
	k("token_ids")
	w.tokens(e.TokenIDs)
	k("block_size")
	w.int(int64(e.BlockSize))
	k("lora_id")
	if e.LoRAID == nil {
		w.nil()
	} else {
		w.int(*e.LoRAID)
	}
	k("medium")
	w.optStr(e.Medium)
	k("lora_name")
	w.optStr(e.LoRAName)
}

func (w *writer) removed(e *BlockRemoved, f Format) {
	if f == FormatArray {
		if e.GroupIdx != nil {
			w.arrayLen(4)
		} else {
			w.arrayLen(3)
		}
		w.tag(TypeBlockRemoved)
		w.hashes(e.BlockHashes)
		w.optStr(e.Medium)
		if e.GroupIdx != nil {
			w.optInt(e.GroupIdx)
		}
		return
	}
	n := 3
	for _, present := range []bool{e.GroupIdx != nil, e.Locality != "", e.Ownership != ""} {
		if present {
			n++
		}
	}
	w.mapLen(n)
	w.key("type")
	w.tag(TypeBlockRemoved)
	w.key("block_hashes")
	w.hashes(e.BlockHashes)
	w.key("medium")
	w.optStr(e.Medium)
	if e.GroupIdx != nil {
		w.key("group_idx")
		w.optInt(e.GroupIdx)
	}
	if e.Locality != "" {
		w.key("locality")
		w.str(e.Locality)
	}
	if e.Ownership != "" {
		w.key("ownership")
		w.str(e.Ownership)
	}
}

// extraKeysToEncode returns e.ExtraKeys with CacheSalt added to block 0's
// keys when they lack it. It never modifies e.
func (e *BlockStored) extraKeysToEncode() ([][]ExtraKey, error) {
	if e.CacheSalt == "" {
		return e.ExtraKeys, nil
	}
	if len(e.ExtraKeys) > 0 {
		for _, k := range e.ExtraKeys[0] {
			if k.Kind != ExtraCacheSalt {
				continue
			}
			if k.Value != e.CacheSalt {
				return nil, fmt.Errorf("CacheSalt %q disagrees with block 0's cache_salt key %q", e.CacheSalt, k.Value)
			}
			return e.ExtraKeys, nil
		}
	}
	n := len(e.ExtraKeys)
	if e.ExtraKeys == nil {
		n = len(e.BlockHashes)
	}
	n = max(n, 1)
	eks := make([][]ExtraKey, n)
	copy(eks, e.ExtraKeys)
	salt := ExtraKey{Kind: ExtraCacheSalt, Value: e.CacheSalt}
	// vLLM orders extra keys LoRA, multimodal, salt, prompt embeds.
	old := eks[0]
	at := len(old)
	for i, k := range old {
		if k.Kind == ExtraPromptEmbeds {
			at = i
			break
		}
	}
	ks := make([]ExtraKey, 0, len(old)+1)
	ks = append(ks, old[:at]...)
	ks = append(ks, salt)
	ks = append(ks, old[at:]...)
	eks[0] = ks
	return eks, nil
}

func (w *writer) extraKeys(e *BlockStored, eks [][]ExtraKey) {
	if eks == nil {
		w.nil() // a filler before later fields in the array layout
		return
	}
	w.arrayLen(len(eks))
	typed := e.EventVersion >= 2
	for i, ks := range eks {
		if ks == nil {
			w.nil()
			continue
		}
		w.arrayLen(len(ks))
		for _, k := range ks {
			if typed || !e.rawFaithful(i, k) {
				w.typedKey(k)
			} else {
				w.rawKey(k)
			}
		}
	}
}

// rawFaithful reports whether the raw form of k, as entry i of e's extra
// keys, decodes back to k.
func (e *BlockStored) rawFaithful(i int, k ExtraKey) bool {
	switch k.Kind {
	case ExtraLoRA, ExtraCacheSalt, ExtraLegacy:
		return k.Modality == "" && k.Offset == 0 && e.rawStringKind(i, k.Value) == k.Kind
	case ExtraMultimodal:
		return k.Modality == ""
	case ExtraPromptEmbeds:
		return isLowerHex(k.Value) && k.Modality == "" && k.Offset == 0
	}
	return false
}

func isLowerHex(s string) bool {
	if len(s)%2 != 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func (w *writer) rawKey(k ExtraKey) {
	switch k.Kind {
	case ExtraMultimodal:
		w.arrayLen(2)
		w.str(k.Value)
		w.int(int64(k.Offset))
	case ExtraPromptEmbeds:
		p, _ := hex.DecodeString(k.Value)
		if p == nil {
			p = []byte{}
		}
		w.bytes(p)
	default:
		w.str(k.Value)
	}
}

func (w *writer) typedKey(k ExtraKey) {
	switch k.Kind {
	case ExtraLoRA:
		w.mapLen(2)
		w.key("type")
		w.str(ExtraLoRA)
		w.key("name")
		w.str(k.Value)
	case ExtraCacheSalt:
		w.mapLen(2)
		w.key("type")
		w.str(ExtraCacheSalt)
		w.key("salt")
		w.str(k.Value)
	case ExtraMultimodal:
		w.mapLen(4)
		w.key("type")
		w.str(ExtraMultimodal)
		w.key("modality")
		w.str(k.Modality)
		w.key("hash")
		w.str(k.Value)
		w.key("block_offset")
		w.int(int64(k.Offset))
	case ExtraPromptEmbeds:
		w.mapLen(2)
		w.key("type")
		w.str(ExtraPromptEmbeds)
		w.key("hash")
		if isLowerHex(k.Value) {
			p, _ := hex.DecodeString(k.Value)
			if p == nil {
				p = []byte{}
			}
			w.bytes(p)
		} else {
			w.str(k.Value)
		}
	case ExtraLegacy:
		w.mapLen(2)
		w.key("type")
		w.str(ExtraLegacy)
		w.key("value")
		w.str(k.Value)
	default:
		w.keep(fmt.Errorf("unknown extra key kind %q", k.Kind))
	}
}
