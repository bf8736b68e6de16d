package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sync/errgroup"

	"github.com/warmpath/warmpath/gateway/fleet"
)

// Child targets. With OverheadConfig.TargetCommand set, the plain proxy
// and each gateway run in a process of their own, and a target's CPU is
// that process's (from /proc), as it would be deployed: the load
// generator's CPU, and the other targets' collections, stay out of it.
// In process, a window's CPU is the whole process's net of the direct
// window's, a difference of two large figures that moved its ratios by
// ±20 % between identical runs on this 2-core machine.

// Target kinds a child serves.
const (
	TargetProxy    = "proxy"
	TargetWarmpath = "warmpath"
)

// OverheadTarget is what a child target process serves.
type OverheadTarget struct {
	Kind      string              `json:"kind"`             // TargetProxy or TargetWarmpath
	Policy    string              `json:"policy,omitempty"` // a warmpath target's routing policy
	Replicas  []fleet.ReplicaSpec `json:"replicas"`
	RedisAddr string              `json:"redis,omitempty"` // empty: a miniredis in the child
	Tokenizer string              `json:"tokenizer,omitempty"`
	Tracing   string              `json:"tracing,omitempty"` // an OTLP/HTTP collector URL: tracing on, ratio 1.0
	// CPUProfile, when set, is where the child writes a CPU profile of
	// its whole run (runOverheadTarget starts and stops it).
	CPUProfile string `json:"cpu_profile,omitempty"`
}

// ServeOverheadTarget serves spec until ctx ends, writing one line,
// "target URL", to out once it answers.
func ServeOverheadTarget(parent context.Context, spec OverheadTarget, out io.Writer) error {
	ctx, cancel := context.WithCancel(parent)
	eg, ctx := errgroup.WithContext(ctx)
	var stores []*miniredis.Miniredis
	defer func() {
		for _, mr := range stores {
			mr.Close()
		}
	}()
	cfg := OverheadConfig{RedisAddr: spec.RedisAddr, Tokenizer: spec.Tokenizer, Tracing: spec.Tracing}
	cfg.withDefaults()
	var u string
	switch spec.Kind {
	case TargetProxy:
		var urls []string
		for _, r := range spec.Replicas {
			urls = append(urls, r.URL)
		}
		var err error
		if u, err = startPlainProxy(ctx, eg, urls); err != nil {
			cancel()
			return err
		}
	case TargetWarmpath:
		t, err := startOverheadGateway(ctx, eg, cfg, spec.Policy, spec.Replicas, &stores)
		if err != nil {
			cancel()
			return err
		}
		u = t.urls[0]
	default:
		cancel()
		return fmt.Errorf("bench: overhead target: kind %q: want %s or %s", spec.Kind, TargetProxy, TargetWarmpath)
	}
	if _, err := fmt.Fprintf(out, "target %s\n", u); err != nil {
		cancel()
		return err
	}
	err := eg.Wait()
	cancel()
	if parent.Err() != nil {
		return nil
	}
	return err
}

// childTarget runs spec as a child process (cfg.TargetCommand with
// --spec JSON), interrupted when ctx ends, and returns it as a target
// whose CPU and metrics are the child's.
func childTarget(ctx context.Context, eg *errgroup.Group, cfg OverheadConfig, name string, spec OverheadTarget) (*target, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, cfg.TargetCommand[0], append(slices.Clone(cfg.TargetCommand[1:]), "--spec", string(b))...)
	cmd.Stderr = os.Stderr
	// Interrupted rather than killed when ctx ends, so that a profile is
	// written; killed if it has not exited a few seconds later.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("bench: overhead: %s: %w", name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: overhead: %s: %w", name, err)
	}
	eg.Go(func() error {
		err := cmd.Wait()
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("bench: overhead: %s exited: %v", name, err)
	})
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if u, ok := strings.CutPrefix(sc.Text(), "target "); ok {
			eg.Go(func() error { _, _ = io.Copy(io.Discard, out); return nil })
			pid := cmd.Process.Pid
			t := &target{name: name, urls: []string{u}, cpu: func() time.Duration { return procCPU(pid) }}
			if spec.Kind == TargetWarmpath {
				t.gather = func() ([]*dto.MetricFamily, error) { return scrapeMetrics(ctx, u+"/metrics") }
			}
			return t, nil
		}
	}
	_ = cmd.Process.Kill()
	return nil, fmt.Errorf("bench: overhead: %s printed no target line: %v", name, sc.Err())
}

// procCPU is process pid's user and system CPU so far, from
// /proc/PID/stat (in clock ticks of 10 ms, Linux's USER_HZ); 0 when it
// cannot be read.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces;
	// utime and stime are fields 14 and 15, the 12th and 13th after it.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// scrapeMetrics reads a Prometheus text exposition.
func scrapeMetrics(ctx context.Context, u string) ([]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("bench: overhead: %s: %s", u, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := make([]*dto.MetricFamily, 0, len(mfs))
	for _, mf := range mfs {
		out = append(out, mf)
	}
	return out, nil
}
