package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warmpath/warmpath/scoring"

	"github.com/warmpath/warmpath/internal/redistest"
	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/vllmsim"
)

// gatewayProcess is one `warmpath serve` process of the test.
type gatewayProcess struct {
	addr string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited, err set
	err  error
}

func startGatewayProcess(t *testing.T, bin, config, addr string) *gatewayProcess {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--config", config, "--listen", addr, "--log-level", "warn", "--log-format", "text")
	cmd.Env = append(os.Environ(), "WARMPATH_CONFIG=", "WARMPATH_DEV_KEY=")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &gatewayProcess{addr: addr, cmd: cmd, done: make(chan struct{})}
	// serve prints its banner once a replica is healthy: the event to wait on.
	banner := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		seen := false
		for sc.Scan() {
			if !seen && strings.Contains(sc.Text(), "serving the OpenAI API") {
				seen = true
				banner <- true
			}
		}
		if !seen {
			banner <- false
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	if !<-banner {
		t.Fatalf("gateway at %s exited before serving", addr)
	}
	return p
}

func ready(addr string) bool {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// balancer is what sits in front of the gateways in production: it sends
// each request to the next gateway whose /readyz last answered 200, and
// retries once on the other when a connection is refused (Envoy's
// retry_on: connect-failure).
type balancer struct {
	addrs []string
	up    []atomic.Bool
	next  atomic.Uint64
}

func (b *balancer) run(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		for i, a := range b.addrs {
			b.up[i].Store(ready(a))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (b *balancer) post(body []byte, key string) (*http.Response, error) {
	n := uint64(len(b.addrs))
	start := b.next.Add(1)
	var err error
	for k := range n {
		i := (start + k) % n
		if !b.up[i].Load() && k < n-1 {
			continue
		}
		req, _ := http.NewRequest(http.MethodPost, "http://"+b.addrs[i]+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		var resp *http.Response
		if resp, err = http.DefaultClient.Do(req); err == nil {
			return resp, nil
		}
		var op *net.OpError
		if !errors.As(err, &op) || op.Op != "dial" {
			return nil, err // not a refused connection: nothing to retry
		}
	}
	return nil, err
}

// A rolling restart of one of two gateway processes (one Redis, the
// simulated fleet) under steady load loses no non-streaming request and
// keeps every session on its replica: the restarting gateway drains
// (readiness off, then in-flight requests finish), the balancer moves
// traffic to the other, and the restarted one reads the bindings back from
// Redis.
func TestRollingRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two gateway processes")
	}
	bin := buildBinary(t)
	redis := redistest.Start(t)
	sim, err := vllmsim.NewFleet(vllmsim.Config{Replicas: 3, Speed: 50})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "vllmsim", sim.Run)
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "redis: {url: \"redis://%s\"}\ndebug: true\ndev_key: sk-rolling-restart\nserver: {pre_stop: 300ms, drain_timeout: 10s}\nreplicas:\n", redis.Addr)
	for _, r := range sim.Replicas() {
		in := r.Info()
		fmt.Fprintf(&cfg, "  - {url: %q, model: %q, kv_events: %q, kv_replay: %q}\n", in.URL, in.Model, in.KVEndpoint, in.ReplayEndpoint)
	}
	path := filepath.Join(t.TempDir(), "warmpath.yaml")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := []string{freeAddr(t), freeAddr(t)}
	a := startGatewayProcess(t, bin, path, addrs[0])
	startGatewayProcess(t, bin, path, addrs[1])
	lb := &balancer{addrs: addrs, up: make([]atomic.Bool, 2)}
	testrun.Start(t, "balancer", lb.run)

	const sessions = 6
	homes := make([]string, sessions)
	var mu sync.Mutex
	var failures []string
	var requests, moved, rescored atomic.Int64
	progress := make(chan struct{}, 1) // a request finished
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for s := range sessions {
		wg.Go(func() {
			msgs := []map[string]string{{"role": "system", "content": fmt.Sprintf("session %d %s", s, strings.Repeat("context words ", 80))}}
			for turn := 0; ; turn++ {
				select {
				case <-stop:
					return
				default:
				}
				msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("turn %d", turn)})
				body, _ := json.Marshal(map[string]any{"model": vllmsim.DefaultModel, "max_tokens": 8, "messages": msgs})
				resp, err := lb.post(body, "sk-rolling-restart")
				requests.Add(1)
				select {
				case progress <- struct{}{}:
				default:
				}
				if err != nil {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("session %d turn %d: %v", s, turn, err))
					mu.Unlock()
					return
				}
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("session %d turn %d: %d %s", s, turn, resp.StatusCode, raw))
					mu.Unlock()
					return
				}
				replica := resp.Header.Get("X-Warmpath-Replica")
				switch why := resp.Header.Get("X-Warmpath-Rebind"); {
				case homes[s] == "":
				case replica == homes[s]:
				case why == scoring.RebindSaturated:
					// The TTFT estimate moved the session (staying cost
					// more than a fresh prefill elsewhere), knowing its
					// binding: a routing choice, not a lost binding.
					rescored.Add(1)
				default:
					moved.Add(1)
					mu.Lock()
					failures = append(failures, fmt.Sprintf("session %d turn %d left %s for %s (reason %q, rebind %q)", s, turn, homes[s], replica, resp.Header.Get("X-Warmpath-Reason"), why))
					mu.Unlock()
				}
				homes[s] = replica
				var out struct {
					Choices []struct {
						Message map[string]string `json:"message"`
					} `json:"choices"`
				}
				_ = json.Unmarshal(raw, &out)
				if len(out.Choices) > 0 {
					msgs = append(msgs, map[string]string{"role": "assistant", "content": out.Choices[0].Message["content"]})
				}
			}
		})
	}
	waitRequests := func(n int64) {
		for requests.Load() < n {
			<-progress
		}
	}
	waitRequests(60)
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.done:
		if a.err != nil {
			t.Errorf("gateway A exited with %v after SIGTERM; want a clean drain", a.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("gateway A did not exit within 30 s of SIGTERM")
	}
	before := requests.Load()
	waitRequests(before + 40) // B alone carries the load
	startGatewayProcess(t, bin, path, addrs[0])
	waitRequests(requests.Load() + 60) // both again
	close(stop)
	wg.Wait()
	for _, f := range failures {
		t.Error(f)
	}
	if m := moved.Load(); m != 0 {
		t.Errorf("%d turns left their session's replica during the rolling restart without the policy choosing to", m)
	}
	t.Logf("%d requests across the restart, %d failed, %d lost their binding, %d moved by the estimate", requests.Load(), len(failures), moved.Load(), rescored.Load())
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
