package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"

	"github.com/warmpath/warmpath/bench"
)

// runOverhead measures the gateway's own cost against a plain reverse
// proxy and direct requests: `warmpath overhead [--policies warmpath,round-robin]
// [--shapes short=200:1000,sticky=200:1000,stream=1000,long=25:50] [--window 3s]
// [--rounds 3] [--max-rates 500,1000,…|none] [--fleet child|in-process]
// [--targets child|in-process] [--json FILE] [--quiet]`.
func runOverhead(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("overhead", flag.ContinueOnError)
	var cfg bench.OverheadConfig
	policies := fs.String("policies", "", "warmpath routing policies to measure (default warmpath,round-robin)")
	shapes := fs.String("shapes", "", "shape=rate:rate,… among short, sticky, stream, long (default short=200:1000,sticky=200:1000,stream=1000,long=25:50)")
	fs.DurationVar(&cfg.Window, "window", 0, "how long each target sends at one rate per round (default 3s)")
	fs.IntVar(&cfg.Rounds, "rounds", 0, "rounds the targets take turns (default 3)")
	maxRates := fs.String("max-rates", "", "short-prompt rates to climb for the highest held (default 500,1000,1500,2000,3000,4000; none to skip)")
	fs.StringVar(&cfg.RedisAddr, "redis", "", "a Redis server (host:port) for the gateways, its CPU outside the measurement (default: an in-process miniredis per gateway, counted)")
	jsonPath := fs.String("json", "", "write the report as JSON to FILE")
	quiet := fs.Bool("quiet", false, "no progress lines")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run (gateway, proxy and load; the simulator too with --fleet in-process) to FILE; samples carry a target label (pprof -tagfocus target=warmpath:warmpath)")
	tracePath := fs.String("trace", "", "write a runtime execution trace of the run to FILE; each target's windows are regions named \"overhead <target> <shape> <rate>\" (go tool trace FILE)")
	fs.StringVar(&cfg.Tokenizer, "tokenizer", "", "the warmpath targets' routing.tokenizer: simulator (default, in process) or replicas (their /tokenize)")
	fleetMode := fs.String("fleet", "child", "where the simulated replicas run: child (a `warmpath sim` process per fleet, their CPU not counted) or in-process")
	fs.StringVar(&cfg.TargetProfileDir, "target-profiles", "", "with --targets child, each target process writes a CPU profile of its run to DIR/<target>.prof")
	targetMode := fs.String("targets", "child", "where the proxy and the gateways run: child (a `warmpath overhead-target` process each; a target's CPU is its process's) or in-process (CPU net of the direct window's; implied by --cpuprofile and --trace)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Policies = splitFlag(*policies)
	var err error
	if cfg.Shapes, err = parseShapes(*shapes); err != nil {
		return err
	}
	if cfg.MaxRates, err = parseMaxRates(*maxRates); err != nil {
		return err
	}
	if *fleetMode != "in-process" {
		if cfg.FleetCommand, err = selfCommand("fleet", *fleetMode, "sim"); err != nil {
			return err
		}
	}
	// A profile or a trace of the run needs the targets in this process.
	if *targetMode != "in-process" && *cpuProfile == "" && *tracePath == "" {
		if cfg.TargetCommand, err = selfCommand("targets", *targetMode, "overhead-target"); err != nil {
			return err
		}
	}
	if !*quiet {
		cfg.Progress = os.Stderr
	}
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	if *tracePath != "" {
		stop, err := startTrace(*tracePath)
		if err != nil {
			return err
		}
		defer stop()
	}
	rep, err := bench.Overhead(ctx, cfg)
	if err != nil {
		return err
	}
	if err := rep.WriteTable(os.Stdout); err != nil {
		return err
	}
	if *jsonPath != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		return os.WriteFile(*jsonPath, append(b, '\n'), 0o644)
	}
	return nil
}

// parseShapes parses --shapes, shape=rate:rate,…; "" leaves the default
// (nil).
func parseShapes(s string) (map[string][]float64, error) {
	if s == "" {
		return nil, nil
	}
	shapes := map[string][]float64{}
	for _, f := range splitFlag(s) {
		name, rates, _ := strings.Cut(f, "=")
		for _, r := range strings.Split(rates, ":") {
			v, err := strconv.ParseFloat(r, 64)
			if err != nil || v <= 0 {
				return nil, flagError("shapes", f)
			}
			shapes[name] = append(shapes[name], v)
		}
	}
	return shapes, nil
}

// parseMaxRates parses --max-rates, rate,…; "" leaves the default (nil)
// and "none" gives an empty list, which skips the climb.
func parseMaxRates(s string) ([]float64, error) {
	switch s {
	case "":
		return nil, nil
	case "none":
		return []float64{}, nil
	}
	var rates []float64
	for _, f := range splitFlag(s) {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || v <= 0 {
			return nil, flagError("max-rates", f)
		}
		rates = append(rates, v)
	}
	return rates, nil
}

// selfCommand resolves --flag=mode, child or in-process: for child, the
// command that runs this binary's subcommand sub; for in-process, nil.
func selfCommand(flag, mode, sub string) ([]string, error) {
	switch mode {
	case "in-process":
		return nil, nil
	case "child":
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("--%s child: %w", flag, err)
		}
		return []string{exe, sub}, nil
	}
	return nil, fmt.Errorf("--%s %q: want child or in-process", flag, mode)
}

func flagError(flag, value string) error {
	return fmt.Errorf("--%s: %q is not a positive rate list", flag, value)
}

// runOverheadTarget serves one target of the overhead benchmark, the one
// --spec describes (bench.OverheadTarget as JSON), until it is killed:
// `warmpath overhead-target --spec JSON`. runOverhead starts these.
func runOverheadTarget(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("overhead-target", flag.ContinueOnError)
	spec := fs.String("spec", "", "the target, as bench.OverheadTarget JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var t bench.OverheadTarget
	if err := json.Unmarshal([]byte(*spec), &t); err != nil {
		return fmt.Errorf("--spec: %w", err)
	}
	if t.CPUProfile != "" {
		stop, err := startCPUProfile(t.CPUProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	return bench.ServeOverheadTarget(ctx, t, os.Stdout)
}

// startCPUProfile profiles this process's CPU into path until stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// startTrace writes a runtime execution trace of this process into path
// until stop.
func startTrace(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := trace.Start(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { trace.Stop(); f.Close() }, nil
}
