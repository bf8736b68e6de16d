package routing

import (
	"testing"

	"github.com/warmpath/warmpath/kvevents"
)

// The generated-blocks detector needs genRun one-block stores chaining
// from each other on one rank; a prompt's multi-block store, a chain
// split over ranks or a CPU offload does not count.
func TestGenDetector(t *testing.T) {
	stored := func(parent uint64, medium string, hashes ...uint64) kvevents.Event {
		return &kvevents.BlockStored{BlockHashes: hashes, ParentBlockHash: &parent, Medium: medium}
	}
	batch := func(rank int, evs ...kvevents.Event) kvevents.Batch {
		return kvevents.Batch{Events: evs, DPRank: &rank}
	}
	var d genDetector
	d.observe("r", batch(0, stored(1, "GPU", 2, 3, 4)))              // a prompt
	d.observe("r", batch(0, stored(4, "GPU", 5)))                    // its boundary block
	d.observe("r", batch(1, stored(5, "GPU", 6)))                    // another rank: a chain of its own
	d.observe("r", batch(0, stored(5, "CPU", 6), stored(9, "", 10))) // an offload; an unrelated block
	if d.seen("r") {
		t.Fatal("seen before a run of two")
	}
	d.observe("r", batch(0, stored(5, "GPU", 6))) // the boundary block's successor: decoding
	if !d.seen("r") || d.seen("other") {
		t.Errorf("seen(r) = %v, seen(other) = %v; want true, false", d.seen("r"), d.seen("other"))
	}
	d.forget("r")
	if d.seen("r") {
		t.Error("seen after forget")
	}
}
