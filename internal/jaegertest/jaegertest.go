// Package jaegertest runs a real Jaeger (v2, github.com/jaegertracing/jaeger
// cmd/jaeger at JaegerVersion) for a test: on loopback, with in-memory
// storage, an OTLP/HTTP receiver and the query API on free ports, stopped
// when the test ends. Tests export spans to Endpoint and read them back
// with Trace.
//
// The binary is built from source in a module of its own
// (internal/jaegertest/tool, outside the product's go.mod). Binary finds
// it: $WARMPATH_JAEGER_BIN when set (.ci/run builds it there before the
// tests), else $(go env GOCACHE)/warmpath-jaeger/jaeger-<version>, built
// on demand under a file lock (about 2.5 minutes on two cores, once).
//
// Under CI=true a Jaeger that cannot be built or started fails the test;
// elsewhere the test is skipped with the reason.
package jaegertest

import (
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
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// JaegerVersion is the Jaeger release the tool module pins.
const JaegerVersion = "v1.75.0"

// EnvBinary names a prebuilt jaeger binary (CI sets it).
const EnvBinary = "WARMPATH_JAEGER_BIN"

// unavailable fails the test under CI=true and skips it elsewhere.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("jaegertest: "+format+" (CI=true: Jaeger is required)", args...)
	}
	t.Skipf("jaegertest: "+format+"; set %s or let the test build it (go must be on PATH)", append(args, EnvBinary)...)
}

// toolDir is the directory of the tool module (next to this file).
func toolDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("no caller information")
	}
	return filepath.Join(filepath.Dir(file), "tool"), nil
}

// Binary returns the path of the jaeger binary, building it when needed
// (see the package doc).
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(EnvBinary); p != "" {
		if _, err := os.Stat(p); err != nil {
			unavailable(t, "%s=%s: %v", EnvBinary, p, err)
		}
		return p
	}
	p, err := build()
	if err != nil {
		unavailable(t, "building jaeger %s: %v", JaegerVersion, err)
	}
	return p
}

// build builds the binary into the Go build cache unless it is there,
// holding a lock so that test binaries of parallel packages build it once.
func build() (string, error) {
	out, err := exec.Command("go", "env", "GOCACHE").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOCACHE: %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "warmpath-jaeger")
	bin := filepath.Join(dir, "jaeger-"+JaegerVersion)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, "build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(bin); err == nil { // another process built it
		return bin, nil
	}
	td, err := toolDir()
	if err != nil {
		return "", err
	}
	tmp := bin + ".tmp"
	cmd := exec.Command("go", "-C", td, "build", "-o", tmp, "github.com/jaegertracing/jaeger/cmd/jaeger")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, b)
	}
	return bin, os.Rename(tmp, bin)
}

// Jaeger is a running Jaeger.
type Jaeger struct {
	// Endpoint is the OTLP/HTTP receiver's base URL (http://127.0.0.1:port;
	// spans go to Endpoint+"/v1/traces").
	Endpoint string
	// QueryURL is the query service's base URL (its HTTP API is under
	// /api, e.g. /api/traces/<trace id>).
	QueryURL string
	logs     *bytes.Buffer
}

// config is a minimal Jaeger v2 configuration: OTLP/HTTP in, memory
// storage, the query extension; no internal metrics endpoint, and no
// self-tracing (on by default: it would export to localhost:4317).
const config = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
  jaeger_query:
    enable_tracing: false
    storage:
      traces: mem
    http:
      endpoint: %s
    grpc:
      endpoint: %s
receivers:
  otlp:
    protocols:
      http:
        endpoint: %s
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`

// freeAddrs returns n loopback addresses whose ports were free a moment ago.
func freeAddrs(n int) ([]string, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// Start starts a Jaeger for the test's lifetime and waits until both its
// receiver and its query API answer.
func Start(t testing.TB) *Jaeger {
	t.Helper()
	bin := Binary(t)
	var lastErr error
	for range 3 { // a port taken between freeAddrs and the bind: try again
		j, err := start(t, bin)
		if err == nil {
			return j
		}
		lastErr = err
	}
	unavailable(t, "starting %s: %v", bin, lastErr)
	return nil
}

func start(t testing.TB, bin string) (*Jaeger, error) {
	addrs, err := freeAddrs(3)
	if err != nil {
		return nil, err
	}
	query, grpc, otlp := addrs[0], addrs[1], addrs[2]
	cfgPath := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, config, query, grpc, otlp), 0o644); err != nil {
		return nil, err
	}
	j := &Jaeger{Endpoint: "http://" + otlp, QueryURL: "http://" + query, logs: &bytes.Buffer{}}
	cmd := exec.Command(bin, "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = j.logs, j.logs
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			return nil, fmt.Errorf("jaeger exited: %v\n%s", err, j.logs)
		default:
		}
		if j.ready() {
			t.Cleanup(func() {
				stop()
				if t.Failed() {
					t.Logf("jaeger output:\n%s", j.logs)
				}
			})
			return j, nil
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("jaeger not ready within 60s\n%s", j.logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ready reports whether the query API answers and the receiver accepts
// connections.
func (j *Jaeger) ready() bool {
	resp, err := http.Get(j.QueryURL + "/api/services")
	if err != nil {
		return false
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(j.Endpoint, "http://"), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Trace is one trace as the query API's JSON returns it (Jaeger's model:
// span kind, status and OpenTelemetry attributes are tags).
type Trace struct {
	TraceID   string             `json:"traceID"`
	Spans     []Span             `json:"spans"`
	Processes map[string]Process `json:"processes"`
}

// Span is a span of a Trace.
type Span struct {
	TraceID       string      `json:"traceID"`
	SpanID        string      `json:"spanID"`
	OperationName string      `json:"operationName"`
	References    []Reference `json:"references"`
	StartTime     int64       `json:"startTime"` // µs since the epoch
	Duration      int64       `json:"duration"`  // µs
	Tags          []KeyValue  `json:"tags"`
	ProcessID     string      `json:"processID"`
}

// Reference links a span to its parent (RefType CHILD_OF).
type Reference struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

// KeyValue is a tag; Value is a string, float64 or bool after decoding
// (Type says which of string, int64, float64, bool it was).
type KeyValue struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

// Process is the emitting service.
type Process struct {
	ServiceName string     `json:"serviceName"`
	Tags        []KeyValue `json:"tags"`
}

// Tag returns the span's tag key, or nil.
func (s Span) Tag(key string) any {
	for _, kv := range s.Tags {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

// Parent returns the span id of the span's CHILD_OF reference, or "".
func (s Span) Parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// Trace fetches a trace by its hex id; found is false while Jaeger has
// none of its spans.
func (j *Jaeger) Trace(ctx context.Context, traceID string) (tr Trace, found bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.QueryURL+"/api/traces/"+traceID, nil)
	if err != nil {
		return Trace{}, false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Trace{}, false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return Trace{}, false, err
	}
	if resp.StatusCode == http.StatusNotFound {
		return Trace{}, false, nil
	}
	if resp.StatusCode != http.StatusOK {
		return Trace{}, false, fmt.Errorf("GET /api/traces/%s: %s: %s", traceID, resp.Status, body)
	}
	var env struct {
		Data []Trace `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return Trace{}, false, fmt.Errorf("GET /api/traces/%s: %w", traceID, err)
	}
	if len(env.Data) == 0 {
		return Trace{}, false, nil
	}
	return env.Data[0], true, nil
}

// Services lists the service names Jaeger has seen.
func (j *Jaeger) Services(ctx context.Context) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.QueryURL+"/api/services", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var env struct {
		Data []string `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return nil, err
	}
	return env.Data, nil
}
