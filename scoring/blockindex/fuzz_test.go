package blockindex

import (
	"fmt"
	"testing"
	"time"

	"github.com/warmpath/warmpath/kvevents"
)

// fuzzDoc is one conversation a fuzzed engine can store.
type fuzzDoc struct {
	tokens []uint32
	salt   string
}

// fuzzRanks is the number of data-parallel ranks of each fuzzed replica.
// Its ranks hash alike, so they store the same engine hashes.
const fuzzRanks = 2

// fuzzModel is a reference model of an Index: per replica and rank, the
// engine blocks stored on GPU and on CPU (engine hash → doc and block), and
// per replica the speculative keys with their deadlines. A key is held by
// a replica when a GPU engine block of any rank completes it or a
// speculative entry for it is still alive; its CPU tier holds the keys its
// CPU engine blocks complete.
type fuzzModel struct {
	ours    int
	engines []engine
	docs    []fuzzDoc
	keys    [][]uint64 // per doc, our keys
	hashes  [][][]uint64
	stored  [][fuzzRanks]map[uint64][2]int // replica, rank → engine hash → {doc, block}
	cpu     [][fuzzRanks]map[uint64][2]int // the same, CPU tier
	spec    []map[uint64]time.Time
	capped  bool // the index has a capacity the model ignores
}

func (m *fuzzModel) heldIn(tier [][fuzzRanks]map[uint64][2]int, r int, k uint64) bool {
	for _, blocks := range tier[r] {
		for _, db := range blocks {
			from, to := m.completes(r, db[1])
			for j := from; j < to; j++ {
				if m.keys[db[0]][j] == k {
					return true
				}
			}
		}
	}
	return false
}

// completes returns the indexes of our blocks completed by engine block i.
func (m *fuzzModel) completes(r, i int) (from, to int) {
	e := m.engines[r].blockSize
	return i * e / m.ours, (i + 1) * e / m.ours
}

func (m *fuzzModel) real(r int, k uint64) bool { return m.heldIn(m.stored, r, k) }

func (m *fuzzModel) held(r int, k uint64, now time.Time) (held, spec bool) {
	if m.real(r, k) {
		return true, false
	}
	if d, ok := m.spec[r][k]; ok && d.After(now) {
		return true, true
	}
	return false, false
}

// FuzzApply feeds random sequences of events, speculative adds, clears and
// clock steps, built from the fuzz input, to an Index and to a reference
// model, and checks after every step that Match agrees with the model for
// every conversation and replica, and that the counters add up.
func FuzzApply(f *testing.F) {
	f.Add([]byte{0, 0, 1, 2, 0, 0, 0, 12, 4, 7, 0})
	f.Add([]byte{1, 3, 4, 5, 0, 1, 1, 0, 6, 1, 0, 1, 1, 3, 4, 2, 2, 2, 0, 3, 1, 4})
	f.Add([]byte{2, 2, 1, 0, 4, 0, 0, 9, 5, 1, 1, 5, 1, 30, 0, 0, 1, 2, 12, 3, 3, 1})
	f.Add([]byte{3, 5, 0, 4, 0, 2, 2, 0, 12, 12, 6, 2, 1, 2, 0, 5, 10, 4, 2, 3, 6, 0, 2, 3})
	f.Add([]byte{4, 1, 1, 1, 0, 0, 4, 0, 6, 3, 0, 0, 4, 6, 2, 3, 6, 1, 0, 2, 1, 7, 0, 4, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		pos := 0
		next := func() int {
			if pos >= len(data) {
				return 0
			}
			pos++
			return int(data[pos-1])
		}
		const total = 48
		sizes := []int{4, 6, 8, 12, 16, 24}
		m := &fuzzModel{ours: []int{4, 8, 16, 12, 6}[next()%5]}
		for r := range 3 {
			m.engines = append(m.engines, engine{seed: uint64(r + 1), blockSize: sizes[next()%len(sizes)]})
			m.stored = append(m.stored, [fuzzRanks]map[uint64][2]int{{}, {}})
			m.cpu = append(m.cpu, [fuzzRanks]map[uint64][2]int{{}, {}})
			m.spec = append(m.spec, map[uint64]time.Time{})
		}
		d0 := randTokens(1, total)
		m.docs = []fuzzDoc{
			{tokens: d0},
			{tokens: concat(d0[:16], randTokens(2, total-16))},
			{tokens: concat(d0[:32], randTokens(3, total-32))},
			{tokens: randTokens(4, total)},
			{tokens: d0, salt: "tenant"},
		}
		// One input in four runs with a tiny capacity: evictions and engine
		// table purges then make the index hold less than the model, never
		// more.
		maxEntries := 0
		if c := next(); c%4 == 0 {
			maxEntries = 8 + c%32
		}
		m.capped = maxEntries > 0
		clk := newFakeClock()
		names := []string{"r0", "r1", "r2"}
		ix := newIndex(t, Config{BlockSize: m.ours, Now: clk.Now, MaxEntries: maxEntries}, names...)
		if m.capped {
			for _, n := range names {
				if err := ix.SetCPUCapacity(n, 1+maxEntries%8); err != nil { // CPU evictions too
					t.Fatal(err)
				}
			}
		}
		for _, d := range m.docs {
			m.keys = append(m.keys, ix.Keys(d.tokens, Root{Model: "m", CacheSalt: d.salt}))
		}
		m.hashes = make([][][]uint64, len(m.engines))
		for r, e := range m.engines {
			for _, d := range m.docs {
				ee := e
				if d.salt != "" {
					ee.seed ^= 0x5a17 // the engine hashes the salt into block 0 too
				}
				m.hashes[r] = append(m.hashes[r], ee.hashes(d.tokens))
			}
		}
		eventFor := func(r, d, from, to int) *kvevents.BlockStored {
			e := m.engines[r].blockSize
			ev := &kvevents.BlockStored{
				BlockHashes: append([]uint64(nil), m.hashes[r][d][from:to]...),
				TokenIDs:    append([]uint32(nil), m.docs[d].tokens[from*e:to*e]...),
				BlockSize:   e,
				Medium:      "GPU",
			}
			if from > 0 {
				ev.ParentBlockHash = ptr(m.hashes[r][d][from-1])
			} else {
				ev.CacheSalt = m.docs[d].salt
			}
			return ev
		}

		for step := 0; step < 200 && pos < len(data); step++ {
			op := next() % 10
			r := next() % len(names)
			d := next() % len(m.docs)
			n := total / m.engines[r].blockSize
			rank := (op + d) % fuzzRanks // no input byte: old corpus entries keep their meaning
			rb := func(evs ...kvevents.Event) kvevents.Batch {
				return kvevents.Batch{Events: evs, DPRank: ptr(rank)}
			}
			var what string
			switch op {
			case 0: // store engine blocks [from, to) in events of per blocks
				from, count, per := next()%n, 1+next()%n, 1+next()%4
				to := min(n, from+count)
				what = fmt.Sprintf("store r%d/%d doc%d [%d,%d) by %d", r, rank, d, from, to, per)
				b := rb()
				for i := from; i < to; i += per {
					j := min(to, i+per)
					b.Events = append(b.Events, eventFor(r, d, i, j))
					// The model applies the event if its parent is the root or
					// a block the rank holds.
					if i == 0 || hasHash(m.stored[r][rank], m.hashes[r][d][i-1]) {
						for k := i; k < j; k++ {
							m.stored[r][rank][m.hashes[r][d][k]] = [2]int{d, k}
							from, to := m.completes(r, k)
							for _, key := range m.keys[d][from:to] {
								delete(m.spec[r], key) // confirmed
							}
						}
					}
				}
				ix.Apply(names[r], b)
			case 1: // remove one engine block
				i := next() % n
				what = fmt.Sprintf("remove r%d/%d doc%d block %d", r, rank, d, i)
				h := m.hashes[r][d][i]
				delete(m.stored[r][rank], h)
				ix.Apply(names[r], rb(&kvevents.BlockRemoved{BlockHashes: []uint64{h}, Medium: "GPU"}))
			case 2, 3: // reset, subscriber clear of the rank or of the replica
				m.stored[r][rank] = map[uint64][2]int{}
				m.spec[r] = map[uint64]time.Time{}
				switch {
				case op == 2:
					what = fmt.Sprintf("reset r%d/%d", r, rank)
					ix.Apply(names[r], rb(&kvevents.AllBlocksCleared{}))
				case d%2 == 0:
					what = fmt.Sprintf("clear r%d/%d", r, rank)
					m.cpu[r][rank] = map[uint64][2]int{}
					ix.ClearRank(names[r], rank)
				default:
					what = fmt.Sprintf("clear r%d", r)
					m.stored[r] = [fuzzRanks]map[uint64][2]int{{}, {}}
					m.cpu[r] = [fuzzRanks]map[uint64][2]int{{}, {}}
					ix.Clear(names[r])
				}
			case 4: // speculative prefix
				cnt, ttl := next()%(len(m.keys[d])+1), time.Duration(1+next()%4)*time.Second
				what = fmt.Sprintf("speculative r%d doc%d %d keys for %v", r, d, cnt, ttl)
				now := clk.Now()
				for _, k := range m.keys[d][:cnt] {
					// The index refuses to mark a key it holds for real as
					// speculative; with a capacity it may have evicted the
					// key and accept, so a capped model records every add
					// to stay an upper bound.
					if m.real(r, k) && !m.capped {
						continue
					}
					dl := now.Add(ttl)
					if old, ok := m.spec[r][k]; ok && old.After(now) && old.After(dl) {
						dl = old
					}
					m.spec[r][k] = dl
				}
				ix.AddSpeculative(names[r], m.keys[d][:cnt], ttl)
			case 5:
				step := time.Duration(next()) * 50 * time.Millisecond
				what = fmt.Sprintf("advance %v", step)
				clk.Advance(step)
			case 6: // malformed or foreign events: no effect
				i := next() % n
				ev := eventFor(r, d, i, min(n, i+1))
				switch next() % 4 {
				case 0:
					ev.TokenIDs = ev.TokenIDs[1:]
				case 1:
					ev.Medium = "STORAGE"
				case 2:
					ev.ParentBlockHash = ptr(uint64(0xdead))
				case 3:
					ev.KVCacheSpecKind = "sliding_window"
				}
				what = fmt.Sprintf("malformed r%d doc%d block %d", r, d, i)
				ix.Apply(names[r], kvevents.Batch{Events: []kvevents.Event{ev}})
			case 7:
				what = "check"
			case 8: // offload engine blocks [from, to) to CPU (no tokens)
				from := next() % n
				to := min(n, from+1+next()%n)
				what = fmt.Sprintf("offload r%d/%d doc%d [%d,%d)", r, rank, d, from, to)
				for k := from; k < to; k++ {
					h := m.hashes[r][d][k]
					if db, ok := m.stored[r][rank][h]; ok {
						m.cpu[r][rank][h] = db // else unknown, and skipped
					}
				}
				ix.Apply(names[r], rb(&kvevents.BlockStored{
					BlockHashes: append([]uint64(nil), m.hashes[r][d][from:to]...),
					BlockSize:   m.engines[r].blockSize, Medium: kvevents.MediumCPU,
				}))
			case 9: // CPU removal of one engine block
				i := next() % n
				what = fmt.Sprintf("cpu remove r%d/%d doc%d block %d", r, rank, d, i)
				h := m.hashes[r][d][i]
				delete(m.cpu[r][rank], h)
				ix.Apply(names[r], rb(&kvevents.BlockRemoved{BlockHashes: []uint64{h}, Medium: "CPU"}))
			}
			if debugFuzz {
				t.Logf("step %d: %s", step, what)
			}
			check(t, ix, m, names, clk.Now(), step, what)
		}
	})
}

const debugFuzz = false

func hasHash(m map[uint64][2]int, h uint64) bool {
	_, ok := m[h]
	return ok
}

// check compares every replica's match for every conversation, and the
// entry counts, with the model.
func check(t *testing.T, ix *Index, m *fuzzModel, names []string, now time.Time, step int, what string) {
	t.Helper()
	var entries int64
	for r := range names {
		seen := map[uint64]bool{}
		for d := range m.docs {
			want := Hit{}
			for _, k := range m.keys[d] {
				held, spec := m.held(r, k, now)
				if !held {
					break
				}
				want.Blocks++
				if spec {
					want.Speculative++
				}
			}
			got := ix.Match(m.keys[d], names[r:r+1], nil)[0]
			// The CPU tier continues the GPU run the index found.
			for _, k := range m.keys[d][min(got.Blocks, len(m.keys[d])):] {
				if !m.heldIn(m.cpu, r, k) {
					break
				}
				want.CPU++
			}
			if m.capped {
				if got.Blocks > want.Blocks || got.Speculative > got.Blocks || got.CPU > want.CPU {
					t.Fatalf("step %d (%s): r%d doc%d: Match = %+v; model holds only %+v", step, what, r, d, got, want)
				}
			} else if got != want {
				t.Fatalf("step %d (%s): r%d doc%d: Match = %+v; model says %+v", step, what, r, d, got, want)
			}
			for _, k := range m.keys[d] {
				if held, _ := m.held(r, k, now); held && !seen[k] {
					seen[k] = true
					entries++
				}
			}
		}
	}
	st := checkCounts(t, ix)
	if m.capped {
		if st.Entries > entries {
			t.Fatalf("step %d (%s): index holds %d entries; model only %d", step, what, st.Entries, entries)
		}
	} else if st.Entries != entries {
		t.Fatalf("step %d (%s): index holds %d entries; model %d", step, what, st.Entries, entries)
	}
}
