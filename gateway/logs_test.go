package gateway

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/vllmsim"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Split(strings.TrimSpace(l.b.String()), "\n")
}

// Every request's log record is structured JSON with its request id,
// tenant, a hash of its session key (never the key), the replica and the
// routing decision.
func TestRequestLogsAreStructured(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := fleetConfig(sim)
	rdb := redisFor(t, &cfg)
	var buf lockedBuffer
	g, err := New(cfg, Options{Redis: rdb, Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "gateway", g.Run)
	testrun.Eventually(t, 10*time.Second, func() bool { return g.WaitReady(t.Context()) == nil }, "ready")
	r := chat(t, "http://"+g.Addr(), map[string]any{"model": "qwen3-32b", "max_tokens": 2, "messages": []msg{{"user", "hi"}}},
		map[string]string{"X-Session-ID": "a-very-private-session-id", "X-Request-Id": "req-logs-test"})
	if r.Status != http.StatusOK {
		t.Fatalf("status %d", r.Status)
	}
	var rec map[string]any
	testrun.Eventually(t, 5*time.Second, func() bool {
		for _, line := range buf.lines() {
			if strings.Contains(line, `"msg":"request"`) && json.Unmarshal([]byte(line), &rec) == nil {
				return true
			}
		}
		return false
	}, "the request's log record")
	for _, k := range []string{"request_id", "tenant", "session", "replica", "reason", "status", "prompt_tokens"} {
		if _, ok := rec[k]; !ok {
			t.Errorf("request record lacks %q: %v", k, rec)
		}
	}
	if rec["request_id"] != "req-logs-test" || rec["tenant"] != "anonymous" {
		t.Errorf("request record %v", rec)
	}
	for _, line := range buf.lines() {
		if strings.Contains(line, "a-very-private-session-id") {
			t.Errorf("the raw session key was logged: %s", line)
		}
	}
}
