//go:build !linux

package kvevents

import (
	"context"
	"errors"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// readiness, off Linux, watches nothing: sync reports every socket
// unwatchable, so the run loop looks at its sockets every pollInterval
// (the Linux build parks in the poller on an epoll set of the sockets'
// ZMQ_FDs instead).
type readiness struct{ ctx context.Context }

func newReadiness(ctx context.Context) (*readiness, error) { return &readiness{ctx: ctx}, nil }

func (r *readiness) sync(socks []*zmq.Socket) error {
	if len(socks) == 0 {
		return nil
	}
	return errors.ErrUnsupported
}

// wait blocks until wake passes (never, when zero) or the context ends.
func (r *readiness) wait(wake time.Time) error {
	var timer <-chan time.Time
	if !wake.IsZero() {
		t := time.NewTimer(max(0, time.Until(wake)))
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-r.ctx.Done():
		return r.ctx.Err()
	case <-timer:
		return nil
	}
}

func (r *readiness) close() {}
