package blockindex

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// expireBatch bounds the speculative pairs one lookup or one Apply call
// expires, so that a burst of expiries cannot stall a request.
const expireBatch = 4096

// specFloor is the fewest slots a replica's speculative deadlines shrink
// to (32 KiB): they fill with a prompt's keys and empty as its events
// confirm them, and should not be rebuilt on every prompt.
const specFloor = 2048

// specKey names one speculative (key, replica) pair.
type specKey struct {
	key uint64
	id  uint32
}

// specBatch is the deadline of one AddSpeculative call's pairs in the
// expiry heap: one item per call, not per pair, so a 1,000-block prompt
// costs one heap push and one pop. Batches are never updated in place: a
// refresh adds a new batch, and a pair whose deadline in its replica's
// specDeadlines is later than its batch's (or that has none: it was
// confirmed) is skipped when the batch expires.
type specBatch struct {
	deadline int64 // Unix nanoseconds
	id       uint32
	keys     []uint64 // the pairs the call made or refreshed speculative
	done     int      // keys[:done] are expired already
}

// specState tracks the deadlines of speculative pairs; each replica keeps
// its pairs' latest deadlines (replica.specDeadlines), under mu. A pair
// leaves them when it is confirmed, so they hold only the pairs still
// awaiting their events (a few prompts' worth), and the expiry of a
// confirmed pair costs one miss in a small table. Lock order: replica.mu,
// then specState.mu, then shard locks.
type specState struct {
	mu   sync.Mutex
	heap []*specBatch // guarded by mu; min-heap on deadline
	// next is the earliest deadline in heap, math.MaxInt64 when empty, so
	// that lookups can skip expiry (and the clock) with one atomic load.
	next atomic.Int64
}

func (sp *specState) push(b *specBatch) {
	h := append(sp.heap, b)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if h[p].deadline <= h[i].deadline {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	sp.heap = h
}

func (sp *specState) pop() {
	h := sp.heap
	last := len(h) - 1
	h[0] = h[last]
	h[last] = nil
	h = h[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && h[l].deadline < h[m].deadline {
			m = l
		}
		if r < len(h) && h[r].deadline < h[m].deadline {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	sp.heap = h
	if len(h) == 0 && cap(h) > 1024 {
		sp.heap = nil // let a burst's backing array go
	}
}

// publishNext updates next from the heap. The caller holds mu.
func (sp *specState) publishNext() {
	if len(sp.heap) == 0 {
		sp.next.Store(math.MaxInt64)
		return
	}
	sp.next.Store(sp.heap[0].deadline)
}

// AddSpeculative marks keys as held by replica until a KV event confirms
// them (they then become ordinary entries) or ttl passes (they then vanish).
// Call it after routing a request, with the request's keys, to cover the lag
// between routing and the engine's BlockStored events. A key the replica
// already holds for real is left as it is; adding a speculative key again
// extends its deadline. Lookups count speculative entries and report them in
// Hit.Speculative. A ttl ≤ 0 adds nothing.
//
// Expired entries are dropped by the next call to Apply, Match or Stats
// (at most expireBatch of them by one Apply or Match), not by
// AddSpeculative, which does only its own call's work; a Match that runs
// while another call holds the expiry lock may still count entries that
// expired meanwhile.
func (ix *Index) AddSpeculative(replica string, keys []uint64, ttl time.Duration) {
	if ttl <= 0 || len(keys) == 0 {
		return
	}
	r, err := ix.reg.intern(replica)
	if err != nil {
		ix.skip(SkipReplicaLimit, 1)
		return
	}
	now := ix.now().UnixNano()
	deadline := now + int64(ttl)
	if deadline < now {
		deadline = math.MaxInt64
	}
	b := &specBatch{deadline: deadline, id: r.id, keys: make([]uint64, 0, len(keys))}
	sp := &ix.spec
	sp.mu.Lock()
	defer sp.mu.Unlock()
	r.specDeadlines.floor = specFloor
	for _, k := range keys {
		if k = k & keyMask; k == 0 {
			continue
		}
		switch ix.kt.add(k, r.id, true) {
		case addedNew: // no deadline to compare with: one table probe
			r.entries.Add(1)
			r.spec.Add(1)
		case addedRefused:
			continue // held for real: nothing to expire
		default:
			if d, ok := r.specDeadlines.get(k); ok && d >= deadline {
				continue
			}
		}
		r.specDeadlines.put(k, deadline)
		b.keys = append(b.keys, k)
	}
	if len(b.keys) > 0 {
		sp.push(b)
	}
	sp.publishNext()
}

// maybeExpire drops due speculative entries, at most expireBatch of them,
// once the earliest is grace nanoseconds past due, unless another
// goroutine holds the expiry lock (it then does the work).
func (ix *Index) maybeExpire(grace int64) {
	next := ix.spec.next.Load()
	if next == math.MaxInt64 {
		return
	}
	now := ix.now().UnixNano()
	if now-grace < next || !ix.spec.mu.TryLock() {
		return
	}
	ix.expireLocked(now, expireBatch)
	ix.spec.mu.Unlock()
}

// expireLocked drops speculative pairs whose deadline is ≤ now, at most
// limit of them (limit < 0: all). The caller holds ix.spec.mu.
func (ix *Index) expireLocked(now int64, limit int) {
	sp := &ix.spec
	for len(sp.heap) > 0 && sp.heap[0].deadline <= now && limit != 0 {
		b := sp.heap[0]
		for ; b.done < len(b.keys) && limit != 0; b.done++ {
			limit--
			ix.expirePair(specKey{b.keys[b.done], b.id}, now)
		}
		if b.done == len(b.keys) {
			sp.pop()
		}
	}
	sp.publishNext()
}

// expirePair drops the speculative pair sk unless it was confirmed,
// cleared or refreshed past now. The caller holds ix.spec.mu.
func (ix *Index) expirePair(sk specKey, now int64) {
	r := ix.reg.byID(sk.id)
	if r == nil {
		return
	}
	d, ok := r.specDeadlines.get(sk.key)
	if !ok || d > now {
		return // confirmed, cleared, or refreshed
	}
	r.specDeadlines.del(sk.key)
	if removed, _ := ix.kt.remove(sk.key, sk.id, true); removed {
		ix.expired.Add(1)
		r.entries.Add(-1)
		r.spec.Add(-1)
	}
}

// confirm records that r's speculative pair for k became real: it leaves
// r's deadlines, so that its expiry does nothing. Between the key table's
// confirmation and this, the pair may have been evicted for capacity and
// speculated again; only AddSpeculative makes speculative pairs, under
// ix.spec.mu, so a pair found not speculative under that lock has no
// live deadline to lose, and one found speculative keeps its new one.
func (ix *Index) confirm(r *replica, k uint64) {
	r.spec.Add(-1)
	ix.confirmed.Add(1)
	ix.spec.mu.Lock()
	if !ix.kt.heldSpec(k, r.id) {
		r.specDeadlines.del(k)
	}
	ix.spec.mu.Unlock()
}

// clearSpeculative drops every speculative pair of r. The caller holds r.mu
// (not ix.spec.mu).
func (ix *Index) clearSpeculative(r *replica) {
	sp := &ix.spec
	sp.mu.Lock()
	defer sp.mu.Unlock()
	r.specDeadlines.all(func(k uint64, _ int64) {
		if removed, spec := ix.kt.remove(k, r.id, true); removed {
			r.entries.Add(-1)
			if spec {
				r.spec.Add(-1)
			}
		}
	})
	r.specDeadlines = u64Map[int64]{floor: specFloor}
}
