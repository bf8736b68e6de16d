package routing

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// flushLog records a flusher's writes: when each started and its keys.
type flushLog struct {
	mu    sync.Mutex
	at    []time.Duration
	keys  [][]string
	start time.Time
}

func (l *flushLog) flush(_ context.Context, keys []string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.at = append(l.at, time.Since(l.start))
	l.keys = append(l.keys, slices.Clone(keys))
	return nil
}

func TestBindingFlusherSpacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &flushLog{start: time.Now()}
		f := &bindingFlusher{keys: make(chan string, flushBacklog), flush: log.flush, failed: func() { t.Error("a write failed") },
			timeout: time.Second, spacing: func() time.Duration { return 5 * time.Millisecond }, finish: time.Second}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = f.Run(ctx); close(done) }()

		f.add("a") // after a quiet spacing: written at once
		synctest.Wait()
		time.Sleep(time.Millisecond)
		f.add("b") // within the spacing: waits for it, with what follows
		time.Sleep(time.Millisecond)
		f.add("c")
		time.Sleep(10 * time.Millisecond)
		f.add("d") // a quiet spacing later: at once again
		synctest.Wait()
		time.Sleep(time.Millisecond)
		f.add("e") // waiting out the spacing when the context ends: written then
		synctest.Wait()
		cancel()
		<-done

		want := [][]string{{"a"}, {"b", "c"}, {"d"}, {"e"}}
		if !slices.EqualFunc(log.keys, want, slices.Equal) {
			t.Fatalf("writes %v, want %v", log.keys, want)
		}
		wantAt := []time.Duration{0, 5 * time.Millisecond, 12 * time.Millisecond, 13 * time.Millisecond}
		if !slices.Equal(log.at, wantAt) {
			t.Errorf("writes started at %v, want %v", log.at, wantAt)
		}
	})
}

func TestBindingFlusherNoSpacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &flushLog{start: time.Now()}
		f := &bindingFlusher{keys: make(chan string, flushBacklog), flush: log.flush, failed: func() { t.Error("a write failed") },
			timeout: time.Second, finish: time.Second}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = f.Run(ctx); close(done) }()
		for _, k := range []string{"a", "b"} {
			f.add(k)
			synctest.Wait()
			time.Sleep(time.Millisecond)
		}
		cancel()
		<-done
		if want := [][]string{{"a"}, {"b"}}; !slices.EqualFunc(log.keys, want, slices.Equal) {
			t.Fatalf("writes %v, want %v", log.keys, want)
		}
	})
}

// Unset, the binding writer's spacing follows whether other gateways are
// seen (20 ms alone, 5 ms beside them); a set spacing holds either way,
// and a negative one is none.
func TestBindingSpacing(t *testing.T) {
	peers := 0
	seen := func() int { return peers }
	auto := bindingSpacing(0, seen)
	if got := auto(); got != DefaultBindingWriteSpacing {
		t.Errorf("alone: %v; want %v", got, DefaultBindingWriteSpacing)
	}
	peers = 1
	if got := auto(); got != PeerBindingWriteSpacing {
		t.Errorf("beside a peer: %v; want %v", got, PeerBindingWriteSpacing)
	}
	if got := bindingSpacing(50*time.Millisecond, seen)(); got != 50*time.Millisecond {
		t.Errorf("set 50ms beside a peer: %v", got)
	}
	if got := bindingSpacing(-time.Millisecond, seen)(); got != 0 {
		t.Errorf("set negative: %v; want 0", got)
	}
}
