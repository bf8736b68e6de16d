// Package backoff is the capped exponential delay between retries that
// the KV-event sockets, the session tracking subscription, the Responses
// event writes and the gateway's tokenizer targets share: each wait
// doubles from Min up to Max, and Reset starts again from Min after a
// success.
//
// With Jitter set, each wait is drawn uniformly from [d/2, d] instead of
// being d, so peers that failed at the same moment do not retry in
// lockstep.
//
// A Backoff is not safe for concurrent use: each retry loop owns its own.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Backoff is one retry loop's delay state. The zero value is not valid:
// set Min and Max (and Jitter if wanted).
type Backoff struct {
	Min, Max time.Duration
	Jitter   bool
	cur      time.Duration // the next wait's upper bound; 0 means Min
}

// Next returns the next wait and doubles the bound, up to Max.
func (b *Backoff) Next() time.Duration {
	if b.cur < b.Min {
		b.cur = b.Min
	}
	d := b.cur
	b.cur = min(2*b.cur, b.Max)
	if !b.Jitter {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// Reset starts the next wait from Min again, after a success.
func (b *Backoff) Reset() { b.cur = b.Min }
