package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warmpath/warmpath/gateway"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/vllmsim"
)

// Defaults of Config. Together they are the headline configuration: one
// shared-prefix run of all six policies takes a few minutes on a 2-core
// laptop (docs/benchmarks/method.md).
const (
	// DefaultReplicas is the fleet size, as in llm-d's benchmark.
	DefaultReplicas = 8
	// DefaultScale shrinks token counts and KV capacity fourfold. Smaller
	// scales distort warmpath's token-denominated scorer constants (see
	// doc.go); at 0.25 its results match full size.
	DefaultScale = 0.25
	// DefaultSpeed runs simulated time four times faster than real time.
	DefaultSpeed = 4
	// DefaultStageScale shortens rate-ladder stages to a tenth (3 s
	// instead of 30 s, a 5 s warm-up).
	DefaultStageScale = 0.1
	// DefaultSeed seeds workloads and the simulated fleet.
	DefaultSeed = 1
	// DefaultDrain is how long, in simulated time after the last session
	// started, a run waits for outstanding requests before cutting them.
	DefaultDrain = 30 * time.Minute
	// TargetPolicy names the single result of a --target run.
	TargetPolicy = "target"
)

// Config configures a benchmark. The zero value (with a Workload) runs
// every policy on the default simulated fleet.
type Config struct {
	// Workload is a registered workload name (see Workloads).
	Workload string
	// Policies are the routing policies to compare, in order; default all
	// of scoring.Policies, round-robin first (ratios are against it).
	Policies []string
	// Replicas is the simulated fleet's size; default 8. Ignored with
	// Fleet.
	Replicas int
	// Gateways is how many gateway processes (in-process instances) share
	// one Redis in front of the fleet, as a highly available deployment
	// runs them; the load generator spreads requests over them in turn,
	// as an L7 load balancer would. Default 1; ignored with Target.
	Gateways int
	// RedisAddr is a Redis server (host:port) the gateways share, each
	// policy's run under a key prefix of its own (deleted after it); empty
	// means a fresh in-process Redis per run (miniredis, its CPU in the
	// benchmark's process). Each gateway has its own client either way.
	RedisAddr string
	// redisPrefix starts each run's key prefix on RedisAddr (tests set it
	// to find what a run left); default "wp-bench-".
	redisPrefix string
	// Speed is simulated seconds per real second; default DefaultSpeed
	// for the simulated fleet, 1 for Fleet and Target (set it to an
	// external simulator's --speed). Every reported time is simulated:
	// wall-clock × Speed.
	Speed float64
	// KVBlocks overrides the simulated replicas' full-size KV capacity in
	// 16-token blocks (the default profile's 19,208), before Scale; a
	// larger cache stands in for a CPU tier (it also admits larger
	// batches, which a CPU tier does not). Workloads sized to the fleet's
	// capacity (agentic) grow with it.
	KVBlocks int
	// CPUBlocks gives each simulated replica a CPU offload tier of this
	// many 16-token blocks (vLLM's native offloading, see
	// vllmsim.Config.CPUBlocks), before Scale; 0, the default, means none.
	// The gateway sizes its index's CPU tier from the replicas'
	// cache_config_info and scores CPU hits at scoring.CPUHitCost.
	CPUBlocks int
	// Scale multiplies token counts and the simulated KV capacity, and
	// dilates the simulated profile's step costs (see doc.go); default
	// DefaultScale. 1 is full size.
	Scale float64
	// StageScale multiplies the shared-prefix ladder's stage lengths;
	// default DefaultStageScale.
	StageScale float64
	// Seed seeds the workload and the simulated fleet; default 1.
	Seed int64
	// Duration, when positive, drops sessions starting later (simulated).
	Duration time.Duration
	// Limit, when positive, keeps the first Limit sessions.
	Limit int
	// Drain bounds, in simulated time after the last session starts, how
	// long outstanding requests may run before they are cut (and counted
	// as errors); default DefaultDrain.
	Drain time.Duration
	// TracePath and TimeScale configure the trace workload; TimeScale
	// default 1.
	TracePath string
	TimeScale float64
	// Fleet, when set, benchmarks these OpenAI-compatible replicas (base
	// URLs) instead of a simulated fleet: the in-process gateway routes to
	// them, and each replica's prefix cache is reset (POST
	// /reset_prefix_cache) before each policy.
	Fleet []string
	// KVEvents are the replicas' KV-event endpoints, aligned with Fleet;
	// empty entries (or a nil slice) mean none.
	KVEvents []string
	// Target, when set, benchmarks this one endpoint (e.g. a deployed
	// warmpath) as a single "target" result instead of the policies. With
	// Fleet set too, those replicas' caches are reset first.
	Target string
	// APIKey is sent as a bearer token to Target.
	APIKey string
	// Model is the model to request; default the simulator's, or the first
	// model the first Fleet/Target URL lists.
	Model string
	// StreamInterval is the simulated replicas' least real time between two
	// chunks of a stream; default half a simulated second (500 ms ÷ Speed,
	// at least 10 ms). Coalescing chunks saves the load generator's CPU;
	// the first chunk is never delayed, the last by at most the interval.
	StreamInterval time.Duration
	// Parts, for mixed-tenants, selects the parts to run, of no-burst,
	// fifo, strict, fair and shares; default all.
	Parts []string
	// RecordDir, when set, has each gateway record the requests it routes
	// for warmpath analyze --record (see recordTo).
	RecordDir string
	// Progress, when not nil, receives a progress line updated in place
	// (carriage returns) while a run goes on.
	Progress io.Writer
	// Logger receives the fleet's and gateway's logs; nil discards them.
	Logger *slog.Logger

	// tweak, when set (tests, and each part of mixed-tenants), adjusts
	// each gateway configuration.
	tweak func(*gateway.Config)
	// scheduling is the simulated engines' scheduling policy ("" fcfs);
	// loadEvery the simulated interval of engine-state samples (default
	// one second).
	scheduling string
	loadEvery  time.Duration
}

func (c Config) withDefaults() (Config, error) {
	if c.Workload == "" {
		return c, errors.New("bench: no workload")
	}
	external := len(c.Fleet) > 0 || c.Target != ""
	if len(c.Policies) == 0 {
		c.Policies = scoring.Policies()
	}
	for _, p := range c.Policies {
		if !slices.Contains(scoring.Policies(), p) {
			return c, fmt.Errorf("bench: unknown policy %q (want some of %s)", p, strings.Join(scoring.Policies(), ", "))
		}
	}
	if c.Target != "" {
		c.Policies = []string{TargetPolicy}
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultReplicas
	}
	if c.Gateways == 0 {
		c.Gateways = 1
	}
	if len(c.Fleet) > 0 {
		c.Replicas = len(c.Fleet)
	}
	if c.Speed == 0 {
		c.Speed = DefaultSpeed
		if external {
			c.Speed = 1
		}
	}
	if c.Scale == 0 {
		c.Scale = DefaultScale
	}
	if c.StageScale == 0 {
		c.StageScale = DefaultStageScale
	}
	if c.Seed == 0 {
		c.Seed = DefaultSeed
	}
	if c.Drain == 0 {
		c.Drain = DefaultDrain
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.StreamInterval == 0 {
		c.StreamInterval = max(10*time.Millisecond, time.Duration(float64(500*time.Millisecond)/c.Speed))
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	for _, p := range c.Parts {
		if !slices.Contains(mixedParts, p) {
			return c, fmt.Errorf("bench: unknown part %q (want some of %s)", p, strings.Join(mixedParts, ", "))
		}
	}
	switch {
	case c.Replicas < 1 || c.Replicas > 64:
		return c, fmt.Errorf("bench: %d replicas (want 1–64)", c.Replicas)
	case c.KVBlocks < 0 || c.KVBlocks > 1<<24:
		return c, fmt.Errorf("bench: %d KV blocks (want 0–%d)", c.KVBlocks, 1<<24)
	case c.CPUBlocks < 0 || c.CPUBlocks > 1<<26:
		return c, fmt.Errorf("bench: %d CPU blocks (want 0–%d)", c.CPUBlocks, 1<<26)
	case c.Gateways < 1 || c.Gateways > 8:
		return c, fmt.Errorf("bench: %d gateways (want 1–8)", c.Gateways)
	case c.Speed <= 0 || c.Scale <= 0 || c.Scale > 1 || c.StageScale <= 0 || c.TimeScale <= 0:
		return c, fmt.Errorf("bench: speed %g, scale %g, stage scale %g and time scale %g must be positive (scale at most 1)",
			c.Speed, c.Scale, c.StageScale, c.TimeScale)
	case len(c.KVEvents) > 0 && len(c.KVEvents) != len(c.Fleet):
		return c, fmt.Errorf("bench: %d KV-event endpoints for %d fleet URLs", len(c.KVEvents), len(c.Fleet))
	}
	return c, nil
}

// ScaledProfile returns p shrunk for a benchmark at token scale s (0 < s ≤
// 1) so that the run keeps the full-size run's queueing shape: KV capacity,
// the step's token budget and the model length are multiplied by s, and
// time is dilated so that every phase of a request lasts as long as at
// full size. With s times the tokens,
//
//   - a prefill of s·n tokens must cost what n cost: PrefillPerToken ÷ s;
//   - a decode of s·m output tokens takes s·m steps instead of m, so each
//     step must last 1/s as long: StepBase ÷ s and DecodePerSeq ÷ s;
//   - a step's attention reads s·c context tokens instead of c and must
//     still cost 1/s as much as at full size: DecodePerContextToken ÷ s².
//
// MaxNumSeqs is a count of requests and is kept. Request rates, pauses and
// stage lengths then stay as at full size, and every simulated time is a
// full-size-equivalent time, while the simulator does s times the steps
// and the load generator moves s times the tokens.
func ScaledProfile(p vllmsim.Profile, s float64) vllmsim.Profile {
	if s <= 0 || s == 1 {
		return p
	}
	sc := func(n int) int { return max(1, int(math.Round(float64(n)*s))) }
	dil := func(d time.Duration, f float64) time.Duration { return time.Duration(math.Round(float64(d) / f)) }
	p.Name = fmt.Sprintf("%s×%g", p.Name, s)
	p.KVBlocks = sc(p.KVBlocks)
	p.MaxNumBatchedTokens = sc(p.MaxNumBatchedTokens)
	p.MaxModelLen = sc(p.MaxModelLen)
	p.StepBase = dil(p.StepBase, s)
	p.PrefillPerToken = dil(p.PrefillPerToken, s)
	p.DecodePerSeq = dil(p.DecodePerSeq, s)
	p.DecodePerContextToken = dil(p.DecodePerContextToken, s*s)
	return p
}

// Run runs the benchmark: for each policy, a fresh simulated fleet (same
// configuration and seed), a fresh in-process Redis and a fresh gateway
// with that policy; it drives the workload through the gateway, collects
// the results and tears everything down before the next policy. With
// Config.Fleet it routes to external replicas instead (their caches reset
// between policies); with Config.Target it benchmarks one endpoint.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	wl, err := NewWorkload(cfg.Workload)
	if err != nil {
		return nil, err
	}
	base := vllmsim.DefaultProfile()
	if cfg.KVBlocks > 0 {
		base.KVBlocks = cfg.KVBlocks
	}
	profile := ScaledProfile(base, cfg.Scale)
	env := Env{Seed: cfg.Seed, Scale: cfg.Scale, Replicas: cfg.Replicas, StageScale: cfg.StageScale,
		TracePath: cfg.TracePath, TimeScale: cfg.TimeScale, Duration: cfg.Duration, Limit: cfg.Limit}
	external := len(cfg.Fleet) > 0 || cfg.Target != ""
	if !external {
		env.KVTokens = profile.KVBlocks * profile.BlockSize
	}
	plan, err := wl.Plan(env)
	if err != nil {
		return nil, err
	}
	if len(plan.Sessions) == 0 {
		return nil, fmt.Errorf("bench: workload %s planned no sessions", cfg.Workload)
	}
	if cfg.Model == "" {
		cfg.Model = vllmsim.DefaultModel
		if external {
			if cfg.Model, err = discoverModel(ctx, cfg); err != nil {
				return nil, err
			}
		}
	}

	rep := &Report{Workload: cfg.Workload, Params: plan.Params, Started: time.Now(), Config: reportConfig(cfg, profile, external)}
	if mt, ok := wl.(*MixedTenants); ok {
		if external {
			return nil, errors.New("bench: mixed-tenants runs on the simulated fleet only (it sets up tenants and the engines' scheduling)")
		}
		if err := runMixed(ctx, cfg, mt, env, profile, rep); err != nil {
			return nil, err
		}
		rep.Wall = time.Since(rep.Started)
		rep.Mixed.Wall = rep.Wall.Seconds()
		return rep, nil
	}
	memo := newPromptMemo()
	fleetBlocks := 0 // the fleet's KV capacity in 16-token blocks, when known
	if !external {
		fleetBlocks = cfg.Replicas * profile.KVBlocks * profile.BlockSize / ceilingBlockTokens
	}
	for i, policy := range cfg.Policies {
		if i > 0 {
			// Scripts keep per-session state (an agent run's conversation),
			// so each policy gets a freshly planned, identical workload.
			if plan, err = wl.Plan(env); err != nil {
				return nil, err
			}
		}
		pr := &progress{w: cfg.Progress, policy: policy, index: i, total: len(cfg.Policies), planned: plan.Sessions[len(plan.Sessions)-1].Start}
		var res *Result
		switch {
		case cfg.Target != "":
			res, err = runTarget(ctx, cfg, plan, pr)
		case len(cfg.Fleet) > 0:
			res, err = runExternal(ctx, cfg, policy, plan, pr)
		default:
			res, err = runSimulated(ctx, cfg, policy, profile, plan, pr)
		}
		pr.finish()
		if err != nil {
			return nil, fmt.Errorf("bench: %s: %w", policy, err)
		}
		res.finishCeiling(memo, fleetBlocks)
		rep.Results = append(rep.Results, *res)
	}
	rep.Wall = time.Since(rep.Started)
	rep.compare()
	return rep, nil
}

// scaledCPUBlocks is the simulated replicas' CPU tier at the run's token
// scale, as ScaledProfile scales the KV cache.
func scaledCPUBlocks(cfg Config) int {
	if cfg.CPUBlocks == 0 {
		return 0
	}
	return max(1, int(math.Round(float64(cfg.CPUBlocks)*cfg.Scale)))
}

// runSimulated benchmarks one policy on a fresh simulated fleet, Redis and
// gateway, and tears them down.
func runSimulated(ctx context.Context, cfg Config, policy string, profile vllmsim.Profile, plan *Plan, pr *progress) (*Result, error) {
	fl, err := vllmsim.NewFleet(vllmsim.Config{
		Replicas:         cfg.Replicas,
		Speed:            cfg.Speed,
		Profile:          profile,
		CPUBlocks:        scaledCPUBlocks(cfg),
		Seed:             cfg.Seed,
		StreamInterval:   cfg.StreamInterval,
		SchedulingPolicy: cfg.scheduling,
		Logger:           cfg.Logger.With("component", "vllmsim"),
	})
	if err != nil {
		return nil, err
	}
	var urls, kv, replay []string
	for _, r := range fl.Replicas() {
		in := r.Info()
		urls, kv, replay = append(urls, in.URL), append(kv, in.KVEndpoint), append(replay, in.ReplayEndpoint)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	fctx, stopFleet := context.WithCancel(ctx)
	defer stopFleet()
	var fleetErr error
	wg.Go(func() { fleetErr = fl.Run(fctx) })
	sctx, stopSampler := context.WithCancel(fctx)
	defer stopSampler()
	var load []loadPoint
	every := cmp.Or(cfg.loadEvery, time.Second)
	wg.Go(func() { load = sampleLoad(sctx, fl, time.Duration(float64(every)/cfg.Speed)) })

	res, err := runGateway(ctx, cfg, policy, urls, kv, replay, plan, pr)
	stopSampler()
	stopFleet()
	wg.Wait()
	if err == nil && fleetErr != nil {
		err = fleetErr
	}
	if err != nil {
		return nil, err
	}
	var prefill []float64
	for _, r := range fl.Replicas() {
		st := r.Stats()
		prefill = append(prefill, float64(st.PrefillTokens))
		res.Preemptions += int64(st.Preemptions)
		res.Evictions += int64(st.Evictions)
	}
	res.setPrefill(prefill, "engine")
	res.setLoad(load)
	for _, u := range urls {
		if pu, err := url.Parse(u); err == nil {
			res.loadNames = append(res.loadNames, pu.Host)
		}
	}
	return res, nil
}

// loadPoint is the fleet's engine state at one instant.
type loadPoint struct {
	at               time.Time
	waiting, running []int
	kv               []float64
}

// sampleLoad records every replica's queue, batch and KV use each interval
// until ctx ends.
func sampleLoad(ctx context.Context, fl *vllmsim.Fleet, interval time.Duration) []loadPoint {
	var out []loadPoint
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case now := <-t.C:
			p := loadPoint{at: now}
			for _, r := range fl.Replicas() {
				st := r.Stats()
				p.waiting = append(p.waiting, st.Waiting)
				p.running = append(p.running, st.Running)
				p.kv = append(p.kv, st.KVUsage)
			}
			out = append(out, p)
		}
	}
}

// runExternal benchmarks one policy through an in-process gateway in front
// of external replicas, after resetting their prefix caches.
func runExternal(ctx context.Context, cfg Config, policy string, plan *Plan, pr *progress) (*Result, error) {
	if err := resetCaches(ctx, cfg.Fleet); err != nil {
		return nil, err
	}
	kv := cfg.KVEvents
	if len(kv) == 0 {
		kv = make([]string, len(cfg.Fleet))
	}
	res, err := runGateway(ctx, cfg, policy, cfg.Fleet, kv, make([]string, len(cfg.Fleet)), plan, pr)
	if err != nil {
		return nil, err
	}
	res.setPrefillFromSamples(cfg.Fleet)
	return res, nil
}

// runTarget benchmarks one already-running endpoint.
func runTarget(ctx context.Context, cfg Config, plan *Plan, pr *progress) (*Result, error) {
	if err := resetCaches(ctx, cfg.Fleet); err != nil {
		return nil, err
	}
	d := newDriver([]string{strings.TrimRight(cfg.Target, "/")}, cfg.Model, cfg.APIKey, cfg.Speed, cfg.Drain)
	pr.start(d)
	samples, err := d.run(ctx, plan.Sessions)
	if err != nil {
		return nil, err
	}
	res := summarize(TargetPolicy, samples, cfg.Scale)
	res.setPrefillFromSamples(nil)
	return res, nil
}

// resetCaches asks every replica to drop its prefix cache, so that each
// policy starts cold.
func resetCaches(ctx context.Context, urls []string) error {
	for _, u := range urls {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(u, "/")+"/reset_prefix_cache", nil)
		if err != nil {
			return fmt.Errorf("reset prefix cache: %w", err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("reset prefix cache of %s: %w", u, err)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("reset prefix cache of %s: %s", u, resp.Status)
		}
	}
	return nil
}

// discoverModel asks the first external URL for its models.
func discoverModel(ctx context.Context, cfg Config) (string, error) {
	base := cfg.Target
	if base == "" {
		base = cfg.Fleet[0]
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/v1/models", nil)
	if err != nil {
		return "", fmt.Errorf("bench: models: %w", err)
	}
	if cfg.APIKey != "" && cfg.Target != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.APIKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("bench: models of %s: %w", base, err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil || len(list.Data) == 0 {
		return "", fmt.Errorf("bench: %s lists no model (set --model): %v", base, err)
	}
	return list.Data[0].ID, nil
}

// progress draws a one-line progress bar for the policy being run.
type progress struct {
	w       io.Writer
	policy  string
	index   int
	total   int
	planned time.Duration // last session start, simulated

	stop chan struct{}
	wg   sync.WaitGroup
}

// start begins redrawing the bar from d's counters every 250 ms.
func (p *progress) start(d *driver) {
	if p.w == nil {
		return
	}
	p.stop = make(chan struct{})
	p.wg.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			p.draw(d)
			select {
			case <-p.stop:
				p.draw(d)
				return
			case <-t.C:
			}
		}
	})
}

func (p *progress) draw(d *driver) {
	const width = 24
	el := d.elapsed()
	frac := 1.0
	if p.planned > 0 {
		frac = min(1, float64(el)/float64(p.planned))
	}
	n := int(frac * width)
	fmt.Fprintf(p.w, "\r\033[K[%d/%d] %-14s [%s%s] %3.0f%%  sim %4.0fs  sent %d  done %d  err %d  in flight %d",
		p.index+1, p.total, p.policy, strings.Repeat("█", n), strings.Repeat("·", width-n), 100*frac,
		el.Seconds(), d.sent.Load(), d.finished.Load(), d.failed.Load(), d.inflight.Load())
}

// finish stops the bar and ends its line.
func (p *progress) finish() {
	if p.stop == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	fmt.Fprintln(p.w)
	p.stop = nil
}
