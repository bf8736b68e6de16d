package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"runtime/trace"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warmpath/warmpath/vllmsim"
)

// A tiny overhead run: every target answers every request, the report
// names each, the table prints, and an execution trace of the run has a
// region per target's window (--trace).
func TestOverheadSmoke(t *testing.T) {
	var tr bytes.Buffer
	tracing := trace.Start(&tr) == nil // not when go test -trace runs one
	rep, err := Overhead(t.Context(), OverheadConfig{
		Shapes: map[string][]float64{ShapeShort: {50}, ShapeSticky: {50}}, Window: 400 * time.Millisecond, Rounds: 1,
		MaxRates: []float64{100}, Policies: []string{"warmpath"},
	})
	if tracing {
		trace.Stop()
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, region := range []string{"overhead direct short 50", "overhead proxy sticky 50", "overhead warmpath:warmpath short 50"} {
		if tracing && !bytes.Contains(tr.Bytes(), []byte(region)) {
			t.Errorf("the trace has no region %q", region)
		}
	}
	checkOverheadResults(t, rep)
	var b bytes.Buffer
	if err := rep.WriteTable(&b); err != nil || !strings.Contains(b.String(), "highest short-prompt rate") ||
		!strings.Contains(b.String(), "gateway phases, mean ms, short 50/s warmpath:warmpath: prepare ") {
		t.Errorf("table: %v\n%s", err, b.String())
	}
}

// With Tracing "sink", the warmpath target traces every request and its
// exports reach the sink (flushed when the gateway stops), which the
// table reports.
func TestOverheadTracingSink(t *testing.T) {
	rep, err := Overhead(t.Context(), OverheadConfig{
		Shapes: map[string][]float64{ShapeShort: {50}}, Window: 300 * time.Millisecond, Rounds: 1,
		MaxRates: []float64{}, Policies: []string{"round-robin"}, Tracing: "sink",
	})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := rep.WriteTable(&b); err != nil || rep.TraceExports == 0 || !strings.Contains(b.String(), "OTLP exports received by the trace sink") {
		t.Errorf("trace exports %d, table: %v\n%s", rep.TraceExports, err, b.String())
	}
}

// The lines `warmpath sim` prints (vllmsim.Run) name every replica's
// endpoints, as a child fleet is read.
func TestParseSimLine(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // print the replicas, then stop at once
	var out bytes.Buffer
	if err := vllmsim.Run(ctx, vllmsim.Config{Replicas: 2}, &out); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	var n int
	for _, line := range strings.Split(out.String(), "\n") {
		spec, ok := parseSimLine(line)
		if !ok {
			continue
		}
		n++
		if !strings.HasPrefix(spec.URL, "http://127.0.0.1:") || !strings.HasPrefix(spec.KVEndpoint, "tcp://") ||
			!strings.HasPrefix(spec.ReplayEndpoint, "tcp://") || spec.Model != vllmsim.DefaultModel {
			t.Errorf("line %q parsed as %+v", line, spec)
		}
	}
	if n != 2 {
		t.Errorf("parsed %d replicas from %q; want 2", n, out.String())
	}
	if _, ok := parseSimLine("overhead: short 200/s"); ok {
		t.Error("a line that is not a replica parsed")
	}
}

// With TargetCommand, the proxy and the gateway each run in a process of
// their own (this test binary, as TestOverheadTargetProcess): they answer
// every request, the gateway's phases come from its /metrics, and the
// targets' CPU is their processes'.
func TestOverheadChildTargets(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Overhead(t.Context(), OverheadConfig{
		Shapes: map[string][]float64{ShapeShort: {50}}, Window: 400 * time.Millisecond, Rounds: 1,
		MaxRates: []float64{}, Policies: []string{"warmpath"},
		TargetCommand: []string{exe, "-test.run=^TestOverheadTargetProcess$", "--"},
	})
	if err != nil {
		t.Fatal(err)
	}
	checkOverheadResults(t, rep)
}

// checkOverheadResults checks that every target answered every request
// and has results, and that only the gateway has phases (read from its
// own metrics), every one of them observed.
func checkOverheadResults(t *testing.T, rep *OverheadReport) {
	t.Helper()
	targets := map[string]bool{}
	for _, r := range rep.Results {
		targets[r.Target] = true
		if r.Requests == 0 || r.Errors != 0 {
			t.Errorf("%s %s: %d requests, %d errors %v %v", r.Shape, r.Target, r.Requests, r.Errors, r.ErrorKinds, r.ErrorExamples)
		}
		if gw := strings.HasPrefix(r.Target, "warmpath:"); gw != (len(r.PhaseMeanMs) == 3) {
			t.Errorf("%s %s: phase means %v", r.Shape, r.Target, r.PhaseMeanMs)
		}
	}
	for _, want := range []string{"direct", "proxy", "warmpath:warmpath"} {
		if !targets[want] {
			t.Errorf("no results for %s", want)
		}
	}
}

// TestOverheadTargetProcess is the child TestOverheadChildTargets runs:
// it serves the --spec given after the test flags, until it is killed.
func TestOverheadTargetProcess(t *testing.T) {
	i := slices.Index(os.Args, "--spec")
	if i < 0 || i+1 >= len(os.Args) {
		t.Skip("a target process of TestOverheadChildTargets")
	}
	var spec OverheadTarget
	if err := json.Unmarshal([]byte(os.Args[i+1]), &spec); err != nil {
		t.Fatal(err)
	}
	if err := ServeOverheadTarget(t.Context(), spec, os.Stdout); err != nil {
		t.Fatal(err)
	}
}

// procCPU reads a process's CPU as the kernel accounts it: for this
// process, what getrusage says, to within the ticks /proc counts in.
func TestProcCPU(t *testing.T) {
	deadline := processCPU() + 100*time.Millisecond
	for x := 0; processCPU() < deadline; x++ { // burn CPU, not wall time
		_ = syscall.Getpid()
	}
	got, want := procCPU(os.Getpid()), processCPU()
	if got <= 0 || got > want+20*time.Millisecond || got < want-50*time.Millisecond {
		t.Errorf("procCPU = %v; getrusage says %v", got, want)
	}
	if procCPU(-1) != 0 {
		t.Error("procCPU of no process is not 0")
	}
}
