package blockindex

import (
	"strings"

	"github.com/warmpath/warmpath/kvevents"
)

// numTiers is the number of Tier values; tierGPU and tierCPU index arrays.
const (
	tierGPU = iota
	tierCPU
	numTiers
	tierOther = -1
)

// tierOf maps an event's medium to a tier: vLLM sends "GPU" and "CPU", and
// an empty medium means GPU (as llm-d treats it); case is ignored.
func tierOf(medium string) int {
	switch {
	case medium == "" || medium == kvevents.MediumGPU || strings.EqualFold(medium, kvevents.MediumGPU):
		return tierGPU
	case medium == kvevents.MediumCPU || strings.EqualFold(medium, kvevents.MediumCPU):
		return tierCPU
	}
	return tierOther
}

func fullAttention(kind string) bool {
	switch kind {
	case "", "full_attention", "mla_attention", "sink_full":
		return true
	}
	return false
}

// groupMix is folded into engine hashes so that KV-cache groups of one
// replica keep separate engine-hash spaces. Group 0 (and none) leaves the
// hashes as they are.
func groupMix(g *int) uint64 {
	if g == nil || *g == 0 {
		return 0
	}
	return uint64(*g+1) * fib
}

func unsupportedExtras(extra [][]kvevents.ExtraKey) bool {
	for _, blk := range extra {
		for _, x := range blk {
			if x.Kind == kvevents.ExtraMultimodal || x.Kind == kvevents.ExtraPromptEmbeds {
				return true
			}
		}
	}
	return false
}

// hasZeroHash reports whether a hash of hs, mixed with group mix g, is 0,
// which the index reserves.
func hasZeroHash(hs []uint64, g uint64) bool {
	for _, h := range hs {
		if h^g == 0 {
			return true
		}
	}
	return false
}

// rootOf returns the Root of a chain that e starts (its parent is the root),
// falling back to block 0's extra keys for the LoRA name and the salt.
func rootOf(r *replica, e *kvevents.BlockStored) (Root, bool) {
	root := Root{Model: r.model, LoRA: e.LoRAName, CacheSalt: e.CacheSalt}
	if (root.LoRA == "" || root.CacheSalt == "") && len(e.ExtraKeys) > 0 {
		for _, x := range e.ExtraKeys[0] {
			switch {
			case x.Kind == kvevents.ExtraLoRA && root.LoRA == "":
				root.LoRA = x.Value
			case x.Kind == kvevents.ExtraCacheSalt && root.CacheSalt == "":
				root.CacheSalt = x.Value
			}
		}
	}
	if root.LoRA == "" && e.LoRAID != nil && *e.LoRAID != 0 {
		return root, false
	}
	return root, true
}

// applyStored applies one BlockStored to rank st of r, GPU or CPU tier.
// The caller holds r.mu.
//
// The engine's blocks are a run of tokens continuing the chain at the
// parent; own blocks are cut from that run at multiples of the index's block
// size, carrying an unfinished own block over in the engine block's entry
// (engAux.partial), so any ratio of the two block sizes works. A CPU store
// without tokens is an offload of blocks the GPU tier knows (applyOffload).
func (ix *Index) applyStored(r *replica, st *rankState, e *kvevents.BlockStored) {
	n := len(e.BlockHashes)
	tier := tierOf(e.Medium)
	switch {
	case tier == tierOther:
		ix.skip(SkipMedium, 1)
		return
	case !fullAttention(e.KVCacheSpecKind):
		ix.skip(SkipAttentionKind, 1)
		return
	case n == 0:
		return
	case len(e.TokenIDs) == 0 && tier == tierCPU:
		ix.applyOffload(r, st, e)
		return
	case len(e.TokenIDs) == 0:
		ix.skip(SkipNoTokens, 1)
		return
	case e.BlockSize <= 0 || len(e.TokenIDs) != e.BlockSize*n:
		ix.skip(SkipTokenCount, 1)
		return
	case unsupportedExtras(e.ExtraKeys):
		ix.skip(SkipExtraKeys, 1)
		return
	}
	g := groupMix(e.GroupIdx)
	if hasZeroHash(e.BlockHashes, g) {
		ix.skip(SkipZeroHash, 1)
		return
	}
	state, part, atRoot, why := ix.chainStart(r, st, e, tier, g)
	if why != "" {
		ix.skip(why, 1)
		return
	}
	r.stored[tier] += int64(n)
	bs, es := ix.hasher.size(), e.BlockSize
	for j, h := range e.BlockHashes {
		toks := e.TokenIDs[j*es : (j+1)*es]
		keys := r.keys[:0]
		if len(part) > 0 {
			if need := bs - len(part); len(toks) >= need {
				state = blockKey2(state, part, toks[:need], &r.join)
				keys = append(keys, state)
				toks = toks[need:]
				part = part[:0]
			}
		}
		for len(toks) >= bs {
			state = blockKey(state, toks[:bs])
			keys = append(keys, state)
			toks = toks[bs:]
		}
		part = append(part, toks...)
		if len(keys) > 0 {
			atRoot = false
		}
		if tier == tierGPU {
			ix.record(r, st, h^g, state, keys, part, atRoot)
		} else {
			ix.cpuRecord(r, st, h^g, state, keys, part, atRoot)
		}
		r.keys = keys
	}
	r.part = part
}

// chainStart returns where e's run continues a chain in tier of rank st
// of r: at the root e starts, or at the end of its parent block (see
// chainAt), with the partial own block in r.part's storage; g is e's group
// mix. why is the reason to skip e when there is no such chain. The caller
// holds r.mu.
func (ix *Index) chainStart(r *replica, st *rankState, e *kvevents.BlockStored, tier int, g uint64) (state uint64, part []uint32, atRoot bool, why SkipReason) {
	part = r.part[:0]
	p := e.ParentBlockHash
	if p == nil || *p == 0 {
		root, ok := rootOf(r, e)
		if !ok {
			return 0, part, false, SkipLoRAID
		}
		return root.Seed(), part, true, ""
	}
	state, part, atRoot, ok := st.chainAt(*p^g, tier, part)
	if !ok {
		return 0, part, false, SkipUnknownParent
	}
	return state, part, atRoot, ""
}

// chainAt returns the chain state at the end of engine block eh of st:
// the state word, the partial own block (appended to part), and whether
// the chain is still at its root. A CPU store may continue a chain of its
// own tier (LMCache's chunks) or of the GPU tier. The caller holds the
// replica's mu.
func (st *rankState) chainAt(eh uint64, tier int, part []uint32) (state uint64, _ []uint32, atRoot, ok bool) {
	if tier == tierCPU {
		if b := st.cpu[eh]; b != nil {
			return b.state, append(part, b.part...), b.root, true
		}
	}
	v, ok := st.eng.get(eh)
	if !ok {
		return 0, part, false, false
	}
	if v&auxFlag != 0 {
		a := st.aux[eh]
		part = append(part, a.partial...)
		atRoot = a.root
	}
	return v &^ auxFlag, part, atRoot, true
}

// record stores engine block eh of r: its chain state, the own keys it
// completes and its trailing partial own block. Storing a block again is
// idempotent. The caller holds r.mu.
func (ix *Index) record(r *replica, st *rankState, eh, state uint64, keys []uint64, part []uint32, atRoot bool) {
	old, existed := st.eng.get(eh)
	var oldKeys []uint64
	var one [1]uint64
	if existed {
		if old&auxFlag == 0 {
			one[0] = old
			oldKeys = one[:]
		} else {
			oldKeys = st.aux[eh].own
		}
		for _, k := range oldKeys {
			if !contains(keys, k) {
				ix.release(r, k) // the block changed content: rare, but keep pairs exact
			}
		}
	}
	for _, k := range keys {
		switch ix.kt.add(k, r.id, false) {
		case addedNew:
			r.entries.Add(1)
		case addedConfirm:
			ix.confirm(r, k)
		case addedExisting:
			// Another engine block of r already maps to k (a re-stored
			// block maps to its own keys and is not counted).
			if !contains(oldKeys, k) {
				if r.dup == nil {
					r.dup = map[uint64]int32{}
				}
				r.dup[k]++
			}
		}
	}
	if r.cpu.n > 0 {
		r.cpu.touch(keys) // a GPU store of an offloaded block: the engine loaded it back
	}
	v := state
	if len(keys) != 1 || len(part) > 0 {
		v |= auxFlag
		if st.aux == nil {
			st.aux = map[uint64]*engAux{}
		}
		a := st.aux[eh]
		if a == nil {
			a = new(engAux)
			st.aux[eh] = a
		}
		a.own = append(a.own[:0], keys...)
		a.partial = append(a.partial[:0], part...)
		a.root = atRoot && len(keys) == 0
	} else if existed && old&auxFlag != 0 {
		delete(st.aux, eh)
	}
	if !existed && st.eng.full() {
		ix.purge(r, st)
	}
	st.eng.put(eh, v)
	if !existed {
		r.engN.Add(1)
	}
}

func contains(s []uint64, k uint64) bool {
	for _, x := range s {
		if x == k {
			return true
		}
	}
	return false
}

// purge drops, before the engine table of r's rank st grows, the engine
// blocks of r (every rank) none of whose own keys r still holds: their
// entries were evicted for capacity, so the chain is broken there anyway.
// This bounds engine tables by the entries the index keeps rather than by
// what the engines hold. It runs only when evictions happened since the
// last purge, and forces st's table to grow when it freed little, so its
// cost stays amortized O(1) per stored block. The caller holds r.mu.
func (ix *Index) purge(r *replica, st *rankState) {
	ev := ix.kt.evictions.Load()
	if ev == r.purgedAt {
		return
	}
	r.purgedAt = ev
	for _, rs := range r.ranks {
		ix.purgeRank(r, rs)
	}
	r.countEngine()
	if st.eng.len()*2*loadDen > len(st.eng.s)*loadNum {
		st.eng.resize(len(st.eng.s) + len(st.eng.s)/2)
	}
}

func (ix *Index) purgeRank(r *replica, st *rankState) {
	var stale []uint64
	st.eng.all(func(k, v uint64) {
		if v&auxFlag == 0 {
			if !ix.kt.holds(v, r.id) {
				stale = append(stale, k)
			}
			return
		}
		a := st.aux[k]
		if len(a.own) == 0 {
			if !a.root && !ix.kt.holds(v&^auxFlag, r.id) {
				stale = append(stale, k)
			}
			return
		}
		for _, o := range a.own {
			if ix.kt.holds(o, r.id) {
				return
			}
		}
		stale = append(stale, k)
	})
	for _, k := range stale {
		v, _ := st.eng.del(k)
		own := []uint64{v}
		if v&auxFlag != 0 {
			own = st.aux[k].own
			delete(st.aux, k)
		}
		for _, o := range own {
			if d := r.dup[o]; d > 1 {
				r.dup[o] = d - 1
			} else if d == 1 {
				delete(r.dup, o)
			}
		}
	}
}

// applyRemoved applies one BlockRemoved to rank st of r. The caller
// holds r.mu.
func (ix *Index) applyRemoved(r *replica, st *rankState, e *kvevents.BlockRemoved) {
	tier := tierOf(e.Medium)
	if tier == tierOther {
		ix.skip(SkipMedium, 1)
		return
	}
	r.removed[tier] += int64(len(e.BlockHashes))
	g := groupMix(e.GroupIdx)
	for _, h := range e.BlockHashes {
		eh := h ^ g
		if eh == 0 {
			continue
		}
		if tier == tierCPU {
			if !ix.cpuRemove(r, st, eh) {
				ix.unknownRemovals.Add(1)
			}
			continue
		}
		v, ok := st.eng.del(eh)
		if !ok {
			ix.unknownRemovals.Add(1)
			continue
		}
		r.engN.Add(-1)
		if v&auxFlag == 0 {
			ix.release(r, v)
			continue
		}
		for _, o := range st.aux[eh].own {
			ix.release(r, o)
		}
		delete(st.aux, eh)
	}
}
