package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/warmpath/warmpath/gateway"
	"github.com/warmpath/warmpath/internal/redistest"
	"github.com/warmpath/warmpath/internal/testrun"
)

var discard = slog.New(slog.DiscardHandler)

// The embedded setup fills in a Redis only when none is configured: a
// configured redis.url or redis.addrs survives, so that
// WARMPATH_REDIS_ADDRS does not collide with an invented URL.
func TestStartDevRedis(t *testing.T) {
	tests := []struct {
		name      string
		env       map[string]string
		wantURL   string // "" = the embedded store's, checked by prefix
		wantAddrs []string
	}{
		{name: "none configured", wantURL: ""},
		{name: "url", env: map[string]string{"WARMPATH_REDIS_URL": "redis://redis.example:6379/2"}, wantURL: "redis://redis.example:6379/2"},
		{name: "sentinel addrs", env: map[string]string{"WARMPATH_REDIS_ADDRS": "s0:26379,s1:26379", "WARMPATH_REDIS_MASTER": "mymaster"}, wantAddrs: []string{"s0:26379", "s1:26379"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := gateway.LoadConfig("", func(k string) string { return tt.env[k] })
			if err != nil {
				t.Fatal(err)
			}
			cfg.Sim.Replicas = 1
			dev, err := startDev(&cfg, discard)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.close()
			embedded := tt.wantURL == "" && tt.wantAddrs == nil
			if got := dev.redis != nil; got != embedded {
				t.Errorf("embedded store started = %v; want %v", got, embedded)
			}
			switch {
			case embedded:
				if !strings.HasPrefix(cfg.Redis.URL, "redis://127.0.0.1:") {
					t.Errorf("redis.url = %q; want the embedded store's", cfg.Redis.URL)
				}
				if cfg.Redis.Tracking != "off" {
					t.Errorf("redis.tracking = %q on the embedded store; want off (miniredis has no CLIENT TRACKING)", cfg.Redis.Tracking)
				}
			default:
				if cfg.Redis.URL != tt.wantURL || strings.Join(cfg.Redis.Addrs, ",") != strings.Join(tt.wantAddrs, ",") {
					t.Errorf("redis = url %q addrs %v; want url %q addrs %v", cfg.Redis.URL, cfg.Redis.Addrs, tt.wantURL, tt.wantAddrs)
				}
			}
			if len(cfg.Replicas) != 1 {
				t.Errorf("replicas = %d; want the one simulated replica", len(cfg.Replicas))
			}
			if err := cfg.Check(); err != nil {
				t.Errorf("the embedded configuration does not validate: %v", err)
			}
		})
	}
}

// With a real Redis configured and no fleet, serve's embedded setup keeps
// its session bindings in that Redis.
func TestStartDevUsesConfiguredRedis(t *testing.T) {
	rdb, prefix := redistest.Client(t)
	addr := redistest.Addr(t)
	cfg := gateway.Config{Listen: "127.0.0.1:0", Redis: gateway.RedisConfig{URL: "redis://" + addr + "/0", KeyPrefix: prefix}}
	cfg.Sim.Replicas, cfg.Sim.Speed = 2, 50
	dev, err := startDev(&cfg, discard)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.close()
	gw, err := gateway.New(cfg, gateway.Options{Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return dev.run(ctx) })
	eg.Go(func() error { return gw.Run(ctx) })
	defer func() {
		cancel()
		if err := eg.Wait(); err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	if err := gw.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	body := `{"model":"qwen3-32b","max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+gw.Addr()+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+cfg.DevKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-ID", "dev-redis-test")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat completion: %d %s", resp.StatusCode, b)
	}
	// The conversation's binding, keyed by the session id and its opening,
	// and the family record under the bare session id are both written off
	// the request path (binding writes are spaced), so wait for the first.
	var keys []string
	conv := 0
	testrun.Eventually(t, 10*time.Second, func() bool {
		if keys, err = rdb.Keys(ctx, prefix+"sess:*").Result(); err != nil {
			t.Fatal(err)
		}
		conv = 0
		for _, k := range keys {
			if strings.HasPrefix(k, prefix+"sess:h:dev:dev-redis-test/") {
				conv++
			}
		}
		return conv > 0
	}, "the conversation's binding in Redis")
	if conv != 1 || len(keys) > 2 {
		t.Errorf("session keys under %q in the configured Redis = %v; want one conversation binding (and at most its family record)", prefix, keys)
	}
}
