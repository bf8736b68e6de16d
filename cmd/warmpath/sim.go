package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/warmpath/warmpath/kvevents"
	"github.com/warmpath/warmpath/vllmsim"
)

// runSim serves a simulated vLLM fleet: `warmpath sim --replicas N
// --http-port P --kv-port K [--replay-port R] [--speed X] [--kv-blocks B]
// [--model NAME] …`, with flags for other engines' quirks
// (--data-parallel-size, --first-seq, --no-tokenize, --prompt-blocks-only,
// --cpu-blocks, --cpu-store-only).
func runSim(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	var cfg vllmsim.Config
	fs.IntVar(&cfg.Replicas, "replicas", 1, "number of replicas")
	fs.StringVar(&cfg.Host, "host", vllmsim.DefaultHost, "address to bind")
	fs.IntVar(&cfg.HTTPPort, "http-port", 8100, "HTTP port of replica 0 (replica i uses port+i; 0 = ephemeral)")
	fs.IntVar(&cfg.KVPort, "kv-port", 5557, "KV-event PUB port of replica 0 (binds tcp://*:port+i; 0 = ephemeral)")
	fs.StringVar(&cfg.KVConnect, "kv-connect", "", "connect every replica's KV-event PUB to this endpoint (a gateway's central SUB) instead of binding")
	fs.IntVar(&cfg.ReplayPort, "replay-port", 0, "replay ROUTER port of replica 0 (0 = kv-port+100, -1 = none)")
	fs.Float64Var(&cfg.Speed, "speed", 1, "simulated seconds per real second")
	fs.IntVar(&cfg.KVBlocks, "kv-blocks", 0, "KV-cache blocks per replica (0 = profile default, 19208)")
	fs.IntVar(&cfg.BlockSize, "block-size", 0, "tokens per KV block (0 = 16)")
	fs.StringVar(&cfg.Model, "model", vllmsim.DefaultModel, "served model name")
	fs.StringVar(&cfg.SchedulingPolicy, "scheduling-policy", "fcfs", "fcfs or priority")
	fs.Int64Var(&cfg.Seed, "seed", 0, "fixed block-hash seed (0 = random per replica, like vLLM without PYTHONHASHSEED)")
	fs.DurationVar(&cfg.StreamInterval, "stream-interval", 0, "least real time between two chunks of a stream (0 = every step)")
	fs.IntVar(&cfg.DataParallelSize, "data-parallel-size", 1, "data-parallel ranks per replica (vLLM --data-parallel-size): rank r publishes on the replica's KV ports + r")
	fs.Uint64Var(&cfg.FirstSeq, "first-seq", 0, "sequence number of each engine's first KV-event batch (1 = llm-d-inference-sim)")
	fs.BoolVar(&cfg.NoTokenize, "no-tokenize", false, "answer 404 on /tokenize and /detokenize, as an engine behind a proxy that hides them")
	fs.BoolVar(&cfg.PromptBlocksOnly, "prompt-blocks-only", false, "cache only blocks made entirely of prompt tokens (llm-d-inference-sim)")
	fs.IntVar(&cfg.CPUBlocks, "cpu-blocks", 0, "blocks in each rank's CPU offload tier (vLLM's native offloading; 0 = none)")
	fs.BoolVar(&cfg.CPUStoreOnly, "cpu-store-only", false, "publish no CPU-tier removals, as LMCache")
	format := fs.String("event-format", "map", "KV-event layout: map (vLLM ≥ 0.26) or array (≤ 0.23)")
	legacyReplay := fs.Bool("legacy-replay", false, "frame replay replies without topic (vLLM ≤ 0.25)")
	verbose := fs.Bool("v", false, "log debug messages to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch *format {
	case "map":
		cfg.EventFormat = kvevents.FormatMap
	case "array":
		cfg.EventFormat = kvevents.FormatArray
	default:
		return fmt.Errorf("--event-format %q: want map or array", *format)
	}
	if *legacyReplay {
		cfg.ReplayFraming = kvevents.ReplayLegacy
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	return vllmsim.Run(ctx, cfg, os.Stdout)
}
