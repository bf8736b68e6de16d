package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/warmpath/warmpath/kvevents"
)

// runKVRelay relays KV events from engines whose PUB sockets connect to
// any number of gateways: `warmpath kv-relay --bind tcp://*:5557 --publish
// tcp://*:5560 [--ranks N] [--metrics ADDR]`. Engines point their
// --kv-events-config endpoint at --bind; gateways connect to --publish;
// replays still go from each gateway to each engine's replay endpoint.
func runKVRelay(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("kv-relay", flag.ContinueOnError)
	var cfg kvevents.RelayConfig
	fs.StringVar(&cfg.Bind, "bind", "tcp://*:5557", "address engines' KV-event PUB sockets connect to")
	fs.StringVar(&cfg.Publish, "publish", "tcp://*:5560", "address gateways subscribe to")
	fs.IntVar(&cfg.Ranks, "ranks", 1, "engines' data-parallel size: rank r dials --bind's port + r, so bind that many ports")
	fs.StringVar(&cfg.Subscribe, "subscribe", "", "topic prefix to relay (default: every message)")
	metrics := fs.String("metrics", "127.0.0.1:9557", "address serving /metrics and /health (empty: none)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	zctx, err := zmq.NewContext()
	if err != nil {
		return err
	}
	defer zctx.Term()
	reg := prometheus.NewRegistry()
	cfg.Metrics, cfg.Logger = kvevents.NewRelayMetrics(reg), log
	relay, err := kvevents.NewRelay(zctx, cfg)
	if err != nil {
		return err
	}
	log.Info("relaying KV events", "bind", relay.Endpoints(), "publish", relay.PublishEndpoint(), "metrics", *metrics)
	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return relay.Run(ctx) })
	if *metrics != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
		srv := &http.Server{Addr: *metrics, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		eg.Go(func() error {
			if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		eg.Go(func() error {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		})
	}
	return eg.Wait()
}
