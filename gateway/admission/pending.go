package admission

import (
	"sync/atomic"
	"time"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/tenancy/fairq"
)

// Pending counts one routed request among its class's requests not
// started on the replica it was first sent to, until its first byte or
// its end: the room rule (Capacity.room) counts such requests in the
// replica's queue whatever the last scrape says. Its methods are safe on
// a nil Pending (no queue: nothing is counted).
type Pending struct {
	l       *load
	n       *atomic.Int64 // l.pending of the request's class
	stream  bool
	replica *fleet.Replica
	done    atomic.Bool
	timer   atomic.Pointer[time.Timer] // ends a non-streaming request's count
	// startedAt is the scrape under which its first byte was counted on
	// the replica (noteStarted); zero when it was not.
	startedAt time.Time
}

// Track counts a request of class routed first to rep, one of the model's
// replicas reps, until its first byte or its end, and a non-streaming one
// for two scrape intervals at most (after those a scrape taken since the
// engine saw the request says whether it waits); an interactive request
// also renews (or makes) rep's place in the interactive reserve. A nil
// Capacity tracks nothing and returns nil.
func (c *Capacity) Track(rep *fleet.Replica, reps []*fleet.Replica, class fairq.Class, stream bool, scrapeInterval time.Duration) *Pending {
	if c == nil {
		return nil
	}
	class = min(class, fairq.Background)
	l := c.loadFor(rep)
	p := &Pending{l: l, n: &l.pending[class], stream: stream, replica: rep}
	p.n.Add(1)
	if !stream {
		if scrapeInterval <= 0 {
			scrapeInterval = fleet.DefaultScrapeInterval
		}
		p.timer.Store(time.AfterFunc(2*scrapeInterval, p.End))
	}
	if class == fairq.Interactive {
		c.noteInteractive(rep, reps, time.Now())
	}
	return p
}

// FirstByte is the request's first byte, from answered: a streaming
// request there has left the engine's queue. It reports whether the
// replica's room grew by it (the caller kicks the queue). Before the
// replica's first scrape there is no scraped queue to correct (its
// metrics are stale, so it has no room anyway).
func (p *Pending) FirstByte(answered *fleet.Replica) bool {
	if p == nil {
		return false
	}
	count := p.stream && !p.done.Load() && answered == p.replica
	p.End() // before the re-check, which then sees it started
	if !count {
		return false
	}
	at := p.replica.State().ScrapedAt
	if at.IsZero() {
		return false
	}
	p.startedAt = p.l.noteStarted(at)
	return true
}

// End ends Track's count, once.
func (p *Pending) End() {
	if p != nil && p.done.CompareAndSwap(false, true) {
		p.n.Add(-1)
		if t := p.timer.Load(); t != nil {
			t.Stop()
		}
	}
}

// Finish ends the count at the request's end: once it has finished, the
// replica's in-flight count nets it out.
func (p *Pending) Finish() {
	if p == nil {
		return
	}
	p.End()
	if !p.startedAt.IsZero() {
		p.l.unnoteStarted(p.startedAt)
	}
}
