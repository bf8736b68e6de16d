package testrun

import (
	"testing"
	"time"
)

// Poll intervals of Eventually: the first re-check comes after
// pollFirst, so a condition that holds almost at once is seen almost at
// once; the interval then doubles up to pollMax, so a long wait does not
// keep a loaded CI box's cores (or a Redis the condition queries) busy.
const (
	pollFirst = time.Millisecond
	pollMax   = 10 * time.Millisecond
)

// Eventually polls cond until it returns true, failing the test with what
// (a description of the awaited state) if timeout passes first. cond runs
// on the test's goroutine; inside a synctest bubble the waits are the
// bubble's fake time.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	interval := pollFirst
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(interval)
		interval = min(2*interval, pollMax)
	}
}
