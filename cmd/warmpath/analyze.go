package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/warmpath/warmpath/bench"
)

// runAnalyze replays a request log offline through the routing policies:
// `warmpath analyze [--window 10m] [--replicas 8] [--cache-blocks
// 150,300,600,1200,2400,4800] [--policies a,b] [--prefill-rate 15000]
// [--time-scale 1] [--seed 1] [--cpu-blocks N] [--json FILE] [--plot
// FILE.svg] TRACE.jsonl`.
// It prints the tables; --plot writes the cached-fraction chart to FILE.svg
// and the imbalance chart to FILE-imbalance.svg. `--synthetic
// agentic-harness` analyzes a synthetic coding-agent log
// (bench.WriteHarnessTrace) instead of a file; `--write-trace FILE` also
// writes that log out.
func runAnalyze(ctx context.Context, args []string) error {
	return analyze(ctx, args, os.Stdout)
}

func analyze(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("analyze", flag.ContinueOnError)
	window := fs.Duration("window", bench.DefaultAnalyzeWindow, "ceiling window: reuse counts only within it (0 = unlimited)")
	replicas := fs.Int("replicas", bench.DefaultAnalyzeReplicas, "simulated replicas")
	cacheBlocks := fs.String("cache-blocks", "", "comma-separated per-replica cache sizes in trace blocks (default ¼×…8× the simulator's KV capacity: 150,300,600,1200,2400,4800 for Mooncake)")
	policies := fs.String("policies", "", "comma-separated routing policies (default all)")
	rate := fs.Float64("prefill-rate", bench.DefaultPrefillTokensPerSec, "prefill tokens per second per replica")
	scale := fs.Float64("time-scale", 1, "multiply arrival times (0.5 = twice as dense)")
	seed := fs.Int64("seed", 1, "seed for random tie-breaks")
	cpuBlocks := fs.Int("cpu-blocks", 0, "per-replica CPU offload tier in trace blocks behind each cache (vLLM's native offloading; 0 = none)")
	jsonPath := fs.String("json", "", "write the report as JSON to `FILE`")
	plotPath := fs.String("plot", "", "write the cached-fraction chart to `FILE.svg` and the imbalance chart to FILE-imbalance.svg")
	synthetic := fs.String("synthetic", "", "analyze a synthetic log instead of a file: agentic-harness (coding agents sharing a harness, with sub-agents)")
	writeTrace := fs.String("write-trace", "", "with --synthetic, also write the log to `FILE`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if args := fs.NArg(); *synthetic != "" && args != 0 || *synthetic == "" && args != 1 {
		return fmt.Errorf("want one trace file (or --synthetic), got %d arguments; usage: warmpath analyze [flags] TRACE.jsonl", fs.NArg())
	}
	sizes, err := analyzeInts(*cacheBlocks)
	if err != nil {
		return fmt.Errorf("--cache-blocks: %w", err)
	}
	tr, err := analyzeTrace(fs.Arg(0), *synthetic, *writeTrace)
	if err != nil {
		return err
	}
	rep, err := bench.Analyze(ctx, bench.AnalyzeConfig{
		Trace: tr, Window: window, Replicas: *replicas, CacheBlocks: sizes, Policies: analyzeList(*policies),
		PrefillTokensPerSec: *rate, TimeScale: *scale, Seed: *seed, CPUBlocks: *cpuBlocks,
	})
	if err != nil {
		return err
	}
	if err := rep.WriteTable(stdout); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	if *jsonPath != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return fmt.Errorf("encode report: %w", err)
		}
		if err := os.WriteFile(*jsonPath, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	}
	if *plotPath != "" {
		imbalance := strings.TrimSuffix(*plotPath, ".svg") + "-imbalance.svg"
		if err := os.WriteFile(*plotPath, rep.Plot().SVG(), 0o644); err != nil {
			return fmt.Errorf("write plot: %w", err)
		}
		if err := os.WriteFile(imbalance, rep.ImbalancePlot().SVG(), 0o644); err != nil {
			return fmt.Errorf("write plot: %w", err)
		}
	}
	return nil
}

// analyzeTrace reads the trace file, or builds the synthetic log named
// (writing it to out when set).
func analyzeTrace(path, synthetic, out string) (*bench.Trace, error) {
	switch synthetic {
	case "":
		return bench.ReadTraceFile(path)
	case "agentic-harness":
	default:
		return nil, fmt.Errorf("--synthetic %q: want agentic-harness", synthetic)
	}
	var b bytes.Buffer
	if err := bench.WriteHarnessTrace(&b, bench.HarnessTraceConfig{}); err != nil {
		return nil, err
	}
	if out != "" {
		if err := os.WriteFile(out, b.Bytes(), 0o644); err != nil {
			return nil, fmt.Errorf("write trace: %w", err)
		}
	}
	return bench.ReadTrace(&b)
}

// analyzeList splits a comma-separated list, dropping empty items; "" gives
// nil (the default).
func analyzeList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// analyzeInts parses a comma-separated list of integers; "" gives nil.
func analyzeInts(s string) ([]int, error) {
	var out []int
	for _, f := range analyzeList(s) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}
