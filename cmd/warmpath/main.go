// Command warmpath is the warmpath gateway and its tools, one binary with
// subcommands. Each subcommand lives in its own file, parses its flags and
// calls one package's Run; this file only dispatches.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

type command struct {
	name  string
	short string
	run   func(ctx context.Context, args []string) error
}

func commands() []command {
	return []command{
		{"serve", "run the gateway (embedded dev setup when nothing is configured)", runServe},
		{"sim", "run a simulated vLLM fleet", runSim},
		{"bench", "benchmark routing policies live on a simulated (or given) fleet", runBench},
		{"analyze", "replay a request log offline through every routing policy", runAnalyze},
		{"admin", "manage tenants, keys and usage through a gateway's admin API", runAdmin},
		{"migrate", "apply pending Redis keyspace migrations", runMigrate},
		{"config", "check FILE: validate a configuration offline, naming every bad field", runConfig},
		{"overhead", "measure the gateway's own cost per request against a plain proxy and direct", runOverhead},
		{"overhead-target", "serve one target of the overhead benchmark (overhead runs it)", runOverheadTarget},
		{"kv-relay", "relay connecting engines' KV events to several gateways", runKVRelay},
	}
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: warmpath <command> [flags]\n\ncommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(os.Stderr, "  %-15s %s\n", c.name, c.short)
	}
	fmt.Fprintf(os.Stderr, "\nRun 'warmpath <command> -h' for a command's flags.\n")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		os.Exit(2)
	}
	for _, c := range commands() {
		if c.name != os.Args[1] {
			continue
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := c.run(ctx, os.Args[2:])
		stop()
		if err != nil && !errors.Is(err, flag.ErrHelp) && !errors.Is(err, context.Canceled) {
			fmt.Fprintf(os.Stderr, "warmpath %s: %v\n", c.name, err)
			os.Exit(1)
		}
		return
	}
	fmt.Fprintf(os.Stderr, "warmpath: unknown command %q\n\n", os.Args[1])
	usage()
	os.Exit(2)
}
