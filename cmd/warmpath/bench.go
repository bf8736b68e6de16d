package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/warmpath/warmpath/bench"
)

// runBench runs a live benchmark: `warmpath bench --workload shared-prefix
// [--policies …] [--replicas 8] [--kv-blocks B] [--cpu-blocks C] [--gateways 1] [--redis host:port] [--speed X] [--scale S] [--stage-scale F]
// [--seed N] [--trace FILE --time-scale F] [--limit N] [--duration D]
// [--drain D] [--parts P] [--record DIR] [--report DIR] [--json FILE] [--log FILE] [--fleet URLs [--kv-events EPs]] [--target
// URL] [--quiet]`.
func runBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var cfg bench.Config
	fs.StringVar(&cfg.Workload, "workload", "shared-prefix", "workload: "+strings.Join(bench.Workloads(), ", "))
	policies := fs.String("policies", "", "comma-separated routing policies (default all, round-robin first)")
	fs.IntVar(&cfg.Replicas, "replicas", bench.DefaultReplicas, "simulated replicas")
	fs.IntVar(&cfg.KVBlocks, "kv-blocks", 0, "simulated replicas' full-size KV capacity in 16-token blocks (default the profile's 19,208)")
	fs.IntVar(&cfg.CPUBlocks, "cpu-blocks", 0, "simulated replicas' CPU offload tier in full-size 16-token blocks (vLLM's native offloading; 0 = none)")
	fs.IntVar(&cfg.Gateways, "gateways", 1, "gateway instances sharing one Redis, requests spread over them in turn (an HA deployment)")
	fs.StringVar(&cfg.RedisAddr, "redis", "", "a Redis server (host:port) for the gateways, each run under its own key prefix, deleted after it (default: an in-process miniredis per run, its CPU in this process)")
	fs.Float64Var(&cfg.Speed, "speed", 0, fmt.Sprintf("simulated seconds per real second (default %d; 1 with --fleet/--target)", bench.DefaultSpeed))
	fs.Float64Var(&cfg.Scale, "scale", bench.DefaultScale, "token and KV-capacity scale (1 = full size; time is dilated to match)")
	fs.Float64Var(&cfg.StageScale, "stage-scale", bench.DefaultStageScale, "multiplies the shared-prefix ladder's stage lengths (1 = llm-d's 30 s)")
	fs.Int64Var(&cfg.Seed, "seed", bench.DefaultSeed, "workload and fleet seed")
	fs.StringVar(&cfg.TracePath, "trace", "", "trace file (Mooncake or chat-log JSONL) for --workload trace")
	fs.Float64Var(&cfg.TimeScale, "time-scale", 1, "multiplies trace arrival times (0.1 = ten times denser)")
	fs.IntVar(&cfg.Limit, "limit", 0, "keep the first N sessions (requests; runs for agentic)")
	fs.DurationVar(&cfg.Duration, "duration", 0, "drop sessions starting after this simulated time")
	fs.DurationVar(&cfg.Drain, "drain", bench.DefaultDrain, "simulated time outstanding requests get after the last session starts")
	fleet := fs.String("fleet", "", "comma-separated OpenAI-compatible replica URLs to benchmark instead of a simulated fleet")
	kvEvents := fs.String("kv-events", "", "comma-separated KV-event endpoints aligned with --fleet (tcp://host:5557,…)")
	fs.StringVar(&cfg.Target, "target", "", "benchmark this one endpoint (e.g. a deployed warmpath) as a single row")
	fs.StringVar(&cfg.APIKey, "api-key", os.Getenv("WARMPATH_API_KEY"), "bearer token for --target (env WARMPATH_API_KEY)")
	fs.StringVar(&cfg.Model, "model", "", "model to request (default: the simulator's, or the first the endpoint lists)")
	parts := fs.String("parts", "", "mixed-tenants: comma-separated parts to run, of no-burst, fifo, strict, fair, shares (default all)")
	reportDir := fs.String("report", "", "write an HTML report to DIR/index.html")
	jsonPath := fs.String("json", "", "write the results as JSON to FILE")
	samplesPath := fs.String("samples", "", "write every request (policy, turn, TTFT and its phases, replica, reason, cached tokens) as JSON lines to FILE")
	loadPath := fs.String("load", "", "write the simulated engines' sampled state (per replica: waiting, running, KV use, by simulated second) as JSON lines to FILE")
	fs.StringVar(&cfg.RecordDir, "record", "", "have the gateways record their routed requests under `DIR`/<policy> for warmpath analyze --record (on the simulated fleet they then tokenize in process)")
	quiet := fs.Bool("quiet", false, "no progress bar")
	logPath := fs.String("log", "", "write the simulated fleet's and the gateways' logs to FILE (text, info level)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Policies, cfg.Fleet, cfg.KVEvents, cfg.Parts = splitFlag(*policies), splitFlag(*fleet), splitFlag(*kvEvents), splitFlag(*parts)
	if *logPath != "" {
		f, err := os.Create(*logPath)
		if err != nil {
			return err
		}
		defer f.Close()
		cfg.Logger = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	if st, err := os.Stderr.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 && !*quiet {
		cfg.Progress = os.Stderr
	}
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if err := rep.WriteTable(os.Stdout); err != nil {
		return err
	}
	if *reportDir != "" {
		if err := rep.WriteHTMLDir(*reportDir); err != nil {
			return err
		}
	}
	if *samplesPath != "" {
		if err := writeFile(*samplesPath, rep.WriteSamples); err != nil {
			return err
		}
	}
	if *loadPath != "" {
		if err := writeFile(*loadPath, rep.WriteLoad); err != nil {
			return err
		}
	}
	if *jsonPath != "" {
		return rep.WriteJSONFile(*jsonPath)
	}
	return nil
}

// writeFile creates path and fills it with write.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

func splitFlag(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
