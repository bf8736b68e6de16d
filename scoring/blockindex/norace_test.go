//go:build !race

package blockindex

// raceEnabled reports whether the race detector is on.
const raceEnabled = false
