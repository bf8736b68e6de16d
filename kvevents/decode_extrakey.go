package kvevents

import (
	"encoding/hex"
	"strings"
)

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
