package gateway

import (
	"context"
	"time"
)

// bindingFlusher writes session bindings to Redis off the response path,
// in batches: one goroutine takes every key queued while its last write
// was in flight (at most flushBatch) and writes them in one pipelined
// round trip (session.Store.FlushAll). An idle gateway writes each binding
// at once; a loaded one, whose round trips slow down, puts more bindings
// in each, for one system call each way. At 1,000 short turns a second the
// four one-write-each workers it replaces spent 18 % of the gateway's CPU
// writing (warmpath overhead --cpuprofile: setNX under workers.Run).
type bindingFlusher struct {
	keys    chan string
	flush   func(ctx context.Context, keys []string) error
	failed  func() // counts a batch whose write failed
	timeout time.Duration
	// finish is how long Run keeps writing queued keys after its context
	// ends (writes worth landing on shutdown).
	finish time.Duration
}

// Batching of binding writes.
const (
	flushBatch   = 256
	flushBacklog = 4096
)

// add queues key's binding for writing; with the backlog full it writes
// it at once rather than lose it.
func (f *bindingFlusher) add(key string) {
	select {
	case f.keys <- key:
	default:
		f.write(context.Background(), []string{key})
	}
}

// Run writes queued bindings until ctx ends, then the backlog for up to
// finish.
func (f *bindingFlusher) Run(ctx context.Context) error {
	batch := make([]string, 0, flushBatch)
	for {
		select {
		case <-ctx.Done():
			f.drain(ctx, batch)
			return nil
		case k := <-f.keys:
			f.write(ctx, f.take(append(batch[:0], k)))
		}
	}
}

// take appends what is queued now to batch, up to flushBatch keys.
func (f *bindingFlusher) take(batch []string) []string {
	for len(batch) < flushBatch {
		select {
		case k := <-f.keys:
			batch = append(batch, k)
		default:
			return batch
		}
	}
	return batch
}

// write writes one batch, bounded by the Redis timeout.
func (f *bindingFlusher) write(ctx context.Context, keys []string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.timeout)
	defer cancel()
	if err := f.flush(ctx, keys); err != nil {
		f.failed()
	}
}

// drain writes what is queued when Run's context ends, for up to finish.
func (f *bindingFlusher) drain(ctx context.Context, batch []string) {
	for deadline := time.Now().Add(f.finish); time.Now().Before(deadline); {
		if batch = f.take(batch[:0]); len(batch) == 0 {
			return
		}
		f.write(ctx, batch)
	}
}
