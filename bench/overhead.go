package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/warmpath/warmpath/gateway"
	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/vllmsim"
)

// The overhead benchmark measures what the gateway itself costs a request:
// the same requests at the same fixed rates, sent straight to the replicas
// (round-robin by the client), through a plain Go reverse proxy doing
// round-robin (httputil.ReverseProxy: the floor any Go proxy pays), and
// through warmpath with each policy asked, interleaved in rounds so that
// every target sees the same machine. Replicas answer in well under a
// millisecond (the simulator at a very high speed), so what remains is the
// hop. It reports each target's latency added over direct (p50, p90,
// p99), its CPU per 1,000 requests (its own process's when TargetCommand
// runs the proxy and the gateways as child processes; else this
// process's CPU over the window net of the direct window's, the load
// generator being in the same process, and so are the replicas unless
// FleetCommand runs them as child processes), and, for short prompts,
// the highest rate each target holds with p99 under the bound.
//
// Every target has a simulated fleet of its own, so a gateway ingests the
// KV events of its own requests only (and pays for all of them), and
// nobody's events land in another target's window. The gateways' Redis is
// a real server when RedisAddr names one (its CPU is then outside the
// measurement, as in production); otherwise an in-process miniredis,
// whose CPU counts as the gateway's.

// Overhead shapes.
const (
	ShapeShort  = "short"  // ~60-token fresh prompts, 8 tokens out, not streamed
	ShapeSticky = "sticky" // short prompts of 32 sessions, each resent: the sticky path
	ShapeStream = "stream" // short prompts, 16 tokens streamed
	ShapeLong   = "long"   // 16k-token fresh prompts, 8 tokens out
)

// OverheadConfig configures Overhead. Zero fields take the defaults named.
type OverheadConfig struct {
	// Policies are the warmpath routing policies to measure; default
	// warmpath and round-robin.
	Policies []string
	// Shapes and their rates (requests per second); default short and
	// sticky at 200 and 1000, stream at 1000, long at 25 and 50.
	Shapes map[string][]float64
	// Window is how long each target sends at one rate in one round;
	// default 3s. Rounds is how many times the targets take turns; default 3.
	Window time.Duration
	Rounds int
	// MaxRates is the ladder of short-prompt rates searched for the highest
	// rate held with p99 under MaxP99; default 500…4000 and 50ms. Empty
	// (set to []float64{}) skips the search.
	MaxRates []float64
	MaxP99   time.Duration
	// Replicas is each simulated fleet's size; default 4.
	Replicas int
	// RedisAddr is a Redis server (host:port) the gateways share, each
	// under its own key prefix; empty runs an in-process miniredis each.
	RedisAddr string
	// FleetCommand, when set, runs each simulated fleet as a child
	// process: the command (such as the warmpath binary and "sim"), given
	// the sim's flags, printing one "replica" line a replica. The replicas'
	// CPU (their /tokenize and chat work, their KV events) then stays out
	// of the CPU figures, which count the load generator, the proxy and
	// the gateways only. Empty runs the fleets in this process.
	FleetCommand []string
	// TargetCommand, when set, runs the plain proxy and each gateway as a
	// child process: the command (such as the warmpath binary and
	// "overhead-target"), given --spec and an OverheadTarget as JSON,
	// serving it (ServeOverheadTarget). A target's CPU is then its own
	// process's; in this process (empty), the process's net of the direct
	// window's.
	TargetCommand []string
	// TargetProfileDir, with TargetCommand, makes each child target write
	// a CPU profile of its run to DIR/<target>.prof (target names with
	// ':' written as '-').
	TargetProfileDir string
	// Tokenizer is the warmpath targets' routing.tokenizer; default
	// "simulator" (in process, as a gateway in front of a simulated fleet
	// is configured), "replicas" asks the replicas' /tokenize.
	Tokenizer string
	// Tracing, when set, turns tracing on in the warmpath targets at
	// sample ratio 1.0, exporting over OTLP/HTTP (batched, as warmpath
	// serve does) to this collector URL, or, with "sink", to a sink in
	// this process that reads each export and drops it (its CPU is not the
	// targets'). Empty leaves tracing off.
	Tracing string
	// Seed seeds the prompts; default 1.
	Seed int64
	// Logger receives the gateway's and simulator's logs; nil discards.
	Logger *slog.Logger
	// Progress, when set, gets one line per window.
	Progress io.Writer
}

// targetProfile is where the child target name writes its CPU profile;
// empty for none.
func (c *OverheadConfig) targetProfile(name string) string {
	if c.TargetProfileDir == "" {
		return ""
	}
	return filepath.Join(c.TargetProfileDir, strings.ReplaceAll(name, ":", "-")+".prof")
}

func (c *OverheadConfig) withDefaults() {
	if len(c.Policies) == 0 {
		c.Policies = []string{"warmpath", "round-robin"}
	}
	if c.Shapes == nil {
		c.Shapes = map[string][]float64{ShapeShort: {200, 1000}, ShapeSticky: {200, 1000}, ShapeStream: {1000}, ShapeLong: {25, 50}}
	}
	if c.Window == 0 {
		c.Window = 3 * time.Second
	}
	if c.Rounds == 0 {
		c.Rounds = 3
	}
	if c.MaxRates == nil {
		c.MaxRates = []float64{500, 1000, 1500, 2000, 3000, 4000}
	}
	if c.MaxP99 == 0 {
		c.MaxP99 = 50 * time.Millisecond
	}
	if c.Replicas == 0 {
		c.Replicas = 4
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Tokenizer == "" {
		c.Tokenizer = gateway.TokenizerSimulator
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// OverheadResult is one target at one shape and rate, over every round.
type OverheadResult struct {
	Shape    string  `json:"shape"`
	Rate     float64 `json:"rate"`
	Target   string  `json:"target"` // direct, proxy, or warmpath:<policy>
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	// ErrorKinds counts the errors by kind: "status N" for an answer
	// other than 200, "transport" for a request that got none.
	ErrorKinds map[string]int `json:"error_kinds,omitempty"`
	// ErrorExamples holds, per kind, the first error's message.
	ErrorExamples map[string]string `json:"error_examples,omitempty"`
	// P50Ms, P90Ms and P99Ms are the latency (send to end of body), in ms.
	P50Ms float64 `json:"p50_ms"`
	P90Ms float64 `json:"p90_ms"`
	P99Ms float64 `json:"p99_ms"`
	// AddedP*Ms are the same minus direct's.
	AddedP50Ms float64 `json:"added_p50_ms"`
	AddedP90Ms float64 `json:"added_p90_ms"`
	AddedP99Ms float64 `json:"added_p99_ms"`
	// CPUMsPer1000 is, per 1,000 requests, the CPU of the target's own
	// process over its windows (child targets), or the process CPU its
	// windows used beyond direct's (in process).
	CPUMsPer1000 float64 `json:"cpu_ms_per_1000"`
	// PhaseMeanMs is, for a warmpath target, the mean time per request in
	// each of the gateway's phases before it forwards
	// (warmpath_gateway_phase_seconds: prepare, queue, route), in ms.
	PhaseMeanMs map[string]float64 `json:"phase_mean_ms,omitempty"`
}

// OverheadReport is Overhead's result.
type OverheadReport struct {
	Results []OverheadResult `json:"results"`
	// MaxRate is, per target, the highest short-prompt rate held with p99
	// under MaxP99ms and no errors (0: none held).
	MaxRate  map[string]float64 `json:"max_rate"`
	MaxP99Ms float64            `json:"max_p99_ms"`
	// TraceExports counts the OTLP exports the trace sink received
	// (Tracing "sink"), proof the spans went out.
	TraceExports int64 `json:"trace_exports,omitempty"`
}

// target is one way to reach a fleet.
type target struct {
	name string
	urls []string // base URLs; the client round-robins over them
	next atomic.Uint64
	// gather reads a gateway's metrics; nil for direct and proxy.
	gather func() ([]*dto.MetricFamily, error)
	// cpu, for a target in a process of its own, is that process's CPU so
	// far; nil in this process (its windows count the process's CPU net
	// of direct's).
	cpu func() time.Duration
}

// cpuNow is the CPU a window of t counts from.
func (t *target) cpuNow() time.Duration {
	if t.cpu != nil {
		return t.cpu()
	}
	return processCPU()
}

func (t *target) url() string { return t.urls[int(t.next.Add(1)-1)%len(t.urls)] }

// Overhead runs the overhead benchmark.
func Overhead(ctx context.Context, cfg OverheadConfig) (*OverheadReport, error) {
	cfg.withDefaults()
	ctx, cancel := context.WithCancel(ctx)
	eg, ctx := errgroup.WithContext(ctx)
	var stores []*miniredis.Miniredis // closed once the gateways have stopped
	rep := &OverheadReport{MaxRate: map[string]float64{}, MaxP99Ms: ms(cfg.MaxP99)}
	var sink *traceSink // stopped once the gateways have flushed their spans
	defer func() {
		cancel()
		_ = eg.Wait()
		for _, mr := range stores {
			mr.Close()
		}
		if sink != nil {
			rep.TraceExports = sink.stop()
		}
	}()
	if cfg.Tracing == "sink" {
		var err error
		if sink, err = startTraceSink(); err != nil {
			return nil, err
		}
		cfg.Tracing = sink.url
	}
	targets, err := overheadTargets(ctx, eg, cfg, &stores)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxIdleConns: 4096, IdleConnTimeout: time.Minute}, Timeout: time.Minute}
	ob := &overheadBench{cfg: cfg, client: client, targets: targets, rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 7))}
	for _, t := range targets {
		if err := ob.warmUp(ctx, t); err != nil {
			return nil, err
		}
	}
	shapes := []string{ShapeShort, ShapeSticky, ShapeStream, ShapeLong}
	for _, shape := range shapes {
		for _, rate := range cfg.Shapes[shape] {
			res, err := ob.measure(ctx, shape, rate, cfg.Rounds, cfg.Window)
			if err != nil {
				return nil, err
			}
			rep.Results = append(rep.Results, res...)
		}
	}
	for _, t := range targets {
		if rate, err := ob.maxRate(ctx, t); err != nil {
			return nil, err
		} else if len(cfg.MaxRates) > 0 {
			rep.MaxRate[t.name] = rate
		}
	}
	return rep, nil
}

// overheadFleet starts a simulated fleet of its own for one target and
// returns its replicas.
func overheadFleet(ctx context.Context, eg *errgroup.Group, cfg OverheadConfig) ([]fleet.ReplicaSpec, error) {
	if len(cfg.FleetCommand) > 0 {
		return childFleet(ctx, eg, cfg)
	}
	sim, err := vllmsim.NewFleet(vllmsim.Config{Replicas: cfg.Replicas, Speed: overheadSpeed, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("bench: overhead: %w", err)
	}
	eg.Go(func() error { return sim.Run(ctx) })
	var specs []fleet.ReplicaSpec
	for _, r := range sim.Replicas() {
		in := r.Info()
		specs = append(specs, fleet.ReplicaSpec{URL: in.URL, Model: in.Model, KVEndpoint: in.KVEndpoint, ReplayEndpoint: in.ReplayEndpoint})
	}
	return specs, nil
}

// overheadSpeed is the simulators' speed: replicas answer in well under a
// millisecond.
const overheadSpeed = 20000

// childFleet runs a fleet as a child process (cfg.FleetCommand), killed
// when ctx ends, and reads its replicas from the lines it prints.
func childFleet(ctx context.Context, eg *errgroup.Group, cfg OverheadConfig) ([]fleet.ReplicaSpec, error) {
	args := append(slices.Clone(cfg.FleetCommand[1:]), "--replicas", fmt.Sprint(cfg.Replicas),
		"--http-port", "0", "--kv-port", "0", "--speed", fmt.Sprint(overheadSpeed))
	cmd := exec.CommandContext(ctx, cfg.FleetCommand[0], args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("bench: overhead: fleet: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: overhead: fleet: %w", err)
	}
	eg.Go(func() error {
		err := cmd.Wait()
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("bench: overhead: fleet exited: %v", err)
	})
	sc := bufio.NewScanner(out)
	var specs []fleet.ReplicaSpec
	for len(specs) < cfg.Replicas && sc.Scan() {
		if spec, ok := parseSimLine(sc.Text()); ok {
			specs = append(specs, spec)
		}
	}
	if len(specs) < cfg.Replicas {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("bench: overhead: fleet printed %d of %d replicas: %v", len(specs), cfg.Replicas, sc.Err())
	}
	eg.Go(func() error { _, _ = io.Copy(io.Discard, out); return nil })
	return specs, nil
}

// parseSimLine reads one `warmpath sim` line: "replica 0  http=URL
// kv=EP  replay=EP  topic=T".
func parseSimLine(line string) (fleet.ReplicaSpec, bool) {
	f := strings.Fields(line)
	if len(f) < 3 || f[0] != "replica" {
		return fleet.ReplicaSpec{}, false
	}
	spec := fleet.ReplicaSpec{Model: vllmsim.DefaultModel}
	for _, kv := range f[2:] {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == "http":
			spec.URL = v
		case k == "kv":
			spec.KVEndpoint = v
		case k == "replay" && v != "none":
			spec.ReplayEndpoint = v
		}
	}
	return spec, spec.URL != ""
}

// overheadTargets starts, each in front of a fleet of its own, nothing
// (direct), the plain proxy and one gateway per policy.
func overheadTargets(ctx context.Context, eg *errgroup.Group, cfg OverheadConfig, stores *[]*miniredis.Miniredis) ([]*target, error) {
	var targets []*target
	for i := range 2 + len(cfg.Policies) {
		specs, err := overheadFleet(ctx, eg, cfg)
		if err != nil {
			return nil, err
		}
		var urls []string
		for _, s := range specs {
			urls = append(urls, s.URL)
		}
		child := len(cfg.TargetCommand) > 0
		switch {
		case i == 0:
			targets = append(targets, &target{name: "direct", urls: urls})
		case i == 1 && child:
			t, err := childTarget(ctx, eg, cfg, "proxy", OverheadTarget{Kind: TargetProxy, Replicas: specs, CPUProfile: cfg.targetProfile("proxy")})
			if err != nil {
				return nil, err
			}
			targets = append(targets, t)
		case i == 1:
			proxyURL, err := startPlainProxy(ctx, eg, urls)
			if err != nil {
				return nil, err
			}
			targets = append(targets, &target{name: "proxy", urls: []string{proxyURL}})
		case child:
			pol := cfg.Policies[i-2]
			t, err := childTarget(ctx, eg, cfg, "warmpath:"+pol, OverheadTarget{Kind: TargetWarmpath, Policy: pol,
				Replicas: specs, RedisAddr: cfg.RedisAddr, Tokenizer: cfg.Tokenizer, Tracing: cfg.Tracing, CPUProfile: cfg.targetProfile("warmpath:" + pol)})
			if err != nil {
				return nil, err
			}
			targets = append(targets, t)
		default:
			t, err := startOverheadGateway(ctx, eg, cfg, cfg.Policies[i-2], specs, stores)
			if err != nil {
				return nil, err
			}
			targets = append(targets, t)
		}
	}
	return targets, nil
}

// startOverheadGateway runs a gateway with policy pol in front of specs.
func startOverheadGateway(ctx context.Context, eg *errgroup.Group, cfg OverheadConfig, pol string, specs []fleet.ReplicaSpec, stores *[]*miniredis.Miniredis) (*target, error) {
	addr := cfg.RedisAddr
	if addr == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return nil, fmt.Errorf("bench: overhead: redis: %w", err)
		}
		*stores = append(*stores, mr)
		addr = mr.Addr()
	}
	gc := gateway.Config{Listen: "127.0.0.1:0", Replicas: specs, DevKey: overheadKey}
	gc.Routing.Policy = pol
	gc.Routing.Tokenizer = cfg.Tokenizer
	gc.Redis.KeyPrefix = fmt.Sprintf("wp-overhead-%d-%s:", time.Now().UnixNano(), pol)
	gc.Health.Interval, gc.Health.ScrapeInterval = 250*time.Millisecond, 250*time.Millisecond
	gc.Server.MaxConnsPerClient = -1 // the load generator is one client
	gc.Server.PreStop = -1
	if cfg.Tracing != "" {
		gc.Tracing.Endpoint, gc.Tracing.SampleRatio = cfg.Tracing, 1
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	reg := prometheus.NewRegistry()
	gw, err := gateway.New(gc, gateway.Options{Redis: rdb, Logger: cfg.Logger, Registry: reg})
	if err != nil {
		return nil, fmt.Errorf("bench: overhead: %s: %w", pol, err)
	}
	name := "warmpath:" + pol
	eg.Go(func() (err error) {
		// The label follows every goroutine the gateway starts, so a
		// --cpuprofile splits by target (pprof -tagfocus target=…).
		pprof.Do(ctx, pprof.Labels("target", name), func(ctx context.Context) { err = gw.Run(ctx) })
		return err
	})
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = gw.WaitReady(wctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("bench: overhead: %s not ready: %w", pol, err)
	}
	return &target{name: name, urls: []string{"http://" + gw.Addr()}, gather: reg.Gather}, nil
}

const overheadKey = "sk-overhead-bench"

// traceSink is an OTLP/HTTP trace receiver that reads every export,
// counts it and drops it.
type traceSink struct {
	url     string
	srv     *http.Server
	exports atomic.Int64
}

// startTraceSink serves a trace sink until its stop.
func startTraceSink() (*traceSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bench: overhead: trace sink: %w", err)
	}
	s := &traceSink{url: "http://" + ln.Addr().String()}
	s.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.exports.Add(1)
		w.Header().Set("Content-Type", "application/x-protobuf")
	})}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// stop closes the sink and returns the exports it received.
func (s *traceSink) stop() int64 {
	_ = s.srv.Close()
	return s.exports.Load()
}

// startPlainProxy serves a minimal round-robin reverse proxy: the floor.
func startPlainProxy(ctx context.Context, eg *errgroup.Group, urls []string) (string, error) {
	var backends []*url.URL
	for _, u := range urls {
		pu, err := url.Parse(u)
		if err != nil {
			return "", err
		}
		backends = append(backends, pu)
	}
	var next atomic.Uint64
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(backends[int(next.Add(1)-1)%len(backends)])
		},
		Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxIdleConns: 4096},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	eg.Go(func() (err error) {
		pprof.Do(ctx, pprof.Labels("target", "proxy"), func(context.Context) { err = srv.Serve(ln) })
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	})
	eg.Go(func() error { <-ctx.Done(); return srv.Close() })
	return "http://" + ln.Addr().String(), nil
}

// overheadBench holds the load generator's state.
type overheadBench struct {
	cfg     OverheadConfig
	client  *http.Client
	targets []*target
	rng     *rand.Rand
	mu      sync.Mutex // guards rng
}

// ohSample is one target's windows at one shape and rate.
type ohSample struct {
	lat      []time.Duration
	errors   int
	kinds    map[string]int
	examples map[string]string // kind → its first error's message
	cpu      time.Duration
	requests int
	phases   phaseTotals // the gateway's, over the windows
}

// phaseTotals sums warmpath_gateway_phase_seconds per phase: seconds and
// samples.
type phaseTotals map[string][2]float64

// gatherPhases reads the gateway's phase histograms; nil without a
// registry.
func gatherPhases(gather func() ([]*dto.MetricFamily, error)) phaseTotals {
	if gather == nil {
		return nil
	}
	mfs, err := gather()
	if err != nil {
		return nil
	}
	out := phaseTotals{}
	for _, mf := range mfs {
		if mf.GetName() != "warmpath_gateway_phase_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "phase" {
					h := m.GetHistogram()
					out[lp.GetValue()] = [2]float64{h.GetSampleSum(), float64(h.GetSampleCount())}
				}
			}
		}
	}
	return out
}

// add adds the change from before to after to p.
func (p *phaseTotals) add(before, after phaseTotals) {
	for k, a := range after {
		if *p == nil {
			*p = phaseTotals{}
		}
		b := before[k]
		v := (*p)[k]
		(*p)[k] = [2]float64{v[0] + a[0] - b[0], v[1] + a[1] - b[1]}
	}
}

// meansMs returns each phase's mean in ms; nil when nothing was observed.
func (p phaseTotals) meansMs() map[string]float64 {
	var out map[string]float64
	for k, v := range p {
		if v[1] > 0 {
			if out == nil {
				out = map[string]float64{}
			}
			out[k] = v[0] / v[1] * 1000
		}
	}
	return out
}

// measure runs every target at shape and rate, rounds times in turn.
func (ob *overheadBench) measure(ctx context.Context, shape string, rate float64, rounds int, window time.Duration) ([]OverheadResult, error) {
	samples := make([]ohSample, len(ob.targets))
	for round := range rounds {
		for i, t := range ob.targets {
			// Alternate the order so no target always runs after another.
			if round%2 == 1 {
				i = len(ob.targets) - 1 - i
				t = ob.targets[i]
			}
			s, err := ob.window(ctx, t, shape, rate, window)
			if err != nil {
				return nil, err
			}
			samples[i].lat = append(samples[i].lat, s.lat...)
			samples[i].errors += s.errors
			for k, n := range s.kinds {
				if samples[i].kinds == nil {
					samples[i].kinds = map[string]int{}
					samples[i].examples = map[string]string{}
				}
				samples[i].kinds[k] += n
				if _, ok := samples[i].examples[k]; !ok {
					samples[i].examples[k] = s.examples[k]
				}
			}
			samples[i].cpu += s.cpu
			samples[i].requests += s.requests
			samples[i].phases.add(nil, s.phases)
			if ob.cfg.Progress != nil {
				fmt.Fprintf(ob.cfg.Progress, "overhead: %s %.0f/s %s round %d: %d requests, %d errors\n", shape, rate, t.name, round+1, s.requests, s.errors)
			}
		}
	}
	out := make([]OverheadResult, len(ob.targets))
	for i, t := range ob.targets {
		s := &samples[i]
		slices.Sort(s.lat)
		out[i] = OverheadResult{Shape: shape, Rate: rate, Target: t.name, Requests: s.requests, Errors: s.errors, ErrorKinds: s.kinds, ErrorExamples: s.examples,
			P50Ms: ms(quantile(s.lat, 0.5)), P90Ms: ms(quantile(s.lat, 0.9)), P99Ms: ms(quantile(s.lat, 0.99)),
			PhaseMeanMs: s.phases.meansMs()}
		switch {
		case s.requests == 0 || i == 0:
		case t.cpu != nil: // a process of its own
			out[i].CPUMsPer1000 = ms(s.cpu) * 1000 / float64(s.requests)
		default:
			out[i].CPUMsPer1000 = ms(s.cpu-samples[0].cpu) * 1000 / float64(s.requests)
		}
	}
	for i := range out {
		out[i].AddedP50Ms = out[i].P50Ms - out[0].P50Ms
		out[i].AddedP90Ms = out[i].P90Ms - out[0].P90Ms
		out[i].AddedP99Ms = out[i].P99Ms - out[0].P99Ms
	}
	return out, nil
}

// maxRate climbs the short-prompt ladder for t until p99 passes the bound
// or a request fails, and returns the last rate held.
func (ob *overheadBench) maxRate(ctx context.Context, t *target) (float64, error) {
	held := 0.0
	for _, rate := range ob.cfg.MaxRates {
		s, err := ob.window(ctx, t, ShapeShort, rate, ob.cfg.Window)
		if err != nil {
			return 0, err
		}
		slices.Sort(s.lat)
		if s.errors > 0 || quantile(s.lat, 0.99) > ob.cfg.MaxP99 {
			break
		}
		held = rate
	}
	return held, nil
}

// warmUp sends each of t's addresses requests, one at a time, until one of
// each shape is answered, so that no window counts a cold start (its first
// connections, the gateway's auth cache, the replicas' first health
// probes). It gives up after warmUpTries failures in a row.
func (ob *overheadBench) warmUp(ctx context.Context, t *target) error {
	for range t.urls {
		for _, shape := range []string{ShapeShort, ShapeSticky, ShapeStream} {
			var err error
			for try := 0; try < warmUpTries; try++ {
				if err = ob.send(ctx, t, shape, ob.body(shape, try)); err == nil {
					break
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(100 * time.Millisecond):
				}
			}
			if err != nil {
				return fmt.Errorf("bench: overhead: %s never answered a %s request: %w", t.name, shape, err)
			}
		}
	}
	return nil
}

const warmUpTries = 50

// window sends shape requests to t at rate for d, open loop (each request
// at its scheduled time, latency measured from it), and waits for them.
func (ob *overheadBench) window(ctx context.Context, t *target, shape string, rate float64, d time.Duration) (ohSample, error) {
	defer trace.StartRegion(ctx, fmt.Sprintf("overhead %s %s %g", t.name, shape, rate)).End() // --trace
	n := int(rate * d.Seconds())
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = ob.body(shape, i)
	}
	var mu sync.Mutex
	var s ohSample
	var wg sync.WaitGroup
	phases0 := gatherPhases(t.gather)
	cpu0 := t.cpuNow()
	start := time.Now()
	interval := time.Duration(float64(time.Second) / rate)
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if wait := time.Until(at); wait > 0 {
			select {
			case <-ctx.Done():
				return s, ctx.Err()
			case <-time.After(wait):
			}
		}
		wg.Go(func() {
			err := ob.send(ctx, t, shape, bodies[i])
			lat := time.Since(at)
			mu.Lock()
			defer mu.Unlock()
			s.requests++
			if err != nil {
				s.errors++
				if s.kinds == nil {
					s.kinds, s.examples = map[string]int{}, map[string]string{}
				}
				k := errorKind(err)
				if s.kinds[k]++; s.kinds[k] == 1 {
					s.examples[k] = err.Error()
				}
				return
			}
			s.lat = append(s.lat, lat)
		})
	}
	wg.Wait()
	s.cpu = t.cpuNow() - cpu0
	s.phases.add(phases0, gatherPhases(t.gather))
	return s, ctx.Err()
}

func (ob *overheadBench) send(ctx context.Context, t *target, shape string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url()+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+overheadKey)
	resp, err := ob.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return statusError(resp.StatusCode)
	}
	return nil
}

// statusError is an answer other than 200.
type statusError int

func (e statusError) Error() string { return fmt.Sprintf("status %d", int(e)) }

// errorKind names what went wrong with a request: its status, or
// "transport" when no answer came.
func errorKind(err error) string {
	var se statusError
	if errors.As(err, &se) {
		return se.Error()
	}
	return "transport"
}

// stickySessions is how many conversations the sticky shape cycles over.
const stickySessions = 32

// body builds request i of shape: fresh prompts are unique (no cache hit
// to route on), sticky ones repeat one of stickySessions conversations.
func (ob *overheadBench) body(shape string, i int) []byte {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	m := map[string]any{"model": vllmsim.DefaultModel, "max_tokens": 8}
	switch shape {
	case ShapeSticky:
		m["messages"] = []map[string]string{{"role": "system", "content": fmt.Sprintf("session %d: %s", i%stickySessions, randomWords(rand.New(rand.NewPCG(uint64(i%stickySessions), 1)), 40))}, {"role": "user", "content": "again"}}
	case ShapeLong:
		m["messages"] = []map[string]string{{"role": "user", "content": randomWords(ob.rng, 16000)}}
	case ShapeStream:
		m["messages"] = []map[string]string{{"role": "user", "content": randomWords(ob.rng, 60)}}
		m["stream"], m["max_tokens"], m["ignore_eos"] = true, 16, true
	default:
		m["messages"] = []map[string]string{{"role": "user", "content": randomWords(ob.rng, 60)}}
	}
	b, _ := json.Marshal(m)
	return b
}

// processCPU is the process's user and system CPU so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// WriteTable prints the report: per shape and rate, each target's added
// latency and CPU, then the highest rates held.
func (r *OverheadReport) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "shape\trate\ttarget\treqs\terr\tp50 ms\tp99 ms\tadded p50\tadded p90\tadded p99\tCPU ms/1000\t")
	for _, x := range r.Results {
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%d\t%d\t%.2f\t%.2f\t%+.2f\t%+.2f\t%+.2f\t%.0f\t\n", x.Shape, x.Rate, x.Target, x.Requests, x.Errors,
			x.P50Ms, x.P99Ms, x.AddedP50Ms, x.AddedP90Ms, x.AddedP99Ms, x.CPUMsPer1000)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, x := range r.Results {
		if len(x.PhaseMeanMs) > 0 {
			var parts []string
			for _, ph := range gateway.PhaseNames() {
				parts = append(parts, fmt.Sprintf("%s %.3f", ph, x.PhaseMeanMs[ph]))
			}
			fmt.Fprintf(w, "gateway phases, mean ms, %s %.0f/s %s: %s\n", x.Shape, x.Rate, x.Target, strings.Join(parts, ", "))
		}
	}
	for _, x := range r.Results {
		if len(x.ErrorKinds) > 0 {
			fmt.Fprintf(w, "errors, %s %.0f/s %s: %v, first of each: %v\n", x.Shape, x.Rate, x.Target, x.ErrorKinds, x.ErrorExamples)
		}
	}
	if len(r.MaxRate) > 0 {
		var names []string
		for n := range r.MaxRate {
			names = append(names, n)
		}
		slices.Sort(names)
		var parts []string
		for _, n := range names {
			parts = append(parts, fmt.Sprintf("%s %.0f", n, r.MaxRate[n]))
		}
		fmt.Fprintf(w, "highest short-prompt rate held with p99 < %.0f ms (req/s): %s\n", r.MaxP99Ms, strings.Join(parts, ", "))
	}
	if r.TraceExports > 0 {
		fmt.Fprintf(w, "OTLP exports received by the trace sink: %d\n", r.TraceExports)
	}
	return nil
}
