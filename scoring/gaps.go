package scoring

import "math"

// Bins of SessionStats.
const (
	// gapBins are log2-spaced bins of inter-turn gaps: bin 0 holds gaps
	// below minGap, bin j gaps in [minGap·2^(j−1), minGap·2^j), the last
	// everything above.
	gapBins = 18
	minGap  = 0.25 // seconds
	// turnBins count turn indices 1…turnBins, the last also every later
	// turn.
	turnBins = 48
	// statsMemory is the decay per observation: about the last 2,000
	// observations count.
	statsMemory = 0.9995
)

// SessionStats describes a model's conversations as routing sees them:
// the gaps between a conversation's turns (from the end of one to the
// start of the next) and how many turns conversations reach. The cache-
// placement term reads it: a conversation placed where its prefix will
// not survive its next gap pays a full prefill on that turn. The zero
// value knows nothing (and makes the term 0). It does no I/O, reads no
// clock and is not safe for concurrent use; a Calibrator guards its own.
type SessionStats struct {
	gaps  [gapBins]float64
	turns [turnBins]float64
}

// ObserveGap records a gap of seconds between two turns.
func (s *SessionStats) ObserveGap(seconds float64) {
	if !(seconds >= 0) || math.IsInf(seconds, 0) {
		return
	}
	for i := range s.gaps {
		s.gaps[i] *= statsMemory
	}
	s.gaps[gapBin(seconds)]++
}

// ObserveTurn records that a conversation reached its turn-th turn (1 for
// its first).
func (s *SessionStats) ObserveTurn(turn int) {
	if turn < 1 {
		return
	}
	for i := range s.turns {
		s.turns[i] *= statsMemory
	}
	s.turns[min(turn, turnBins)-1]++
}

func gapBin(seconds float64) int {
	if seconds < minGap {
		return 0
	}
	return min(gapBins-1, 1+int(math.Log2(seconds/minGap)))
}

// Survival returns the fraction of gaps longer than tau seconds,
// interpolating within a bin in log time; 0 without observations.
func (s *SessionStats) Survival(tau float64) float64 {
	var total float64
	for _, c := range s.gaps {
		total += c
	}
	if total <= 0 {
		return 0
	}
	if math.IsInf(tau, 1) {
		return 0
	}
	b := gapBin(max(tau, 0))
	var above float64
	for _, c := range s.gaps[b+1:] {
		above += c
	}
	// The part of tau's own bin above tau.
	frac := 1.0
	if b > 0 && b < gapBins-1 {
		lo := minGap * math.Exp2(float64(b-1))
		frac = 1 - math.Log2(tau/lo)
	} else if b == 0 {
		frac = 1 - max(tau, 0)/minGap
	}
	return min(1, (above+s.gaps[b]*max(0, min(1, frac)))/total)
}

// Remaining returns the expected number of turns a conversation at its
// turn-th turn has still to come: Σ over later turns of the share of
// conversations that reach them; 0 without observations.
func (s *SessionStats) Remaining(turn int) float64 {
	if turn < 1 {
		turn = 1
	}
	k := min(turn, turnBins) - 1
	at := s.turns[k]
	if at <= 0 {
		return 0
	}
	var later float64
	for _, c := range s.turns[k+1:] {
		later += c
	}
	if turn >= turnBins {
		// The last bin holds every later turn, so past it the
		// statistics do not tell how far a conversation goes on: 0.
		// Continuing geometrically (last ÷ before − 1) priced a Future
		// on every late turn of long coding-agent runs and cost them
		// 2–4 points of cache (docs/benchmarks/log/
		// 2026-12-07-agentic-real-two-conversations.md).
		return 0
	}
	return later / at
}

// MeanGap returns the mean gap between turns, seconds, taking each bin's
// gaps as spread evenly in log time (the bin below minGap evenly in
// time, the last from its lower edge to twice it); 0 without
// observations.
func (s *SessionStats) MeanGap() float64 {
	total, sum := s.gaps[0], s.gaps[0]*minGap/2
	lo := minGap // bin j's lower edge, from bin 1
	for _, c := range s.gaps[1:] {
		total += c
		// The mean of a log-uniform spread over [lo, 2lo] is lo ÷ ln 2.
		sum += c * lo / math.Ln2
		lo *= 2
	}
	if total <= 0 {
		return 0
	}
	return sum / total
}

// Lifetime returns how long a conversation is expected to go on from its
// first turn, seconds: its turns still to come times the mean gap before
// each; 0 without observations.
func (s *SessionStats) Lifetime() float64 {
	return s.Remaining(1) * s.MeanGap()
}
