package kvevents

import (
	"math/rand/v2"
	"time"
)

// backoff is a capped exponential reconnect delay with jitter: each wait
// is drawn uniformly from [d/2, d] where d doubles from min up to max, so
// gateways that lost the same publisher at the same moment do not
// reconnect in lockstep. The zero value is not valid; set min and max.
type backoff struct {
	min, max time.Duration
	cur      time.Duration // the next wait's upper bound; 0 means min
}

// next returns the next wait and doubles the bound.
func (b *backoff) next() time.Duration {
	if b.cur < b.min {
		b.cur = b.min
	}
	d := b.cur
	b.cur = min(2*b.cur, b.max)
	return d/2 + rand.N(d/2+1)
}

// reset starts the next wait from min again, after a success.
func (b *backoff) reset() { b.cur = b.min }
