package kvevents

import (
	"fmt"
	"os"
	"sync"

	zmq "github.com/pebbe/zmq4"
	"golang.org/x/sys/unix"
)

// readiness wakes a run loop when any of its zmq sockets may have
// something to read, through Go's netpoller instead of zmq_poll. libzmq
// signals a socket's pending commands and messages on a descriptor of its
// own (ZMQ_FD); readiness watches a duplicate of it (closing ours leaves
// libzmq's open) with one goroutine per socket, parked in the runtime's
// poller, that signals ready. So no goroutine waits in a blocking cgo call.
//
// Measured on an idle gateway in front of four simulated replicas (its
// CPU time from /proc/PID/stat over 20 s, no requests, warmpath serve
// against warmpath sim): 36–39 ms of CPU a second with a zmq_poll loop
// per replica waking every 50 ms (the runtime's sysmon thread, retaking
// each P blocked in the cgo call, spun at its shortest sleep), 16 with
// those loops waking every 500 ms, 17 with this watcher, which wakes for
// messages only (what is left is the metrics scrapes and health checks).
//
// ZMQ_FD says libzmq has commands to process, not that a message waits,
// and stays readable until libzmq takes them (in any call on the socket).
// The loop therefore asks each socket (readable, which also lets libzmq
// take its commands) before waiting, and after every wake. A watcher
// checks the descriptor's level before it parks (the runtime's poller
// forgets an edge that came while nobody waited), and hands each signal
// over before it looks again, so a descriptor the loop has not yet served
// costs one spare wake, not a spin.
type readiness struct {
	ready   chan struct{} // capacity 1: signals coalesce
	done    chan struct{} // closed by close: watchers stop handing over
	watches map[*zmq.Socket]*os.File
	wg      sync.WaitGroup
}

func newReadiness() *readiness {
	return &readiness{ready: make(chan struct{}, 1), done: make(chan struct{}), watches: map[*zmq.Socket]*os.File{}}
}

// sync watches exactly socks: sockets new to it are watched, those no
// longer among them released. It returns the first socket it could not
// watch (it is left unwatched; the caller wakes on a timer for it).
func (r *readiness) sync(socks []*zmq.Socket) error {
	for sock, f := range r.watches {
		if !containsSocket(socks, sock) {
			f.Close() // its watcher's wait ends
			delete(r.watches, sock)
		}
	}
	var first error
	for _, sock := range socks {
		if _, ok := r.watches[sock]; ok {
			continue
		}
		f, err := watchable(sock)
		if err != nil {
			first = cmpErr(first, err)
			continue
		}
		r.watches[sock] = f
		r.wg.Add(1)
		go r.watch(f)
	}
	return first
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

// watchable returns a pollable duplicate of sock's ZMQ_FD.
func watchable(sock *zmq.Socket) (*os.File, error) {
	fd, err := sock.GetFd()
	if err != nil {
		return nil, fmt.Errorf("zmq fd: %w", err)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup zmq fd: %w", err)
	}
	// libzmq's descriptor is non-blocking already; the flag is shared with
	// the duplicate, which os.NewFile needs to register it with the poller.
	if err := unix.SetNonblock(dup, true); err != nil {
		unix.Close(dup)
		return nil, fmt.Errorf("zmq fd non-blocking: %w", err)
	}
	return os.NewFile(uintptr(dup), "zmq-fd"), nil
}

// pending reports whether fd is readable now, without reading it.
func pending(fd uintptr) bool {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(pfd, 0)
	return err == nil && n > 0 && pfd[0].Revents != 0
}

// watch signals ready whenever f is readable, until f is closed or the
// readiness is.
func (r *readiness) watch(f *os.File) {
	defer r.wg.Done()
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	for {
		// Read returns once the callback reports f readable, parking in
		// the poller between calls.
		if err := rc.Read(pending); err != nil {
			return // closed, or not pollable (sync's caller then uses its timer)
		}
		select {
		case r.ready <- struct{}{}:
		case <-r.done:
			return
		}
	}
}

// close releases every watch and waits for the watchers to end.
func (r *readiness) close() {
	close(r.done)
	for sock, f := range r.watches {
		f.Close()
		delete(r.watches, sock)
	}
	r.wg.Wait()
}

// readable reports whether sock has a message to read now (ZMQ_EVENTS).
func readable(sock *zmq.Socket) (bool, error) {
	ev, err := sock.GetEvents()
	return ev&zmq.POLLIN != 0, err
}
