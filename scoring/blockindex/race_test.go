//go:build race

package blockindex

// raceEnabled reports whether the race detector is on; sync.Pool drops
// items at random under it, so allocation counts are not meaningful.
const raceEnabled = true
