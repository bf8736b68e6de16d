//go:build linux

package kvevents

import (
	"context"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// readiness wakes its loop for a message sent to a watched socket, also
// one sent while nobody waited, releases sockets no longer watched, and
// ends a wait when its context does.
func TestReadinessWakesForMessages(t *testing.T) {
	zctx := newZCtx(t)
	pull, _, err := openSocket(zctx, zmq.PULL, "tcp://127.0.0.1:*", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pull.Close()
	ep, err := pull.GetLastEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	push, _, err := openSocket(zctx, zmq.PUSH, ep, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer push.Close()

	ctx, cancel := context.WithCancel(t.Context())
	rd, err := newReadiness(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.close()
	if err := rd.sync([]*zmq.Socket{pull}); err != nil {
		t.Fatal(err)
	}
	// receive waits for the readiness to say pull may be readable, as
	// runLoop does, until a message is there, and returns it. The
	// deadline is a failure bound, not a pace: a wait that ends by it
	// without a message fails.
	receive := func() string {
		t.Helper()
		for {
			if ok, err := readable(pull); err != nil {
				t.Fatal(err)
			} else if ok {
				msg, err := pull.Recv(zmq.DONTWAIT)
				if err != nil {
					t.Fatal(err)
				}
				return msg
			}
			deadline := time.Now().Add(10 * time.Second)
			if err := rd.wait(deadline); err != nil {
				t.Fatal(err)
			}
			if !time.Now().Before(deadline) {
				t.Fatal("no wake for a message sent to a watched socket")
			}
		}
	}
	for _, want := range []string{"one", "two", "three"} {
		if _, err := push.Send(want, 0); err != nil {
			t.Fatal(err)
		}
		if got := receive(); got != want {
			t.Fatalf("received %q; want %q", got, want)
		}
	}
	// Two sent before anyone waits are both read after one wake.
	for _, m := range []string{"four", "five"} {
		if _, err := push.Send(m, 0); err != nil {
			t.Fatal(err)
		}
	}
	if a, b := receive(), receive(); a != "four" || b != "five" {
		t.Fatalf("received %q, %q; want four, five", a, b)
	}
	// Released sockets are no longer watched.
	if err := rd.sync(nil); err != nil {
		t.Fatal(err)
	}
	if len(rd.watches) != 0 {
		t.Errorf("%d watches after syncing to none", len(rd.watches))
	}
	if err := rd.sync([]*zmq.Socket{pull}); err != nil {
		t.Fatal(err)
	}
	// A wait with nothing to read ends when the context does.
	done := make(chan error, 1)
	go func() { done <- rd.wait(time.Time{}) }()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a wait ended by its context returned no error")
		}
	case <-time.After(10 * time.Second): // a failure bound
		t.Fatal("a wait outlived its context")
	}
}

// A wait with nothing to read ends at its wake time without an error.
func TestReadinessWaitEndsAtWake(t *testing.T) {
	rd, err := newReadiness(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer rd.close()
	wake := time.Now().Add(20 * time.Millisecond)
	if err := rd.wait(wake); err != nil {
		t.Fatal(err)
	}
	if time.Now().Before(wake) {
		t.Error("the wait ended before its wake time")
	}
}
