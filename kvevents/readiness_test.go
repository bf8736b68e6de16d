package kvevents

import (
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// readiness wakes its loop for a message sent to a watched socket, also
// one sent while nobody waited, and releases its watchers on close.
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

	rd := newReadiness()
	if err := rd.sync([]*zmq.Socket{pull}); err != nil {
		t.Fatal(err)
	}
	// receive waits for the readiness to say pull may be readable, as
	// runLoop does, until a message is there, and returns it.
	receive := func() string {
		t.Helper()
		deadline := time.After(10 * time.Second) // a failure bound, not a pace
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
			select {
			case <-rd.ready:
			case <-deadline:
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
	// Released sockets are no longer watched; close ends every watcher.
	if err := rd.sync(nil); err != nil {
		t.Fatal(err)
	}
	if len(rd.watches) != 0 {
		t.Errorf("%d watches after syncing to none", len(rd.watches))
	}
	if err := rd.sync([]*zmq.Socket{pull}); err != nil {
		t.Fatal(err)
	}
	rd.close() // returns once its watchers have
	if len(rd.watches) != 0 {
		t.Errorf("%d watches after close", len(rd.watches))
	}
}
