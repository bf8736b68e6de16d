package scoring

import (
	"math"

	"github.com/cespare/xxhash/v2"
)

// Sizes of a Demand table.
const (
	// demandSlots is how many prefixes a Demand remembers: far more than
	// the shared openings a fleet serves at once (a conversation's own
	// prefix is demanded by its turns alone and soon decays out).
	demandSlots = 1 << demandBits
	demandBits  = 10
	// demandProbe is how many slots a key may occupy: it goes to the
	// first free or matching one, else replaces the least demanded.
	demandProbe = 4
)

// Demand counts, per prefix, the requests of other conversations that
// shared it: each is one request scored with the prefix as the longest any replica held of its
// prompt (a new conversation opening with a shared harness, a sub-agent
// behind its parent's), decayed with time constant horizon, so that a
// prefix's count is its arrival rate times the horizon: as many requests
// as shared it over the last horizon, and, as far as the record tells, as
// will share it over the next. It does no I/O and reads no clock; the
// zero value is empty. It is not safe for concurrent use (a Calibrator
// guards its own) and never allocates.
type Demand struct {
	slots [demandSlots]demandSlot
}

// demandSlot is one prefix's decayed count as of at, and the session
// that observed it last.
type demandSlot struct {
	key       uint64
	count, at float64
	last      uint64
}

// Observe records a request of session sharing the prefix named key at
// now seconds and returns how many earlier requests shared it, decayed
// with time constant horizon seconds (0 or less, or not finite: nothing is
// counted, and nothing recorded). key 0 names no prefix. Sharers are other
// conversations: a request of the session that observed the prefix last
// counts nothing (a conversation whose cache holds a fixed depth of it
// names the same prefix turn after turn, and its own next turns follow
// its binding, not a copy); session 0 is anonymous and always counts.
func (d *Demand) Observe(key, session uint64, now, horizon float64) float64 {
	if key == 0 || !(horizon > 0) || math.IsInf(horizon, 0) || math.IsNaN(now) {
		return 0
	}
	s := d.slot(key, now, horizon)
	if s.key != key {
		*s = demandSlot{key: key, at: now}
	}
	before := s.count * decay(now-s.at, horizon)
	if session != 0 && session == s.last {
		return before
	}
	s.count, s.at, s.last = before+1, max(s.at, now), session
	return before
}

// slot returns key's slot, or the one it should take: a free one, else
// the least demanded among those it may occupy.
func (d *Demand) slot(key uint64, now, horizon float64) *demandSlot {
	h := key * 0x9E3779B97F4A7C15 // Fibonacci hashing spreads nearby keys
	first := int(h >> (64 - demandBits))
	var victim *demandSlot
	for k := range demandProbe {
		s := &d.slots[(first+k)%demandSlots]
		if s.key == key || s.key == 0 {
			return s
		}
		if victim == nil || s.count*decay(now-s.at, horizon) < victim.count*decay(now-victim.at, horizon) {
			victim = s
		}
	}
	return victim
}

// decay is e^(−dt ÷ horizon) for dt ≥ 0, and 1 for a clock that went
// back.
func decay(dt, horizon float64) float64 {
	if !(dt > 0) {
		return 1
	}
	return math.Exp(-dt / horizon)
}

// HeldPrefix returns the key naming the longest prefix of a prompt that
// any replica holds: keys are the prompt's block keys, each naming the
// prefix through its block of blockSize tokens (a chain hash), matched
// each replica's GPU hit in tokens and cpu (nil for none) what its CPU
// offload tier holds after it. A prefix held only in a CPU tier is held:
// the request would load it rather than compute it, and naming the
// GPU's part alone gave a conversation evicted to CPU its harness's
// demand. It returns 0 when no replica holds a whole block.
func HeldPrefix(matched, cpu []int, keys []uint64, blockSize int) uint64 {
	if blockSize <= 0 {
		return 0
	}
	best := 0
	for j, m := range matched {
		if j < len(cpu) {
			m += cpu[j]
		}
		best = max(best, m)
	}
	d := min(best/blockSize, len(keys))
	if d == 0 {
		return 0
	}
	return keys[d-1]
}

// SessionID names a session key for Demand and Calibrator.ObservePrefix:
// 0 for none.
func SessionID(key string) uint64 {
	if key == "" {
		return 0
	}
	return xxhash.Sum64String(key) | 1
}
