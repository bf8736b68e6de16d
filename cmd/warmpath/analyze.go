package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/warmpath/warmpath/bench"
)

// runAnalyze replays a request log offline through the routing policies:
// `warmpath analyze [--window 10m] [--replicas 8] [--cache-blocks
// 150,300,600,1200,2400,4800] [--policies a,b] [--prefill-rate 15000]
// [--time-scale 1] [--seed 1] [--cpu-blocks N] [--json FILE] [--plot
// FILE.svg] TRACE.jsonl`; `--cache-conversations 0.5,1,2,4` and
// `--cpu-conversations X` size the caches in multiples of the trace's
// median prompt instead of blocks.
// It prints the tables; --plot writes the cached-fraction chart to FILE.svg
// and the imbalance chart to FILE-imbalance.svg. `--synthetic
// agentic-harness` analyzes a synthetic coding-agent log
// (bench.WriteHarnessTrace) instead of a file, `--synthetic agentic-real`
// the same at the real size (bench.RealSizeHarnessTrace), each generated
// from --trace-seed; `--write-trace FILE` also writes that log out.
// `--record DIR[,DIR…]` analyzes the gateway's own recording
// (bench.ReadRecordTrace) against what the fleet got on it, on as many
// replicas as it names unless --replicas says otherwise.
func runAnalyze(ctx context.Context, args []string) error {
	return analyze(ctx, args, os.Stdout)
}

func analyze(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("analyze", flag.ContinueOnError)
	window := fs.Duration("window", bench.DefaultAnalyzeWindow, "ceiling window: reuse counts only within it (0 = unlimited)")
	replicas := fs.Int("replicas", bench.DefaultAnalyzeReplicas, "simulated replicas (with --record, default as many as the recording names)")
	cacheBlocks := fs.String("cache-blocks", "", "comma-separated per-replica cache sizes in trace blocks (default ¼×…8× the simulator's KV capacity: 150,300,600,1200,2400,4800 for Mooncake)")
	policies := fs.String("policies", "", "comma-separated routing policies (default all)")
	rate := fs.Float64("prefill-rate", bench.DefaultPrefillTokensPerSec, "prefill tokens per second per replica")
	scale := fs.Float64("time-scale", 1, "multiply arrival times (0.5 = twice as dense)")
	seed := fs.Int64("seed", 1, "seed for random tie-breaks")
	cpuBlocks := fs.Int("cpu-blocks", 0, "per-replica CPU offload tier in trace blocks behind each cache (vLLM's native offloading; 0 = none)")
	jsonPath := fs.String("json", "", "write the report as JSON to `FILE`")
	plotPath := fs.String("plot", "", "write the cached-fraction chart to `FILE.svg` and the imbalance chart to FILE-imbalance.svg")
	cacheConvs := fs.String("cache-conversations", "", "comma-separated per-replica cache sizes in conversations: multiples of the trace's median prompt, rounded to blocks (replaces --cache-blocks)")
	cpuConvs := fs.Float64("cpu-conversations", 0, "per-replica CPU offload tier in conversations of the median prompt (replaces --cpu-blocks)")
	synthetic := fs.String("synthetic", "", "analyze a synthetic log instead of a file: agentic-harness (coding agents sharing a harness, with sub-agents) or agentic-real (the same at the real size of Claude Code sessions)")
	traceSeed := fs.Int64("trace-seed", 1, "with --synthetic, seed for the generated log")
	writeTrace := fs.String("write-trace", "", "with --synthetic, also write the log to `FILE`")
	recordDirs := fs.String("record", "", "analyze the gateway's recording (record.dir) instead of a trace file: comma-separated `DIRS`, merged by time")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := analyzeSource(fs, *synthetic, *recordDirs, replicas); err != nil {
		return err
	}
	if *cacheConvs != "" && *cacheBlocks != "" {
		return errors.New("--cache-conversations and --cache-blocks are exclusive")
	}
	if *cpuConvs != 0 && *cpuBlocks != 0 {
		return errors.New("--cpu-conversations and --cpu-blocks are exclusive")
	}
	sizes, err := analyzeInts(*cacheBlocks)
	if err != nil {
		return fmt.Errorf("--cache-blocks: %w", err)
	}
	convs, err := analyzeFloats(*cacheConvs)
	if err != nil {
		return fmt.Errorf("--cache-conversations: %w", err)
	}
	tr, err := analyzeTrace(fs.Arg(0), *synthetic, *writeTrace, *traceSeed, analyzeList(*recordDirs))
	if err != nil {
		return err
	}
	if convs != nil {
		sizes = analyzeConversations(stdout, tr, *cacheConvs, convs)
	}
	if *cpuConvs != 0 {
		*cpuBlocks = bench.ConversationBlocks(tr, []float64{*cpuConvs})[0]
		fmt.Fprintf(stdout, "CPU tier per replica: %g conversations of the median prompt = %d blocks\n", *cpuConvs, *cpuBlocks)
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

// analyzeTrace reads the trace file, or the recording in dirs, or builds
// the synthetic log named from seed (writing it to out when set).
func analyzeTrace(path, synthetic, out string, seed int64, dirs []string) (*bench.Trace, error) {
	var cfg bench.HarnessTraceConfig
	switch {
	case dirs != nil:
		return bench.ReadRecordTrace(dirs...)
	case synthetic == "":
		return bench.ReadTraceFile(path)
	case synthetic == "agentic-harness":
		cfg = bench.HarnessTraceConfig{Seed: seed}
	case synthetic == "agentic-real":
		cfg = bench.RealSizeHarnessTrace(bench.RealSizeRuns, bench.RealSizeActive, seed)
	default:
		return nil, fmt.Errorf("--synthetic %q: want agentic-harness or agentic-real", synthetic)
	}
	var b bytes.Buffer
	if err := bench.WriteHarnessTrace(&b, cfg); err != nil {
		return nil, err
	}
	if out != "" {
		if err := os.WriteFile(out, b.Bytes(), 0o644); err != nil {
			return nil, fmt.Errorf("write trace: %w", err)
		}
	}
	return bench.ReadTrace(&b)
}

// analyzeSource checks that fs names exactly one source: a trace file,
// a synthetic log or a recording; for a recording it leaves the fleet's
// size to the recording unless --replicas was given.
func analyzeSource(fs *flag.FlagSet, synthetic, recordDirs string, replicas *int) error {
	if args, other := fs.NArg(), synthetic != "" || recordDirs != ""; other && args != 0 || !other && args != 1 || synthetic != "" && recordDirs != "" {
		return fmt.Errorf("want one trace file (or --synthetic, or --record), got %d arguments; usage: warmpath analyze [flags] TRACE.jsonl", fs.NArg())
	}
	if recordDirs != "" && !flagSet(fs, "replicas") {
		*replicas = 0 // as many as the recording names
	}
	return nil
}

// flagSet reports whether the flag name was given on fs's command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
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

// analyzeConversations converts cache sizes in conversations (convs, as
// given in text) to blocks of tr and says so on w.
func analyzeConversations(w io.Writer, tr *bench.Trace, text string, convs []float64) []int {
	sizes := bench.ConversationBlocks(tr, convs)
	fmt.Fprintf(w, "cache per replica: %s conversations of the median prompt (%d tokens) = %s blocks\n",
		text, bench.MedianPrompt(tr), strings.Trim(fmt.Sprint(sizes), "[]"))
	return sizes
}

// analyzeFloats parses a comma-separated list of positive numbers; ""
// gives nil.
func analyzeFloats(s string) ([]float64, error) {
	var out []float64
	for _, f := range analyzeList(s) {
		x, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil, err
		}
		if !(x > 0) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("%s is not a positive number", f)
		}
		out = append(out, x)
	}
	return out, nil
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
