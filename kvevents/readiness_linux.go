//go:build linux

package kvevents

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"golang.org/x/sys/unix"
)

// readiness wakes a run loop when any of its zmq sockets may have
// something to read, through Go's netpoller instead of zmq_poll. libzmq
// signals a socket's pending commands and messages on a descriptor of its
// own (ZMQ_FD); readiness puts a duplicate of each (closing ours leaves
// libzmq's open) in an epoll instance of its own, level-triggered, and
// that epoll descriptor in the runtime's poller: the loop's goroutine
// parks there itself, so no goroutine waits in a blocking cgo call and a
// message costs the loop one wake.
//
// Measured on an idle gateway in front of four simulated replicas (its
// CPU time from /proc/PID/stat over 20 s, no requests, warmpath serve
// against warmpath sim): 36–39 ms of CPU a second with a zmq_poll loop
// per replica waking every 50 ms (the runtime's sysmon thread, retaking
// each P blocked in the cgo call, spun at its shortest sleep), 16 with
// those loops waking every 500 ms, 17 with a watcher goroutine per
// socket, which wakes for messages only (what is left is the metrics
// scrapes and health checks). Under load the watchers cost three wakes
// a message (the poller woke the watcher, the watcher the loop, the loop
// the watcher blocked on handing over the next signal); the epoll set
// costs one: `warmpath overhead --policies warmpath --shapes short=1000
// --trace FILE` counted 2,920 watcher and 2,916 hand-over wakes in 3,000
// requests, which this removes.
//
// ZMQ_FD says libzmq has commands to process, not that a message waits,
// and stays readable until libzmq takes them (in any call on the socket).
// The loop therefore asks each socket (readable, which also lets libzmq
// take its commands) before waiting, and after every wake. The wait
// checks the epoll set's level (epoll_wait without blocking) before it
// parks, after the poller has been armed, so an edge that came while the
// loop was serving is not lost.
type readiness struct {
	ep      *os.File // the epoll instance, registered with the poller
	rc      syscall.RawConn
	watches map[*zmq.Socket]int // socket → the duplicate of its ZMQ_FD in ep
	stop    func() bool         // unregisters the close on ctx's end
}

// newReadiness returns a readiness whose waits end with ctx.
func newReadiness(ctx context.Context) (*readiness, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("kvevents: epoll: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("kvevents: epoll non-blocking: %w", err)
	}
	ep := os.NewFile(uintptr(fd), "zmq-epoll")
	rc, err := ep.SyscallConn()
	if err != nil {
		ep.Close()
		return nil, fmt.Errorf("kvevents: epoll: %w", err)
	}
	r := &readiness{ep: ep, rc: rc, watches: map[*zmq.Socket]int{}}
	// Closing the descriptor ends a wait at once; epoll_ctl and epoll_wait
	// run under the descriptor's reference (RawConn), so a close never
	// races them onto a reused number.
	r.stop = context.AfterFunc(ctx, func() { ep.Close() })
	return r, nil
}

// sync watches exactly socks: sockets new to it are watched, those no
// longer among them released. It returns the first socket it could not
// watch (it is left unwatched; the caller wakes on a timer for it).
func (r *readiness) sync(socks []*zmq.Socket) error {
	for sock, fd := range r.watches {
		if !containsSocket(socks, sock) {
			r.control(func(ep int) error { return unix.EpollCtl(ep, unix.EPOLL_CTL_DEL, fd, nil) })
			unix.Close(fd)
			delete(r.watches, sock)
		}
	}
	var first error
	for _, sock := range socks {
		if _, ok := r.watches[sock]; ok {
			continue
		}
		fd, err := watchable(sock)
		if err == nil {
			ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
			if err = r.control(func(ep int) error { return unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &ev) }); err != nil {
				unix.Close(fd)
			}
		}
		if err != nil {
			first = cmpErr(first, err)
			continue
		}
		r.watches[sock] = fd
	}
	return first
}

// control runs f on the epoll descriptor while it is held open.
func (r *readiness) control(f func(ep int) error) error {
	var ferr error
	if err := r.rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return fmt.Errorf("kvevents: epoll: %w", err)
	}
	if ferr != nil {
		return fmt.Errorf("kvevents: epoll_ctl: %w", ferr)
	}
	return nil
}

// wait blocks until a watched socket's descriptor is readable, wake
// passes (never, when zero) or the context given to newReadiness ends
// (then it returns an error).
func (r *readiness) wait(wake time.Time) error {
	if err := r.ep.SetReadDeadline(wake); err != nil {
		return fmt.Errorf("kvevents: epoll: %w", err)
	}
	var evs [1]unix.EpollEvent
	var werr error
	err := r.rc.Read(func(fd uintptr) bool {
		n, err := unix.EpollWait(int(fd), evs[:], 0)
		if err != nil && err != unix.EINTR {
			werr = err
		}
		return n > 0 || werr != nil
	})
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil
	case err != nil:
		return fmt.Errorf("kvevents: epoll: %w", err)
	case werr != nil:
		return fmt.Errorf("kvevents: epoll_wait: %w", werr)
	}
	return nil
}

// close releases every watch and the epoll instance.
func (r *readiness) close() {
	r.stop()
	for sock, fd := range r.watches {
		unix.Close(fd)
		delete(r.watches, sock)
	}
	r.ep.Close()
}

func containsSocket(socks []*zmq.Socket, s *zmq.Socket) bool {
	for _, x := range socks {
		if x == s {
			return true
		}
	}
	return false
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// watchable returns a duplicate of sock's ZMQ_FD.
func watchable(sock *zmq.Socket) (int, error) {
	fd, err := sock.GetFd()
	if err != nil {
		return -1, fmt.Errorf("zmq fd: %w", err)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("dup zmq fd: %w", err)
	}
	return dup, nil
}
