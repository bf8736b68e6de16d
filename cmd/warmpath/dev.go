package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"

	"github.com/alicebob/miniredis/v2"

	"github.com/warmpath/warmpath/gateway"
	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/vllmsim"
)

// devStack is the embedded development setup behind a bare `warmpath
// serve`: an in-process Redis-compatible store (unless Redis is configured)
// and a simulated vLLM fleet.
type devStack struct {
	redis *miniredis.Miniredis // nil when cfg named a Redis
	sim   *vllmsim.Fleet
}

// startDev builds the simulated fleet and points cfg at it. When cfg names
// no Redis (neither redis.url nor redis.addrs), it also starts the embedded
// store and points cfg at that; a configured Redis is left as it is. The
// fleet serves once run is called.
func startDev(cfg *gateway.Config, log *slog.Logger) (*devStack, error) {
	sc := cfg.Sim.WithDefaults()
	var mr *miniredis.Miniredis
	if cfg.Redis.URL == "" && len(cfg.Redis.Addrs) == 0 {
		mr = miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return nil, fmt.Errorf("embedded redis: %w", err)
		}
	}
	d := &devStack{redis: mr}
	sim, err := vllmsim.NewFleet(vllmsim.Config{
		Replicas: sc.Replicas,
		Speed:    sc.Speed,
		KVBlocks: sc.KVBlocks,
		Model:    sc.Model,
		Logger:   log.With("component", "vllmsim"),
	})
	if err != nil {
		d.close()
		return nil, fmt.Errorf("embedded simulated fleet: %w", err)
	}
	d.sim = sim
	if mr != nil {
		cfg.Redis.URL = "redis://" + mr.Addr()
		// miniredis has neither CLIENT ID nor CLIENT TRACKING: trying them
		// only logged a warning on every first run.
		cfg.Redis.Tracking = "off"
	}
	for _, r := range sim.Replicas() {
		info := r.Info()
		cfg.Replicas = append(cfg.Replicas, fleet.ReplicaSpec{
			Name: info.Name, URL: info.URL, Model: info.Model, KVEndpoint: info.KVEndpoint, ReplayEndpoint: info.ReplayEndpoint,
		})
	}
	if cfg.Auth.AdminKey == "" && cfg.Auth.AdminKeyFile == "" {
		// The admin API and the status page, for the developer.
		var b [16]byte
		_, _ = rand.Read(b[:])
		cfg.Auth.AdminKey = "wp-admin-dev-" + hex.EncodeToString(b[:])
	}
	if cfg.Server.PreStop == 0 {
		cfg.Server.PreStop = -1 // no load balancer in front of a developer's gateway
	}
	if cfg.Routing.Tokenizer == "" {
		// The fleet is simulated: tokenize with its vocabulary in process
		// (routing.tokenizer: replicas asks its /tokenize instead).
		cfg.Routing.Tokenizer = gateway.TokenizerSimulator
	}
	if cfg.DevKey == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		cfg.DevKey = "sk-dev-" + hex.EncodeToString(b[:])
	}
	return d, nil
}

func (d *devStack) run(ctx context.Context) error { return d.sim.Run(ctx) }

// store describes where session bindings live, for the banner.
func (d *devStack) store() string {
	if d.redis == nil {
		return "the configured Redis"
	}
	return "in-process Redis (miniredis)"
}

func (d *devStack) close() {
	if d.redis != nil {
		d.redis.Close()
	}
}
