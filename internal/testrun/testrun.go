// Package testrun runs a component's blocking Run(ctx) for the lifetime of
// a test: started in the background, canceled when the test ends, and
// joined, failing the test if Run returned an error other than the
// context's or did not return in time. It is the one copy of that helper
// the tests of gateway, fleet, kvevents and vllmsim share. Eventually is
// likewise their one poll-until-a-condition-holds helper.
//
// The package keeps no state; each call owns one goroutine, joined at
// cleanup.
package testrun

import (
	"context"
	"errors"
	"testing"
	"time"
)

// joinTimeout bounds how long cleanup waits for Run to return after the
// cancel: a component that does not stop is a bug the test reports.
const joinTimeout = 10 * time.Second

// Start runs run(ctx) in the background until the test ends (or stop is
// called, which is idempotent), then checks that it returned nil or the
// context's error.
func Start(t testing.TB, name string, run func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var joined bool
	stop = func() {
		if joined {
			return
		}
		joined = true
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("%s: Run = %v; want nil or context.Canceled", name, err)
			}
		case <-time.After(joinTimeout):
			t.Errorf("%s: Run did not return within %v of cancel", name, joinTimeout)
		}
	}
	t.Cleanup(stop)
	return stop
}
