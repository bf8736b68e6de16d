package gateway

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/vllmsim"
)

// The Server-Timing debug header names the gateway's phases; they happen
// within the client's request, and the upstream phase holds the replica's
// own delay (an injected latency, before its first token).
func TestServerTiming(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1, Speed: 50})
	extra := 5 * time.Second // simulated: 100 ms of wall clock at speed 50
	sim.Replicas()[0].SetFaults(vllmsim.Faults{ExtraLatency: extra})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)

	c := newConversation(words("timing", 300), "first")
	before := time.Now()
	r := c.turn(t, gw.URL, "next")
	elapsed := time.Since(before)
	phases := map[string]float64{}
	for _, m := range strings.Split(r.Header.Get("Server-Timing"), ",") {
		name, dur, _ := strings.Cut(strings.TrimSpace(m), ";dur=")
		ms, err := strconv.ParseFloat(dur, 64)
		if err != nil || ms < 0 {
			t.Fatalf("Server-Timing %q: phase %q", r.Header.Get("Server-Timing"), m)
		}
		phases[name] = ms
	}
	var sum float64
	for _, name := range []string{"prepare", "queue", "route", "upstream"} {
		ms, ok := phases[name]
		if !ok {
			t.Fatalf("Server-Timing %q lacks %s", r.Header.Get("Server-Timing"), name)
		}
		sum += ms
	}
	if wall := float64(extra) / 50 / float64(time.Millisecond); phases["upstream"] < wall {
		t.Errorf("upstream %.2f ms; want at least the replica's delay, %.0f ms", phases["upstream"], wall)
	}
	if sum > float64(elapsed)/float64(time.Millisecond) {
		t.Errorf("phases sum to %.2f ms, more than the request took (%v)", sum, elapsed)
	}
}
