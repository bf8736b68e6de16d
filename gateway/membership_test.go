package gateway

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/warmpath/warmpath/gateway/admission"
	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/tenancy"
	"github.com/warmpath/warmpath/vllmsim"
)

// A request waiting in the queue through a rolling restart goes to the
// replica that replaced the one it arrived for. One simulated replica at
// 127.0.0.2 behind a DNS name runs one sequence at a time on a stopped
// clock: a session's turn runs there and its next turn queues. The name
// then resolves to a new replica at 127.0.0.3 (same port) and the old one
// stops. The queued turn is answered by the new replica. Before, a queued
// request kept the members of its arrival: it was sent to the replica
// that had left (its last state still read healthy) and failed.
func TestQueuedRequestFollowsMembership(t *testing.T) {
	port := freePort(t, "127.0.0.2", "127.0.0.3")
	clock := newGatedClock()
	oldSim := newSimAt(t, "127.0.0.2", port, vllmsim.Config{Clock: clock, Profile: vllmsim.Profile{MaxNumSeqs: 1}})
	stopOld := testrun.Start(t, "vllmsim old", oldSim.Run)
	newSim := newSimAt(t, "127.0.0.3", port, vllmsim.Config{})
	testrun.Start(t, "vllmsim new", newSim.Run)

	res := &settableResolver{addrs: []string{"127.0.0.2"}}
	var cfg Config
	cfg.Listen = "127.0.0.1:0"
	cfg.Auth.Mode = tenancy.ModeNone
	cfg.Server.PreStop = -1
	cfg.Debug = true
	cfg.Discovery = []fleet.DNSSpec{{Name: "vllm.test", Port: port, Interval: 20 * time.Millisecond}}
	cfg.Health = fleet.HealthConfig{Interval: 50 * time.Millisecond, Timeout: 500 * time.Millisecond, Failures: 2, ScrapeInterval: 50 * time.Millisecond, StaleAfter: 2 * time.Second}
	cfg.Queue.Saturation = admission.Saturation{EngineWaiting: 1, MaxRunning: 1}
	cfg.Queue.RecheckInterval = 20 * time.Millisecond
	rdb := redisFor(t, &cfg)
	gw, err := New(cfg, Options{Redis: rdb, Logger: testLogger(t), Resolver: res})
	if err != nil {
		t.Fatalf("gateway.New: %v", err)
	}
	testrun.Start(t, "gateway", gw.Run)
	url := "http://" + gw.Addr()
	oldName, newName := net.JoinHostPort("127.0.0.2", strconv.Itoa(port)), net.JoinHostPort("127.0.0.3", strconv.Itoa(port))
	// Healthy and serving its model: a replica can pass its health probe
	// before its /v1/models answer is in (turn 1 got 404 model_not_found).
	healthy := func(name string) bool {
		rep := gw.fleet.Replica(name)
		return rep != nil && rep.State().Healthy && len(rep.State().Models) > 0
	}
	testrun.Eventually(t, 10*time.Second, func() bool { return healthy(oldName) }, "the old replica healthy")

	hdr := map[string]string{"X-Session-ID": "rolling"}
	conv := newConversation("you are the rolling session", words("rolling", 200))
	conv.header = hdr
	if got := conv.turn(t, url, "and then?").replica(); got != oldName {
		t.Fatalf("first turn on %s; want %s", got, oldName)
	}
	body := map[string]any{"model": conv.model, "messages": conv.messages, "max_tokens": 4, "ignore_eos": true}
	clock.pause()
	blocker := asyncChat(t.Context(), url, body, hdr)
	queuedNow := func() float64 { return counter(t, gw.obs.reg, "warmpath_queue_depth", nil) }
	testrun.Eventually(t, 10*time.Second, func() bool {
		return counter(t, gw.obs.reg, "warmpath_replica_inflight_requests", map[string]string{"replica": oldName}) == 1
	}, "the session's turn running on "+oldName)
	head := asyncChat(t.Context(), url, body, hdr)
	testrun.Eventually(t, 10*time.Second, func() bool { return queuedNow() == 1 }, "the next turn queued")

	res.set("127.0.0.3")
	testrun.Eventually(t, 10*time.Second, func() bool { return healthy(newName) && gw.fleet.Replica(oldName) == nil }, "the new replica in, the old one out")
	stopOld()
	clock.resume()
	<-blocker // released with its replica's departure: its status is not this test's
	got := <-head
	if got.Status != http.StatusOK || got.replica() != newName {
		t.Fatalf("queued turn: %d on %q (%s); want 200 on %s", got.Status, got.replica(), got.Body, newName)
	}
}

// newSimAt builds a one-replica simulated fleet serving HTTP at
// host:port, with its KV-event sockets on ephemeral ports (a DNS name's
// replicas share one port, so the fleets' KV ports could not be told
// apart: the gateway subscribes to none here).
func newSimAt(t *testing.T, host string, port int, cfg vllmsim.Config) *vllmsim.Fleet {
	t.Helper()
	cfg.Host, cfg.HTTPPort, cfg.ReplayPort = host, port, -1
	if cfg.Speed == 0 {
		cfg.Speed = 50
	}
	f, err := vllmsim.NewFleet(cfg)
	if err != nil {
		t.Fatalf("vllmsim at %s:%d: %v", host, port, err)
	}
	return f
}

// freePort returns a TCP port free just now on every one of hosts. A
// machine whose loopback answers 127.0.0.1 only (not Linux, where all of
// 127/8 is local) skips the test.
func freePort(t *testing.T, hosts ...string) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", net.JoinHostPort(hosts[0], "0"))
		if err != nil {
			t.Skipf("cannot listen on %s: %v", hosts[0], err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		free := true
		for _, h := range hosts[1:] {
			o, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(port)))
			if err != nil {
				free = false
				break
			}
			o.Close()
		}
		l.Close()
		if free {
			return port
		}
	}
	t.Fatalf("no port free on all of %v", hosts)
	return 0
}

// settableResolver answers every name with the addresses last set.
type settableResolver struct {
	mu    sync.Mutex
	addrs []string
}

func (r *settableResolver) set(addrs ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addrs = addrs
}

func (r *settableResolver) LookupHost(context.Context, string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.addrs...), nil
}
