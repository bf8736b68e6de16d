package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/redis/go-redis/v9"
	"github.com/warmpath/warmpath/gateway"
)

// runServe runs the gateway: from --config and WARMPATH_* variables, or,
// with no fleet configured, on the embedded development setup.
func runServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	configPath := fs.String("config", os.Getenv("WARMPATH_CONFIG"), "YAML configuration file (env WARMPATH_CONFIG)")
	listen := fs.String("listen", "", "listen address (default 127.0.0.1:8080; env WARMPATH_LISTEN)")
	policy := fs.String("policy", "", "routing policy: round-robin, least-load, session-hash, approx-prefix, precise-prefix, warmpath (env WARMPATH_POLICY)")
	debug := fs.Bool("debug", false, "add X-Warmpath-* response headers naming the chosen replica and its scores")
	logLevel := fs.String("log-level", "info", "debug (adds a line per request), info, warn or error")
	logFormat := fs.String("log-format", "auto", "json, text, or auto: text when standard error is a terminal, json otherwise")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLogger(os.Stderr, *logLevel, *logFormat)
	if err != nil {
		return err
	}
	redis.SetLogger(gateway.RedisLogger(log)) // go-redis logs through one process-wide hook
	cfg, err := gateway.LoadConfig(*configPath, os.Getenv)
	if err != nil {
		return err
	}
	if *listen != "" {
		cfg.Listen = *listen
	}
	if *policy != "" {
		cfg.Routing.Policy = *policy
	}
	cfg.Debug = cfg.Debug || *debug

	eg, ctx := errgroup.WithContext(ctx)
	var dev *devStack
	if cfg.Embedded() {
		if dev, err = startDev(&cfg, log); err != nil {
			return err
		}
		defer dev.close()
		eg.Go(func() error { return dev.run(ctx) })
	}
	gw, err := gateway.New(cfg, gateway.Options{Logger: log, UpstreamAPIKey: os.Getenv("WARMPATH_UPSTREAM_API_KEY"), Getenv: os.Getenv})
	if err != nil {
		return err
	}
	eg.Go(func() error { return gw.Run(ctx) })
	eg.Go(func() error {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := gw.WaitReady(wctx); err != nil {
			if ctx.Err() != nil {
				return nil // the gateway stopped (its error is eg's): no banner
			}
			log.Warn("no replica is healthy yet; requests will get 503 until one is", "err", err)
		}
		printBanner(os.Stdout, gw.Addr(), gw.Policy(), &cfg, dev)
		return nil
	})
	return eg.Wait()
}

func printBanner(w io.Writer, addr, policy string, cfg *gateway.Config, dev *devStack) {
	base := "http://" + addr
	fmt.Fprintf(w, "warmpath: serving the OpenAI API on %s/v1 (policy %s)\n", base, policy)
	auth := ""
	if cfg.DevKey != "" {
		fmt.Fprintf(w, "warmpath: dev API key: %s\n", cfg.DevKey)
		auth = fmt.Sprintf(` -H "Authorization: Bearer %s"`, cfg.DevKey)
	}
	model := "<model>"
	if len(cfg.Replicas) > 0 && cfg.Replicas[0].Model != "" {
		model = cfg.Replicas[0].Model
	}
	if dev != nil {
		fmt.Fprintf(w, "warmpath: embedded development setup: %s and %d simulated vLLM replicas of %s\n", dev.store(), len(cfg.Replicas), model)
		if cfg.Auth.AdminKey != "" {
			fmt.Fprintf(w, "warmpath: admin key: %s (admin API under /admin/, status page %s/ui#key=%s)\n", cfg.Auth.AdminKey, base, cfg.Auth.AdminKey)
		}
	}
	fmt.Fprintf(w, "try:\n  curl -s %s/v1/chat/completions%s -H \"Content-Type: application/json\" -d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello from warmpath\"}]}'\n", base, auth, model)
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: l}
	if format == "auto" {
		format = "json"
		if isTerminal(w) {
			format = "text"
		}
	}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: %q is not json, text or auto", format)
}

// isTerminal reports whether w is a character device (a terminal), where
// a person reads the logs.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
