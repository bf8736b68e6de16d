package routing

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// A pool that finishes on shutdown runs every job queued before its
// context ended; a full backlog refuses.
func TestWorkersFinishQueuedJobs(t *testing.T) {
	w := newWorkers(2, 3, time.Minute)
	var ran atomic.Int32
	for range 3 {
		if !w.try(func(context.Context) { ran.Add(1) }) {
			t.Fatal("backlog refused a job below its size")
		}
	}
	if w.try(func(context.Context) {}) {
		t.Fatal("a full backlog took a job")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ran.Load(); got != 3 {
		t.Errorf("ran %d jobs; want 3", got)
	}
}
