package periodic

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestEvery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		var n atomic.Int32
		done := make(chan struct{})
		go func() {
			defer close(done)
			Every(ctx, time.Second, func() { n.Add(1) })
		}()
		synctest.Wait()
		if n := n.Load(); n != 0 {
			t.Fatalf("%d calls before the first tick; want 0", n)
		}
		time.Sleep(3*time.Second + time.Millisecond)
		synctest.Wait()
		if n := n.Load(); n != 3 {
			t.Fatalf("%d calls after 3 ticks; want 3", n)
		}
		cancel()
		<-done
		time.Sleep(5 * time.Second)
		if n := n.Load(); n != 3 {
			t.Fatalf("%d calls after cancel; want 3", n)
		}
	})
}
