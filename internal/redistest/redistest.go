// Package redistest gives tests real Redis: the shared redis-server that
// .ci/run starts (named by WARMPATH_TEST_REDIS), a private process started
// for one test when a test must restart or kill its server, and the three
// topologies a gateway supports (Topology): a single server, a six-node
// Cluster and a master + replica watched by three sentinels, started once
// per test binary (Shared, Each; TestMain calls Main) or per test
// (StartTopology, for tests that kill a node).
//
// Tests that need Redis skip when none is reachable, except under CI=true,
// where they fail: CI must never pass by skipping.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// EnvAddr names the environment variable holding the shared test server's
// address (host:port).
const EnvAddr = "WARMPATH_TEST_REDIS"

// DefaultAddr is tried when EnvAddr is unset.
const DefaultAddr = "127.0.0.1:6379"

func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("redistest: "+format+" (CI=true: Redis is required)", args...)
	}
	t.Skipf("redistest: "+format+"; set %s or run .ci/run", append(args, EnvAddr)...)
}

// Addr returns the shared test server's address, skipping (or, under CI,
// failing) the test when it does not answer PING.
func Addr(t testing.TB) string {
	t.Helper()
	addr := os.Getenv(EnvAddr)
	if addr == "" {
		addr = DefaultAddr
	}
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		unavailable(t, "no redis-server at %s: %v", addr, err)
	}
	return addr
}

// Client returns a client of the shared test server and a key prefix unique
// to this test. Every key under the prefix is deleted when the test ends, so
// tests of different packages can share one server concurrently.
func Client(t testing.TB) (*redis.Client, string) {
	t.Helper()
	addr := Addr(t)
	c := redis.NewClient(&redis.Options{Addr: addr})
	prefix := "t" + randomHex(6) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		c.Close()
	})
	return c, prefix
}

// Server is a private redis-server process owned by one test (or, as a
// node of a shared Topology, by the test binary).
type Server struct {
	Addr  string
	dir   string
	port  int
	extra []string // arguments after the common ones

	mu  sync.Mutex // guards cmd
	cmd *exec.Cmd
}

// Start launches a private redis-server on a free loopback port, with
// persistence off. It is stopped when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		unavailable(t, "redis-server not on PATH")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: pick port: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: t.TempDir(), port: port}
	s.start(t)
	t.Cleanup(func() { s.Stop() })
	return s
}

func (s *Server) start(t testing.TB) {
	t.Helper()
	if err := s.launch(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// launch starts the process and waits up to ten seconds for it to answer
// PING; on failure the process is stopped.
func (s *Server) launch() error {
	args := []string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log")}
	cmd := exec.Command("redis-server", append(args, s.extra...)...)
	if s.isSentinel() {
		// A sentinel takes its configuration file first and rewrites it.
		cmd = exec.Command("redis-server", filepath.Join(s.dir, "sentinel.conf"),
			"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
			"--logfile", filepath.Join(s.dir, "redis.log"), "--sentinel")
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	err := wait(10*time.Second, "redis-server on "+s.Addr+" did not answer", func(ctx context.Context) error {
		return c.Ping(ctx).Err()
	})
	if err != nil {
		s.Stop()
	}
	return err
}

func (s *Server) isSentinel() bool { return slices.Contains(s.extra, "--sentinel") }

// Stop kills the server (SIGKILL); its data is gone (persistence is off).
// Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart stops the server and starts a fresh, empty one on the same port.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	s.start(t)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("redistest: %v", err))
	}
	return hex.EncodeToString(b)
}
