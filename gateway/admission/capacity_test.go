package admission

import (
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/tenancy/fairq"
)

// Each invalid queue setting is refused naming its field; the defaults
// are valid.
func TestConfigValidation(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"policy", func(q *Config) { q.Policy = "lottery" }, "queue.policy"},
		{"share", func(q *Config) { q.BackgroundShare = 1.5 }, "queue.background_share"},
		{"max queued", func(q *Config) { q.MaxQueued = -1 }, "queue.max_queued"},
		{"timeout", func(q *Config) { q.Timeout = -time.Second }, "queue.timeout"},
		{"engine waiting", func(q *Config) { q.Saturation.EngineWaiting = -2 }, "queue.saturation.engine_waiting"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			q := Config{}
			tt.edit(&q)
			q = q.WithDefaults()
			errs := q.Validate()
			if len(errs) == 0 || !strings.Contains(errs[0].Error(), tt.want) {
				t.Errorf("errors %v; want one naming %s", errs, tt.want)
			}
		})
	}
	if d := (Config{}).WithDefaults(); len(d.Validate()) != 0 {
		t.Errorf("defaults invalid: %v", d.Validate())
	}
}

func TestCapacityRoom(t *testing.T) {
	sat := (Config{}).WithDefaults().Saturation
	sat.MaxRunning = 10
	rep := &fleet.Replica{}
	t0 := time.Unix(1_800_000_000, 0)
	for _, tt := range []struct {
		name     string
		priority bool
		st       fleet.State
		inflight int
		pending  int64 // interactive not started
		class    fairq.Class
		want     int
		started  time.Time // the scrape under which one streaming request started, if set
	}{
		{"idle", false, fleet.State{}, 0, 0, fairq.Interactive, 4, time.Time{}},
		{"queue counts", false, fleet.State{Waiting: 3}, 0, 0, fairq.Interactive, 1, time.Time{}},
		{"sent since the scrape counts", false, fleet.State{Waiting: 1, InflightAtScrape: 5}, 7, 0, fairq.Interactive, 1, time.Time{}},
		{"finished since the scrape give room", false, fleet.State{Waiting: 5, InflightAtScrape: 9}, 6, 0, fairq.Interactive, 2, time.Time{}},
		{"not started count whatever the scrape", false, fleet.State{InflightAtScrape: 3}, 3, 3, fairq.Interactive, 1, time.Time{}},
		{"batch full", false, fleet.State{Running: 9, InflightAtScrape: 3}, 4, 0, fairq.Interactive, 0, time.Time{}},
		{"priority: only interactive ahead", true, fleet.State{Waiting: 30}, 0, 1, fairq.Interactive, 3, time.Time{}},
		{"background: short queue", false, fleet.State{Waiting: 0, KVUsage: 0.5}, 0, 0, fairq.Background, 1, time.Time{}},
		{"background: queue", false, fleet.State{Waiting: 1, KVUsage: 0.5}, 0, 0, fairq.Background, 0, time.Time{}},
		{"background: headroom", true, fleet.State{KVUsage: 0.9}, 0, 0, fairq.Background, 0, time.Time{}},
		{"background: started since the scrape", false, fleet.State{Waiting: 1, KVUsage: 0.5, ScrapedAt: t0}, 0, 0, fairq.Background, 1, t0},
		{"background: started before the scrape", false, fleet.State{Waiting: 1, KVUsage: 0.5, ScrapedAt: t0}, 0, 0, fairq.Background, 0, t0.Add(-time.Second)},
		{"started frees no more than waits", false, fleet.State{KVUsage: 0.5, InflightAtScrape: 2, ScrapedAt: t0}, 1, 0, fairq.Background, 2, t0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &Capacity{sat: sat, priority: tt.priority}
			c.loadFor(rep).pending[fairq.Interactive].Store(tt.pending)
			if !tt.started.IsZero() {
				c.loadFor(rep).noteStarted(tt.started)
			}
			if got := c.room(rep, &tt.st, tt.inflight, tt.class); got != tt.want {
				t.Errorf("room = %d; want %d", got, tt.want)
			}
		})
	}
}

func TestCapacityReserveMembership(t *testing.T) {
	sat := (Config{}).WithDefaults().Saturation
	sat.InteractiveReserve, sat.ReserveIdle = 2, time.Minute
	reps := []*fleet.Replica{{}, {}, {}}
	c := &Capacity{sat: sat}
	t0 := time.Unix(1000, 0)
	c.noteInteractive(reps[0], reps, t0)
	c.noteInteractive(reps[1], reps, t0.Add(time.Second))
	c.noteInteractive(reps[2], reps, t0.Add(2*time.Second))
	at := t0.Add(3 * time.Second)
	if got := []bool{c.reserved(reps[0], at), c.reserved(reps[1], at), c.reserved(reps[2], at)}; !got[0] || !got[1] || got[2] {
		t.Fatalf("reserved after three interactive starts = %v; want the first two (InteractiveReserve 2)", got)
	}
	// Replica 0 idles past ReserveIdle and leaves; replica 2, still
	// sent interactive work, takes its place.
	at = t0.Add(time.Minute + time.Second)
	c.noteInteractive(reps[1], reps, at)
	c.noteInteractive(reps[2], reps, at)
	if got := []bool{c.reserved(reps[0], at), c.reserved(reps[1], at), c.reserved(reps[2], at)}; got[0] || !got[1] || !got[2] {
		t.Fatalf("reserved after replica 0 idled = %v; want replicas 1 and 2", got)
	}
	// Never the whole fleet: a reserve of 2 over two replicas keeps one.
	two := []*fleet.Replica{{}, {}}
	c = &Capacity{sat: sat}
	c.noteInteractive(two[0], two, t0)
	c.noteInteractive(two[1], two, t0)
	if c.reserved(two[0], t0) == c.reserved(two[1], t0) {
		t.Errorf("two replicas, reserve 2: reserved %v, %v; want exactly one", c.reserved(two[0], t0), c.reserved(two[1], t0))
	}
	// Negative disables the reserve.
	sat.InteractiveReserve = -1
	c = &Capacity{sat: sat}
	c.noteInteractive(reps[0], reps, t0)
	if c.reserved(reps[0], t0) {
		t.Error("interactive_reserve -1: a replica was reserved")
	}
}

// KeepReserve hides reserved replicas from background routing only, and
// not when no other replica could take the request.
func TestKeepReserve(t *testing.T) {
	sat := (Config{}).WithDefaults().Saturation
	reps := []*fleet.Replica{{}, {}}
	c := &Capacity{sat: sat}
	c.noteInteractive(reps[0], reps, time.Now())
	for _, tt := range []struct {
		name      string
		class     fairq.Class
		unhealthy []bool // before
		want      []bool // after
	}{
		{"background avoids the reserve", fairq.Background, []bool{false, false}, []bool{true, false}},
		{"interactive sees every replica", fairq.Interactive, []bool{false, false}, []bool{false, false}},
		{"background falls back on the reserve", fairq.Background, []bool{false, true}, []bool{false, true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			eps := []scoring.Endpoint{{Unhealthy: tt.unhealthy[0]}, {Unhealthy: tt.unhealthy[1]}}
			c.KeepReserve(tt.class, reps, eps)
			unavailable := func(e scoring.Endpoint) bool { return e.Unhealthy || e.Reserved }
			if got := []bool{unavailable(eps[0]), unavailable(eps[1])}; got[0] != tt.want[0] || got[1] != tt.want[1] {
				t.Errorf("unavailable after KeepReserve = %v; want %v", got, tt.want)
			}
		})
	}
}
