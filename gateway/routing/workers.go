package routing

import (
	"context"
	"time"
)

// workers runs jobs queued by the request path on a fixed pool of
// goroutines, so the work (a tokenization, a Redis write) costs the
// request nothing. A full backlog refuses new jobs: the caller decides
// whether to drop the job or do it itself.
type workers struct {
	n    int
	jobs chan func(context.Context)
	// finish, when positive, is how long the pool keeps running queued jobs
	// after its context ends (writes worth landing on shutdown); zero drops
	// them.
	finish time.Duration
}

// newWorkers returns a pool of n goroutines (once Run) with a backlog of
// queued jobs.
func newWorkers(n, backlog int, finish time.Duration) *workers {
	return &workers{n: n, jobs: make(chan func(context.Context), backlog), finish: finish}
}

// try queues job, or reports false when the backlog is full.
func (w *workers) try(job func(context.Context)) bool {
	select {
	case w.jobs <- job:
		return true
	default:
		return false
	}
}

// Run runs the pool until ctx ends, then the queued jobs for up to finish.
func (w *workers) Run(ctx context.Context) error {
	done := make(chan struct{})
	for range w.n {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				select {
				case <-ctx.Done():
					return
				case job := <-w.jobs:
					job(ctx)
				}
			}
		}()
	}
	for range w.n {
		<-done
	}
	if w.finish > 0 {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.finish)
		defer cancel()
		for fctx.Err() == nil {
			select {
			case job := <-w.jobs:
				job(fctx)
			default:
				return nil
			}
		}
	}
	return nil
}
