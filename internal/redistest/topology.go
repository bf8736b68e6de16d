package redistest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Kind names a Redis topology.
type Kind string

// The topologies a gateway supports.
const (
	// Single is one redis-server: the shared one of .ci/run (Shared) or a
	// private process (StartTopology).
	Single Kind = "single"
	// Cluster is six cluster-enabled nodes: three masters, each with a
	// replica, with a node timeout of one second.
	Cluster Kind = "cluster"
	// Sentinel is a master, one replica and three sentinels (quorum two)
	// monitoring it as MasterName, declaring it down after one second.
	Sentinel Kind = "sentinel"
)

// Kinds lists every topology, in the order Each runs them.
var Kinds = []Kind{Single, Cluster, Sentinel}

// MasterName is the name the sentinels of a Sentinel topology monitor.
const MasterName = "warmpath"

// EnvTopologies names the environment variable that narrows Each to some
// topologies (comma-separated kinds, such as "single" for a quick local
// run). Under CI=true it is ignored: every topology runs.
const EnvTopologies = "WARMPATH_TEST_TOPOLOGIES"

// Topology is a running Redis deployment on loopback. Its processes are
// owned by the test (StartTopology) or the test binary (Shared) that
// started it; the shared single server of .ci/run is owned by neither.
type Topology struct {
	Kind Kind
	// Addrs are what a client is given: the server (Single), every node
	// (Cluster) or the sentinels (Sentinel).
	Addrs []string
	// MasterName is set for Sentinel.
	MasterName string

	mu    sync.Mutex
	procs map[string]*Server // by address; guarded by mu
}

// Options returns client options for the topology, as the gateway's
// redis.addrs and redis.master_name configure them.
func (tp *Topology) Options() *redis.UniversalOptions {
	o := &redis.UniversalOptions{Addrs: slices.Clone(tp.Addrs), MasterName: tp.MasterName,
		DialTimeout: time.Second, ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second}
	if tp.Kind == Cluster {
		o.IsClusterMode = true
	}
	return o
}

// NewClient returns a new client of the topology; the caller closes it.
// A cluster client reloads its slot map every second, as the gateway's
// does: go-redis reloads it on MOVED but not when a dead master refuses
// the dial, so its default minute would outlast a failover.
func (tp *Topology) NewClient() redis.UniversalClient {
	if tp.Kind == Cluster {
		o := tp.Options().Cluster()
		o.ClusterStateReloadInterval = time.Second
		return redis.NewClusterClient(o)
	}
	return redis.NewUniversalClient(tp.Options())
}

// Client returns a client of the topology and a key prefix unique to this
// test. Every key under the prefix, on every master, is deleted when the
// test ends.
func (tp *Topology) Client(t testing.TB) (redis.UniversalClient, string) {
	t.Helper()
	c := tp.NewClient()
	prefix := "t" + randomHex(6) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = ScanAll(ctx, c, prefix+"*", func(k string) error { return c.Del(ctx, k).Err() })
		c.Close()
	})
	return c, prefix
}

// ScanAll calls fn for every key matching pattern: on each master of a
// cluster, on the one server otherwise. A key may be reported more than
// once (SCAN's guarantee). The masters are scanned concurrently
// (ForEachMaster), but fn is called by one goroutine at a time.
func ScanAll(ctx context.Context, c redis.UniversalClient, pattern string, fn func(key string) error) error {
	var mu sync.Mutex // serializes fn
	scan := func(ctx context.Context, n redis.Cmdable) error {
		iter := n.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			err := fn(iter.Val())
			mu.Unlock()
			if err != nil {
				return err
			}
		}
		return iter.Err()
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	}
	return scan(ctx, c)
}

// Kill SIGKILLs the process serving addr (a node of a Cluster, the master
// or replica of a Sentinel topology). It fails the test for an address
// the topology does not own.
func (tp *Topology) Kill(t testing.TB, addr string) {
	t.Helper()
	tp.mu.Lock()
	s := tp.procs[addr]
	tp.mu.Unlock()
	if s == nil {
		t.Fatalf("redistest: %s is not a process of this %s topology", addr, tp.Kind)
	}
	s.Stop()
}

// Master returns the address of the master serving key now: the one
// server (Single), the master of key's slot (Cluster) or the master the
// sentinels name (Sentinel).
func (tp *Topology) Master(ctx context.Context, key string) (string, error) {
	switch tp.Kind {
	case Cluster:
		// Ask each live node in turn: a dead one refuses the dial.
		slot, last := Slot(key), error(nil)
		for _, a := range tp.Addrs {
			c := redis.NewClient(&redis.Options{Addr: a, DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
			slots, err := c.ClusterSlots(ctx).Result()
			c.Close()
			if err != nil {
				last = err
				continue
			}
			for _, r := range slots {
				if slot >= int(r.Start) && slot <= int(r.End) && len(r.Nodes) > 0 {
					return r.Nodes[0].Addr, nil
				}
			}
			last = fmt.Errorf("redistest: %s serves no master for slot %d", a, slot)
		}
		return "", last
	case Sentinel:
		for _, a := range tp.Addrs {
			s := redis.NewSentinelClient(&redis.Options{Addr: a, DialTimeout: time.Second})
			hp, err := s.GetMasterAddrByName(ctx, tp.MasterName).Result()
			s.Close()
			if err == nil && len(hp) == 2 {
				return net.JoinHostPort(hp[0], hp[1]), nil
			}
		}
		return "", fmt.Errorf("redistest: no sentinel names a master")
	}
	return tp.Addrs[0], nil
}

// Slot returns the cluster hash slot of key (CRC16 of its hash tag, or of
// the whole key, modulo 16384).
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

func (tp *Topology) stop() {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for _, s := range tp.procs {
		s.Stop()
	}
}

// StartTopology starts a private topology of kind, owned by the test and
// stopped when it ends: for tests that kill or restart servers.
func StartTopology(t testing.TB, kind Kind) *Topology {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		unavailable(t, "redis-server not on PATH")
	}
	tp, err := startTopology(kind, t.TempDir())
	if err != nil {
		unavailable(t, "start %s topology: %v", kind, err)
	}
	t.Cleanup(tp.stop)
	return tp
}

func startTopology(kind Kind, dir string) (*Topology, error) {
	switch kind {
	case Single:
		tp := &Topology{Kind: Single, procs: map[string]*Server{}}
		s, err := spawn(dir, "single", nil)
		if err != nil {
			return nil, err
		}
		tp.procs[s.Addr] = s
		tp.Addrs = []string{s.Addr}
		return tp, nil
	case Cluster:
		return startCluster(dir)
	case Sentinel:
		return startSentinel(dir)
	}
	return nil, fmt.Errorf("unknown topology %q", kind)
}

// shared holds the topologies started once per test binary (one package's
// tests) by Shared and stopped by Main: starting a six-node cluster per
// test would cost CI minutes.
var shared struct {
	mu    sync.Mutex
	dir   string
	tops  map[Kind]*Topology
	errs  map[Kind]error
	owned bool // Main runs, so shared processes are stopped
}

// Shared returns the test binary's topology of kind, starting it on first
// use. Single is the server of .ci/run (WARMPATH_TEST_REDIS). Cluster and
// Sentinel processes live until Main's m.Run returns, so a package that
// uses them calls Main from its TestMain.
func Shared(t testing.TB, kind Kind) *Topology {
	t.Helper()
	if kind == Single {
		return &Topology{Kind: Single, Addrs: []string{Addr(t)}}
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.owned {
		t.Fatalf("redistest: Shared(%s) needs TestMain to call redistest.Main", kind)
	}
	if tp := shared.tops[kind]; tp != nil {
		return tp
	}
	if err := shared.errs[kind]; err != nil {
		unavailable(t, "%s topology: %v", kind, err)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		unavailable(t, "redis-server not on PATH")
	}
	dir := filepath.Join(shared.dir, string(kind))
	tp, err := startTopology(kind, dir)
	if err != nil {
		shared.errs[kind] = err
		unavailable(t, "%s topology: %v", kind, err)
	}
	shared.tops[kind] = tp
	return tp
}

// Main runs the tests of a package that uses Shared or Each and stops the
// topologies they started: func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }.
func Main(m *testing.M) int {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "redistest:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	shared.mu.Lock()
	shared.dir, shared.owned = dir, true
	shared.tops, shared.errs = map[Kind]*Topology{}, map[Kind]error{}
	shared.mu.Unlock()
	defer func() {
		shared.mu.Lock()
		defer shared.mu.Unlock()
		for _, tp := range shared.tops {
			tp.stop()
		}
	}()
	return m.Run()
}

// Each runs fn as a subtest for every topology (narrowed by
// WARMPATH_TEST_TOPOLOGIES outside CI), on the test binary's shared
// topologies.
func Each(t *testing.T, fn func(t *testing.T, tp *Topology)) {
	t.Helper()
	for _, k := range Wanted() {
		t.Run(string(k), func(t *testing.T) { fn(t, Shared(t, k)) })
	}
}

// Wanted returns the topologies a test should run on: all under CI=true
// or when WARMPATH_TEST_TOPOLOGIES is unset, else the ones it names.
func Wanted() []Kind {
	v := os.Getenv(EnvTopologies)
	if os.Getenv("CI") == "true" || v == "" {
		return Kinds
	}
	var out []Kind
	for _, k := range Kinds {
		if slices.Contains(strings.Split(v, ","), string(k)) {
			out = append(out, k)
		}
	}
	return out
}

// spawn starts one redis-server (extra arguments appended; "--sentinel"
// among them makes it a sentinel) on a free loopback port whose cluster bus
// port (port+10000) is free too, and waits for it to answer PING.
func spawn(dir, name string, extra func(port int) []string) (*Server, error) {
	d := filepath.Join(dir, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	var last error
	for range 20 {
		port := freePortPair()
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: d, port: port}
		if extra != nil {
			s.extra = extra(port)
		}
		if last = s.launch(); last == nil {
			return s, nil
		}
	}
	return nil, last
}

// freePortPair returns a port in 20000–29999 that can be bound, as can the
// port 10000 above it (a cluster node's bus).
func freePortPair() int {
	for {
		p := 20000 + rand.IntN(10000)
		a, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		b, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+10000)))
		a.Close()
		if err != nil {
			continue
		}
		b.Close()
		return p
	}
}

// wait polls cond every 50 ms until it returns nil or d passes.
func wait(d time.Duration, what string, cond func(ctx context.Context) error) error {
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := cond(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %w", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
