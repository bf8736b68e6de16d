package kvevents

// arrayEvent decodes an event of n elements in the legacy array layout
// (vLLM ≤ 0.23): the tag first, then the fields by position.
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
		return d.arrayStored(n - 1)
	case TypeBlockRemoved:
		return d.arrayRemoved(n - 1)
	case TypeAllBlocksCleared:
		return d.cleared(n - 1)
	}
	return nil, d.unknownEvent(n - 1)
}

// arrayStored decodes the n positional fields of a BlockStored.
func (d *decoder) arrayStored(n int) (Event, error) {
	e := &grab(&d.a, &d.a.stored, 1)[0]
	for i := 1; i <= n; i++ {
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
}

// arrayRemoved decodes the n positional fields of a BlockRemoved.
func (d *decoder) arrayRemoved(n int) (Event, error) {
	e := &grab(&d.a, &d.a.removed, 1)[0]
	for i := 1; i <= n; i++ {
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
}

// cleared decodes an AllBlocksCleared, counting its n values (positional
// fields, or map keys with their values) as unknown.
func (d *decoder) cleared(n int) (Event, error) {
	for range n {
		if err := d.unknown(); err != nil {
			return nil, err
		}
	}
	return &AllBlocksCleared{}, nil
}

// unknownEvent counts an event of an unknown tag and skips its n
// remaining values.
func (d *decoder) unknownEvent(n int) error {
	d.stats.UnknownEvents++
	for range n {
		if err := d.r.skip(1); err != nil {
			return err
		}
	}
	return nil
}

// mapEvent decodes an event of n entries in the map layout (vLLM ≥ 0.26),
// its tag under "type". msgspec writes "type" first, but a map may hold it
// anywhere: mapEvent finds it, then decodes the fields from the start, or,
// when it came first, from the field after it. A map without "type" is an
// unknown event.
func (d *decoder) mapEvent(n int) (Event, error) {
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
		return d.mapStored(n)
	case TypeBlockRemoved:
		return d.mapRemoved(n)
	case TypeAllBlocksCleared:
		return d.mapCleared(n)
	}
	return nil, d.unknownEvent(2 * n)
}

// mapStored decodes the n entries of a BlockStored map.
func (d *decoder) mapStored(n int) (Event, error) {
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
}

// mapRemoved decodes the n entries of a BlockRemoved map.
func (d *decoder) mapRemoved(n int) (Event, error) {
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
}

// mapCleared decodes the n entries of an AllBlocksCleared map: all but
// "type" are unknown.
func (d *decoder) mapCleared(n int) (Event, error) {
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
