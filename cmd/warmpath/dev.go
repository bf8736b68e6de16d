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
// serve`: an in-process Redis-compatible store and a simulated vLLM fleet.
type devStack struct {
	redis *miniredis.Miniredis
	sim   *vllmsim.Fleet
}

// startDev starts the embedded store, builds the simulated fleet and points
// cfg at both. The fleet serves once run is called.
func startDev(cfg *gateway.Config, log *slog.Logger) (*devStack, error) {
	sc := cfg.Sim
	if sc.Replicas == 0 {
		sc.Replicas = 4
	}
	if sc.Model == "" {
		sc.Model = "qwen3-32b"
	}
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		return nil, fmt.Errorf("embedded redis: %w", err)
	}
	sim, err := vllmsim.NewFleet(vllmsim.Config{
		Replicas: sc.Replicas,
		Speed:    sc.Speed,
		KVBlocks: sc.KVBlocks,
		Model:    sc.Model,
		Logger:   log.With("component", "vllmsim"),
	})
	if err != nil {
		mr.Close()
		return nil, fmt.Errorf("embedded simulated fleet: %w", err)
	}
	cfg.Redis.URL = "redis://" + mr.Addr()
	for _, r := range sim.Replicas() {
		info := r.Info()
		cfg.Replicas = append(cfg.Replicas, fleet.ReplicaSpec{
			Name: info.Name, URL: info.URL, Model: info.Model, KVEndpoint: info.KVEndpoint, ReplayEndpoint: info.ReplayEndpoint,
		})
	}
	if cfg.DevKey == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		cfg.DevKey = "sk-dev-" + hex.EncodeToString(b[:])
	}
	return &devStack{redis: mr, sim: sim}, nil
}

func (d *devStack) run(ctx context.Context) error { return d.sim.Run(ctx) }

func (d *devStack) close() { d.redis.Close() }
