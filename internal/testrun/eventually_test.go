package testrun

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestEventuallyHolds(t *testing.T) {
	var n atomic.Int32
	Eventually(t, 10*time.Second, func() bool { return n.Add(1) >= 5 }, "five polls")
	if got := n.Load(); got != 5 {
		t.Errorf("cond ran %d times; want 5", got)
	}
}

// fatalTB records a Fatalf instead of stopping the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f) // stand in for runtime.Goexit, which would end this test
}

func TestEventuallyTimesOut(t *testing.T) {
	f := &fatalTB{TB: t}
	start := time.Now()
	func() {
		defer func() {
			if r := recover(); r != f {
				panic(r)
			}
		}()
		Eventually(f, 30*time.Millisecond, func() bool { return false }, "the impossible")
		t.Fatal("Eventually returned for a condition that never holds")
	}()
	if !strings.Contains(f.msg, "the impossible") {
		t.Errorf("failure %q does not name what was awaited", f.msg)
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Errorf("failed after %v; want at least the 30ms timeout", d)
	}
}
