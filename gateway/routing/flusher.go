package routing

import (
	"context"
	"time"
)

// bindingFlusher writes session bindings to Redis off the response path,
// in batches: one goroutine takes every key queued (at most flushBatch)
// and writes them in one pipelined round trip (session.Store.FlushAll).
// Writes start at most once every spacing: a binding made after a quiet
// spacing goes at once, and under load the bindings of one spacing share
// one write, so the gateway pays one round trip per spacing rather than
// one per turn (each costs a wakeup of the writer, a system call each
// way and Redis's own work). Until its write lands, a binding is
// served from this gateway's memory (session.Store.Propose); other
// gateways see it up to one spacing later.
//
// At 1,000 short turns a second, writing each binding as the writer came
// free took 0.66 s of the gateway's CPU per 20,000 turns (warmpath
// overhead --cpuprofile, FlushAll against round-robin's profile, which
// binds nothing); the four one-write-each workers before that, 18 % of
// the gateway's CPU. The spacing was 5 ms until a gateway's CPU was
// measured in a process of its own (warmpath overhead --targets child):
// at 200 turns a second 5 ms wrote each binding on its own, a wake and a
// round trip per turn; at 20 ms an execution trace of 3,000 turns counted
// 77 writer wakes instead of 397, and the gateway's CPU per 1,000 short
// turns at 200/s fell from about 2.0× the plain proxy's to 1.7–1.8×.
type bindingFlusher struct {
	keys    chan string
	flush   func(ctx context.Context, keys []string) error
	failed  func() // counts a batch whose write failed
	timeout time.Duration
	// spacing is the least time between the starts of two writes, asked
	// before each; nil or 0 writes whenever a key is queued and the last
	// write has returned.
	spacing func() time.Duration
	// finish is how long Run keeps writing queued keys after its context
	// ends (writes worth landing on shutdown).
	finish time.Duration
}

// Batching of binding writes.
const (
	flushBatch   = 256
	flushBacklog = 4096
	// DefaultBindingWriteSpacing is routing.binding_write_spacing's
	// default while no other gateway is seen (nobody else reads this
	// one's bindings soon), PeerBindingWriteSpacing while others are (a
	// session's next turn may reach one of them right after this turn).
	DefaultBindingWriteSpacing = 20 * time.Millisecond
	PeerBindingWriteSpacing    = 5 * time.Millisecond
)

// newBindingFlusher returns a flusher writing with flush (bounded by
// timeout), spaced by spacing (see bindingSpacing), calling failed for
// each batch whose write failed; it writes for up to a second after Run's
// context ends.
func newBindingFlusher(flush func(ctx context.Context, keys []string) error, timeout time.Duration, spacing func() time.Duration, failed func()) *bindingFlusher {
	return &bindingFlusher{keys: make(chan string, flushBacklog), flush: flush, failed: failed, timeout: timeout, spacing: spacing, finish: time.Second}
}

// bindingSpacing is the binding writer's spacing: set when
// routing.binding_write_spacing is (negative: none), else the default for
// whether other gateways are seen now.
func bindingSpacing(set time.Duration, peers func() int) func() time.Duration {
	if set != 0 {
		set = max(0, set)
		return func() time.Duration { return set }
	}
	return func() time.Duration {
		if peers() > 0 {
			return PeerBindingWriteSpacing
		}
		return DefaultBindingWriteSpacing
	}
}

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
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			f.drain(ctx, batch)
			return nil
		case k := <-f.keys:
			batch = append(batch[:0], k)
			if !f.space(ctx, last) {
				f.write(ctx, batch)
				f.drain(ctx, batch)
				return nil
			}
			last = time.Now()
			f.write(ctx, f.take(batch))
		}
	}
}

// space waits until spacing has passed since last; false when ctx ended
// first.
func (f *bindingFlusher) space(ctx context.Context, last time.Time) bool {
	if f.spacing == nil {
		return true
	}
	wait := f.spacing() - time.Since(last)
	if wait <= 0 {
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
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
