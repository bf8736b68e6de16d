// Package periodic runs a function on a ticker until a context ends: the
// one copy of the loop the Responses lease renewals, the tenancy lease
// renewal and the JWKS reload share. Loops that do more in their select
// (a final flush on cancel, a second channel, the tick's time) keep their
// own.
package periodic

import (
	"context"
	"time"
)

// Every calls fn every d until ctx ends, first after d (not at once). fn
// runs on the caller's goroutine, so a slow fn delays the next call rather
// than overlapping it (the ticker drops the ticks it missed).
func Every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}
