package blockindex

import (
	"slices"
	"sync"
)

// Hit is one candidate replica's match for a request.
type Hit struct {
	// Blocks is the length of the longest run of the request's keys, from
	// key 0, that the replica holds (blocks for an Index, chunks for an
	// Approx).
	Blocks int
	// Speculative is how many of those Blocks the replica holds only
	// speculatively (see Index.AddSpeculative): predicted, not yet confirmed
	// by a KV event.
	Speculative int
	// CPU is how many blocks after those Blocks the replica's CPU tier
	// holds, consecutively: offloaded blocks that a request continuing the
	// GPU prefix would load rather than prefill. Always 0 for an Approx.
	CPU int
}

// matchScratch is per-call scratch space for match, pooled per index.
type matchScratch struct {
	// pos maps a replica id to 1 + the index of the first candidate with
	// that id, or 0. Entries are reset after each call.
	pos []int32
	// ids holds each candidate's replica id, or -1 when unknown.
	ids []int32
	// members is walk's scratch.
	members []int32
}

// match is the lookup shared by Index and Approx. It walks keys in order,
// reading each key's holders once, and stops at the first key that no
// still-active candidate holds. A candidate is active at key i while its
// Blocks equals i. The result is aligned with candidates; unknown names get
// a zero Hit.
func match[R any](kt *keyTable, reg *registry[R], pool *sync.Pool, keys []uint64, candidates []string, dst []Hit) []Hit {
	dst = slices.Grow(dst[:0], len(candidates))[:len(candidates)]
	clear(dst)
	if len(keys) == 0 || len(candidates) == 0 {
		return dst
	}
	snap := reg.snap.Load()
	sc, _ := pool.Get().(*matchScratch)
	if sc == nil {
		sc = new(matchScratch)
	}
	if len(sc.pos) < len(snap.byID) {
		sc.pos = make([]int32, len(snap.byID)+len(snap.byID)/4+8)
	}
	sc.ids = slices.Grow(sc.ids[:0], len(candidates))
	pos := sc.pos
	active := 0
	for j, name := range candidates {
		id, ok := snap.ids[name]
		if !ok {
			sc.ids = append(sc.ids, -1)
			continue
		}
		sc.ids = append(sc.ids, int32(id))
		if pos[id] != 0 {
			continue // a duplicate name: copied from its first occurrence below
		}
		pos[id] = int32(j + 1)
		active++
	}
	if active > 0 {
		walk(kt, keys, pos, dst, sc)
	}
	for j, id := range sc.ids {
		if id < 0 {
			continue
		}
		if c := pos[id]; c != 0 && int(c) != j+1 {
			dst[j] = dst[c-1]
		}
	}
	for _, id := range sc.ids {
		if id >= 0 {
			pos[id] = 0
		}
	}
	pool.Put(sc)
	return dst
}

// walk is the loop of match. A run of keys with the same holder set as the
// key before it (the common case: a conversation's blocks stay on the same
// replicas until the conversations sharing them diverge) is only counted,
// and credited to the candidates that matched the run's first key when the
// run ends.
func walk(kt *keyTable, keys []uint64, pos []int32, dst []Hit, sc *matchScratch) {
	members := sc.members[:0] // candidates that matched the last key visited
	var prev snapshot         // that key's holders
	run := 0                  // keys since then with the same holders
	credit := func() {
		for _, m := range members {
			h := &dst[m>>1]
			h.Blocks += run
			if m&1 != 0 {
				h.Speculative += run
			}
		}
		run = 0
	}
	for i, k := range keys {
		sn := kt.readFast(k & keyMask) // keys from outside AppendKeys may use all 64 bits
		if len(members) > 0 && sn.sameHolders(prev) {
			run++
			sn.touch()
			continue
		}
		if run > 0 {
			credit()
		}
		members = members[:0]
		if sn.hold&holdOvf == 0 {
			for h := sn.hold; h != 0; h >>= descBits {
				members = visit(pos, dst, i, uint32(h&descMask), members)
			}
		} else {
			for _, d := range sn.rec.d {
				members = visit(pos, dst, i, d, members)
			}
		}
		if len(members) == 0 {
			break
		}
		prev = sn
		sn.touch()
	}
	if run > 0 {
		credit()
	}
	sc.members = members
}

// visit extends the hit of the candidate named by holder descriptor d, if it
// is still matching at key i, and appends it to members as index<<1 | spec.
func visit(pos []int32, dst []Hit, i int, d uint32, members []int32) []int32 {
	id := int(d&descID) - 1
	if id < 0 || id >= len(pos) {
		return members
	}
	c := pos[id]
	if c == 0 {
		return members
	}
	h := &dst[c-1]
	if h.Blocks != i {
		return members
	}
	h.Blocks = i + 1
	m := (c - 1) << 1
	if d&descSpec != 0 {
		h.Speculative++
		m |= 1
	}
	return append(members, m)
}
