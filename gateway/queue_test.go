package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmpath/warmpath/gateway/admission"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/tenancy"
	"github.com/warmpath/warmpath/tenancy/fairq"
	"github.com/warmpath/warmpath/vllmsim"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// gatedClock is a vllmsim.Clock whose sleeps block while it is paused:
// an engine that takes a step while paused stays in it, with its requests
// running or waiting, until resume.
type gatedClock struct {
	mu     sync.Mutex
	open   chan struct{} // closed while running
	paused bool
}

func newGatedClock() *gatedClock {
	c := &gatedClock{open: make(chan struct{})}
	close(c.open)
	return c
}

func (c *gatedClock) Now() time.Time { return time.Now() }

func (c *gatedClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	open := c.open
	c.mu.Unlock()
	select {
	case <-open:
	case <-ctx.Done():
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *gatedClock) pause() {
	c.mu.Lock()
	if !c.paused {
		c.open, c.paused = make(chan struct{}), true
	}
	c.mu.Unlock()
}

func (c *gatedClock) resume() {
	c.mu.Lock()
	if c.paused {
		close(c.open)
		c.paused = false
	}
	c.mu.Unlock()
}

// queueSim is one replica that runs one sequence at a time.
func queueSim(t *testing.T, clock vllmsim.Clock, policy string) *vllmsim.Fleet {
	return startSim(t, vllmsim.Config{Clock: clock, SchedulingPolicy: policy, Profile: vllmsim.Profile{MaxNumSeqs: 1}})
}

// queueConfig is a gateway over sim whose queue saturates with one
// request in flight: the replica has room while it runs nothing.
func queueConfig(sim *vllmsim.Fleet) Config {
	cfg := fleetConfig(sim)
	cfg.Debug = true
	cfg.Queue.Saturation = admission.Saturation{EngineWaiting: 1, MaxRunning: 1}
	cfg.Queue.RecheckInterval = 20 * time.Millisecond
	return cfg
}

// asyncChat sends a chat completion in the background; its result
// arrives on the returned channel.
func asyncChat(ctx context.Context, url string, body map[string]any, header map[string]string) <-chan chatResult {
	out := make(chan chatResult, 1)
	go func() {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b))
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- chatResult{Status: -1, Body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		out <- chatResult{Status: resp.StatusCode, Header: resp.Header, Body: raw}
	}()
	return out
}

// chatBody is a small completion request; prior, when positive, makes it
// a later turn of a conversation whose earlier part is prior words long.
func chatBody(seed string, prior, maxTokens int) map[string]any {
	msgs := []msg{{"system", "you are " + seed}, {"user", "first question of " + seed}}
	if prior > 0 {
		msgs = append(msgs, msg{"assistant", words(seed, prior)}, msg{"user", "and then?"})
	}
	return map[string]any{"model": "qwen3-32b", "messages": msgs, "max_tokens": maxTokens, "ignore_eos": true}
}

// queued is the gateway's total queue depth.
func queued(t *testing.T, g *testGateway, labels map[string]string) float64 {
	return counter(t, g.Registry(), "warmpath_queue_depth", labels)
}

// saturate pauses the engine and sends a blocker that stays running, then
// waits until the gateway judges the model saturated. resume releases it.
// The blocker is sent once every replica's metrics have been scraped:
// before, no replica has room, and with a short queue.timeout the
// blocker itself would time out in the queue.
func saturate(t *testing.T, g *testGateway, clock *gatedClock) <-chan chatResult {
	t.Helper()
	testrun.Eventually(t, 10*time.Second, func() bool {
		for _, rep := range g.fleet.Snapshot().Replicas {
			if rep.State().ScrapedAt.IsZero() {
				return false
			}
		}
		return true
	}, "every replica scraped")
	clock.pause()
	blocker := asyncChat(t.Context(), g.URL, chatBody("blocker", 0, 8), nil)
	testrun.Eventually(t, 10*time.Second, func() bool {
		return counter(t, g.Registry(), "warmpath_replica_running", nil) == 1
	}, "the blocker running on the paused engine")
	return blocker
}

func TestQueueInProgressFirstThenLeastServed(t *testing.T) {
	clock := newGatedClock()
	sim := queueSim(t, clock, "")
	// The dispatch order is read from the gateway's own queue spans (each
	// ends when admission lets its request go), not from the order the
	// answers complete in.
	exp := tracetest.NewInMemoryExporter()
	g := startTracedGateway(t, queueConfig(sim), nil, exp, &syncBuffer{})
	blocker := saturate(t, g, clock)

	// A first turn, then a long-served turn in progress, then a short one:
	// they leave the queue short, long, first.
	type done struct {
		name string
		res  chatResult
	}
	results := make(chan done, 3)
	traces := map[string]trace.TraceID{}
	for i, s := range []struct {
		name  string
		prior int
	}{{"fresh", 0}, {"long", 2000}, {"short", 10}} {
		tp, tid, _ := clientTrace(i)
		traces[s.name] = tid
		ch := asyncChat(t.Context(), g.URL, chatBody(s.name, s.prior, 4), map[string]string{"traceparent": tp})
		go func() { results <- done{s.name, <-ch} }()
		testrun.Eventually(t, 10*time.Second, func() bool { return queued(t, g, nil) == float64(i+1) }, s.name+" queued")
	}
	clock.resume()
	if r := <-blocker; r.Status != http.StatusOK {
		t.Fatalf("blocker: %d %s", r.Status, r.Body)
	}
	for range 3 {
		d := <-results
		if d.res.Status != http.StatusOK {
			t.Fatalf("%s: %d %s", d.name, d.res.Status, d.res.Body)
		}
		if w, _ := strconv.ParseFloat(d.res.Header.Get("X-Warmpath-Queue-Ms"), 64); !(w > 0) {
			t.Errorf("%s: X-Warmpath-Queue-Ms = %q; want a wait", d.name, d.res.Header.Get("X-Warmpath-Queue-Ms"))
		}
		// Server-Timing's queue phase is the wait; the gateway's own
		// phases around it are small but never negative.
		if tm := d.res.Header.Get("Server-Timing"); !strings.Contains(tm, "queue;dur=") || strings.Contains(tm, "queue;dur=0.00,") || strings.Contains(tm, "dur=-") {
			t.Errorf("%s: Server-Timing = %q; want a queue wait and no negative phase", d.name, tm)
		}
	}
	granted := map[string]time.Time{}
	for name, tid := range traces {
		_, _, all := traceSpans(t, exp, tid)
		q := named(all, "warmpath.queue")
		if len(q) != 1 {
			t.Fatalf("%s: %d warmpath.queue spans; want 1", name, len(q))
		}
		granted[name] = q[0].EndTime
	}
	if !(granted["short"].Before(granted["long"]) && granted["long"].Before(granted["fresh"])) {
		t.Errorf("dispatch order short %v, long %v, fresh %v; want short, long, fresh",
			granted["short"], granted["long"], granted["fresh"])
	}
}

func TestQueueCancelLeavesAtOnce(t *testing.T) {
	clock := newGatedClock()
	sim := queueSim(t, clock, "")
	g := startGateway(t, queueConfig(sim), nil)
	blocker := saturate(t, g, clock)
	defer clock.resume()

	ctx, cancel := context.WithCancel(t.Context())
	res := asyncChat(ctx, g.URL, chatBody("leaver", 0, 4), nil)
	testrun.Eventually(t, 10*time.Second, func() bool { return queued(t, g, nil) == 1 }, "request queued")
	cancel()
	if r := <-res; r.Status != -1 {
		t.Fatalf("canceled request answered %d", r.Status)
	}
	testrun.Eventually(t, 10*time.Second, func() bool { return queued(t, g, nil) == 0 }, "queue empty after the cancel")
	if n := counter(t, g.Registry(), "warmpath_queue_canceled_total", nil); n != 1 {
		t.Errorf("warmpath_queue_canceled_total = %v; want 1", n)
	}
	testrun.Eventually(t, 10*time.Second, func() bool {
		return counter(t, g.Registry(), "warmpath_requests_total", map[string]string{"code": "499"}) == 1
	}, "the cancel counted as 499")
	clock.resume()
	if r := <-blocker; r.Status != http.StatusOK {
		t.Fatalf("blocker: %d", r.Status)
	}
	if n := counter(t, g.Registry(), "warmpath_queue_inflight", nil); n > 1 {
		t.Errorf("in flight after the cancel: %v", n)
	}
}

// wantQueue429 checks a refusal: 429 rate_limit_exceeded in the OpenAI
// envelope, with a Retry-After of whole seconds.
func wantQueue429(t *testing.T, r chatResult) {
	t.Helper()
	if r.Status != http.StatusTooManyRequests {
		t.Fatalf("status %d (%s); want 429", r.Status, r.Body)
	}
	var env struct {
		Error struct {
			Message, Type, Code string
			Param               *string
		} `json:"error"`
	}
	if err := json.Unmarshal(r.Body, &env); err != nil || env.Error.Code != "rate_limit_exceeded" || env.Error.Type != "rate_limit_error" || env.Error.Message == "" {
		t.Errorf("body %s; want the OpenAI envelope with code rate_limit_exceeded", r.Body)
	}
	if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || s < 1 {
		t.Errorf("Retry-After = %q; want whole seconds ≥ 1", r.Header.Get("Retry-After"))
	}
}

func TestQueue429OnOverflowAndTimeout(t *testing.T) {
	clock := newGatedClock()
	sim := queueSim(t, clock, "")
	cfg := queueConfig(sim)
	cfg.Queue.MaxQueued = 1
	cfg.Queue.Timeout = 100 * time.Millisecond
	g := startGateway(t, cfg, nil)
	blocker := saturate(t, g, clock)

	first := asyncChat(t.Context(), g.URL, chatBody("first", 0, 4), nil)
	testrun.Eventually(t, 10*time.Second, func() bool { return queued(t, g, nil) == 1 }, "first queued")
	if w := statusQueue(t, g); w["interactive"] != 1 || w["background"] != 0 {
		t.Errorf("the status page's queue = %v; want one interactive request waiting", w)
	}
	// The queue is full: refused at once (first is still waiting; it is
	// refused only when its timeout passes).
	wantQueue429(t, <-asyncChat(t.Context(), g.URL, chatBody("second", 0, 4), nil))
	wantQueue429(t, <-first)
	if n := counter(t, g.Registry(), "warmpath_queue_shed_total", map[string]string{"reason": "queue_full"}); n != 1 {
		t.Errorf("shed for queue_full = %v; want 1", n)
	}
	if n := counter(t, g.Registry(), "warmpath_queue_shed_total", map[string]string{"reason": "timeout"}); n != 1 {
		t.Errorf("shed for timeout = %v; want 1", n)
	}
	clock.resume()
	if r := <-blocker; r.Status != http.StatusOK {
		t.Fatalf("blocker: %d", r.Status)
	}
}

// load keeps n clients sending requests with header until stop, and
// returns how many each completed.
type load struct {
	stop atomic.Bool
	wg   sync.WaitGroup
}

func startLoad(t *testing.T, url string, n int, header map[string]string, seed string) *load {
	l := &load{}
	for i := range n {
		l.wg.Go(func() {
			for j := 0; !l.stop.Load(); j++ {
				r := chat(t, url, chatBody(fmt.Sprintf("%s-%d-%d", seed, i, j), 0, 2), header)
				if r.Status != http.StatusOK {
					t.Errorf("%s client %d: %d %s", seed, i, r.Status, r.Body)
					return
				}
			}
		})
	}
	return l
}

func (l *load) end() { l.stop.Store(true); l.wg.Wait() }

// starved sends one background request under sustained interactive load
// and returns how many interactive requests were dispatched between its
// arrival and its answer, or -1 if it was still waiting after 40.
func starved(t *testing.T, policy string) int {
	sim := startSim(t, vllmsim.Config{Profile: vllmsim.Profile{MaxNumSeqs: 1}})
	cfg := queueConfig(sim)
	cfg.Queue.Policy = policy
	g := startGateway(t, cfg, nil)
	// Eight closed-loop clients keep an interactive backlog at all times
	// (two fit in the engine): with fewer, the backlog can empty for a
	// moment between a completion and the client's next request, and
	// then even strict dispatches background, as it should.
	l := startLoad(t, g.URL, 8, nil, "chat")
	defer l.end()
	interactive := map[string]string{"class": "interactive"}
	testrun.Eventually(t, 10*time.Second, func() bool { return queued(t, g, interactive) >= 2 }, "an interactive backlog")
	before := counter(t, g.Registry(), "warmpath_queue_dispatches_total", interactive)
	bg := asyncChat(t.Context(), g.URL, chatBody("batch", 0, 2), map[string]string{fairq.HeaderPriority: "background"})
	for {
		select {
		case r := <-bg:
			if r.Status != http.StatusOK || r.Header.Get("X-Warmpath-Class") != "background" {
				t.Fatalf("background request: %d class %q %s", r.Status, r.Header.Get("X-Warmpath-Class"), r.Body)
			}
			return int(counter(t, g.Registry(), "warmpath_queue_dispatches_total", interactive) - before)
		case <-time.After(5 * time.Millisecond):
			if counter(t, g.Registry(), "warmpath_queue_dispatches_total", interactive)-before > 40 {
				l.end()
				if r := <-bg; r.Status != http.StatusOK {
					t.Fatalf("background request after the load: %d", r.Status)
				}
				return -1
			}
		}
	}
}

func TestQueueBackgroundNeverStarves(t *testing.T) {
	// Fair: background earns 0.1 of the dispatches while both wait, so it
	// leaves the queue after about 10 interactive dispatches; until its
	// answer more are counted: those admitted at once before the backlog
	// formed again, and those dispatched while it waits in the engine
	// behind the running one and runs. Twice the share's bound leaves
	// room for those and is still far from strict's starvation.
	if n := starved(t, fairq.PolicyFair); n < 0 || n > 20 {
		t.Errorf("fair: %d interactive dispatches passed the background request; want at most 20", n)
	}
	// Strict is the control: there it waits for as long as interactive
	// requests do.
	if n := starved(t, fairq.PolicyStrict); n != -1 {
		t.Errorf("strict: background dispatched after %d interactive; want it starved", n)
	}
}

// shareOfHeavy runs two tenants of weights 1 and 3 with six closed-loop
// clients each, each client's requests alternating over the gateways, and returns the heavy tenant's
// share of the queued completions after a warm-up.
func shareOfHeavy(t *testing.T, gws []*testGateway, light, heavy string) float64 {
	var mu sync.Mutex
	var seq []bool // heavy?, in completion order, queued requests only
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := range 12 {
		key, isHeavy := light, false
		if i%2 == 1 {
			key, isHeavy = heavy, true
		}
		wg.Go(func() {
			for j := 0; !stop.Load(); j++ {
				// Requests alternate over the gateways, as behind a
				// round-robin load balancer.
				url := gws[(i/2+j)%len(gws)].URL
				r := chat(t, url, chatBody(fmt.Sprintf("c%d-%d", i, j), 0, 4), bearer(key))
				if r.Status != http.StatusOK {
					t.Errorf("client %d: %d %s", i, r.Status, r.Body)
					return
				}
				if w, _ := strconv.ParseFloat(r.Header.Get("X-Warmpath-Queue-Ms"), 64); w > 0 {
					mu.Lock()
					seq = append(seq, isHeavy)
					if len(seq) >= 260 {
						stop.Store(true)
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	n := 0
	for _, h := range seq[60:] {
		if h {
			n++
		}
	}
	return float64(n) / float64(len(seq)-60)
}

// weightedTenants creates the two tenants on g and returns their keys.
func weightedTenants(t *testing.T, g *testGateway) (light, heavy string) {
	return newTenant(t, g.URL, "light", `,"weight":1`), newTenant(t, g.URL, "heavy", `,"weight":3`)
}

func sharesConfig(sim *vllmsim.Fleet) Config {
	cfg := tenantConfig(sim)
	cfg.Queue.Saturation = admission.Saturation{EngineWaiting: 1, MaxRunning: 2}
	cfg.Queue.RecheckInterval = 20 * time.Millisecond
	cfg.Queue.SyncInterval = 20 * time.Millisecond
	return cfg
}

func TestQueueWeightedSharesOneGateway(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	cfg := sharesConfig(sim)
	rdb := redisFor(t, &cfg)
	g := startGateway(t, cfg, rdb)
	light, heavy := weightedTenants(t, g)
	s := shareOfHeavy(t, []*testGateway{g}, light, heavy)
	t.Logf("weights 1:3, one gateway: the weight-3 tenant got %.3f of the queued dispatches", s)
	if s < 0.65 || s > 0.85 {
		t.Errorf("weight-3 tenant's share of queued dispatches = %.3f; want 0.75 ± 0.10", s)
	}
}

func TestQueueWeightedSharesTwoGateways(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	cfg := sharesConfig(sim)
	rdb := redisFor(t, &cfg)
	g1 := startGateway(t, cfg, rdb)
	light, heavy := weightedTenants(t, g1)
	g2 := startGateway(t, cfg, rdb)
	s := shareOfHeavy(t, []*testGateway{g1, g2}, light, heavy)
	t.Logf("weights 1:3, two gateways: the weight-3 tenant got %.3f of the queued dispatches", s)
	if s < 0.65 || s > 0.85 {
		t.Errorf("weight-3 tenant's share of queued dispatches over two gateways = %.3f; want 0.75 ± 0.10", s)
	}
}

func TestQueueClassDerivation(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	cfg := tenantConfig(sim)
	rdb := redisFor(t, &cfg)
	g := startGateway(t, cfg, rdb)
	open := newTenant(t, g.URL, "open", "")
	batch := newTenant(t, g.URL, "batch", `,"default_class":"background"`)
	capped := newTenant(t, g.URL, "capped", `,"class_ceiling":"background"`)
	var k struct {
		APIKey string `json:"api_key"`
	}
	if code := admin(t, g.URL, "POST", "/admin/tenants/open/keys", `{"name":"cron","class_ceiling":"background"}`, &k); code != http.StatusCreated {
		t.Fatalf("issue capped key: %d", code)
	}
	cappedKey := k.APIKey

	tests := []struct {
		name   string
		key    string
		tier   any
		header string
		want   string // class, or "400 <param>"
	}{
		{"default", open, nil, "", "interactive"},
		{"flex tier", open, "flex", "", "background"},
		{"priority tier over header", open, "priority", "background", "interactive"},
		{"auto tier says nothing", open, "auto", "background", "background"},
		{"header", open, nil, "background", "background"},
		{"tenant default", batch, nil, "", "background"},
		{"header over tenant default", batch, nil, "interactive", "interactive"},
		{"tenant ceiling caps header", capped, nil, "interactive", "background"},
		{"tenant ceiling caps tier", capped, "priority", "", "background"},
		{"key ceiling", cappedKey, nil, "", "background"},
		{"key ceiling caps tier", cappedKey, "priority", "interactive", "background"},
		{"bad header", open, nil, "urgent", "400 " + fairq.HeaderPriority},
		{"bad tier", open, "gold", "", "400 service_tier"},
		{"tier not a string", open, 3, "", "400 service_tier"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := chatBody("class", 0, 2)
			if tt.tier != nil {
				body["service_tier"] = tt.tier
			}
			h := bearer(tt.key)
			if tt.header != "" {
				h[fairq.HeaderPriority] = tt.header
			}
			r := chat(t, g.URL, body, h)
			if param, ok := strings.CutPrefix(tt.want, "400 "); ok {
				var env struct {
					Error struct{ Param, Type string } `json:"error"`
				}
				_ = json.Unmarshal(r.Body, &env)
				if r.Status != http.StatusBadRequest || env.Error.Param != param || env.Error.Type != "invalid_request_error" {
					t.Fatalf("status %d %s; want 400 naming %s", r.Status, r.Body, param)
				}
				return
			}
			if r.Status != http.StatusOK {
				t.Fatalf("status %d: %s", r.Status, r.Body)
			}
			if got := r.Header.Get("X-Warmpath-Class"); got != tt.want {
				t.Errorf("class %q; want %q", got, tt.want)
			}
		})
	}
}

func TestQueueVLLMPriority(t *testing.T) {
	bg := map[string]string{fairq.HeaderPriority: "background"}
	withPriority := func(b map[string]any) map[string]any { b["priority"] = 3; return b }
	tests := []struct {
		name       string
		scheduling string
		send       bool
		body       map[string]any
		header     map[string]string
		want       int
	}{
		// An fcfs engine rejects any non-zero priority: a 400 proves the
		// field was sent, a 200 that it was not.
		{"client priority dropped", "fcfs", false, withPriority(chatBody("p", 0, 2)), nil, 200},
		{"client priority dropped with vllm_priority", "fcfs", true, withPriority(chatBody("p", 0, 2)), nil, 200},
		{"class not sent without vllm_priority", "fcfs", false, chatBody("p", 0, 2), bg, 200},
		{"background sent as priority 1", "fcfs", true, chatBody("p", 0, 2), bg, 400},
		{"priority engine takes it", "priority", true, chatBody("p", 0, 2), bg, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sim := startSim(t, vllmsim.Config{SchedulingPolicy: tt.scheduling})
			cfg := fleetConfig(sim)
			cfg.Queue.VLLMPriority = tt.send
			g := startGateway(t, cfg, nil)
			r := chat(t, g.URL, tt.body, tt.header)
			if r.Status != tt.want {
				t.Errorf("status %d (%s); want %d", r.Status, r.Body, tt.want)
			}
		})
	}
}

func TestQueueSkipsUnservedModels(t *testing.T) {
	clock := newGatedClock()
	sim := queueSim(t, clock, "")
	g := startGateway(t, queueConfig(sim), nil)
	blocker := saturate(t, g, clock)
	defer func() { clock.resume(); <-blocker }()
	// The model is saturated, but a model nobody serves is answered at
	// once, and leaves no queue state behind.
	body := chatBody("x", 0, 2)
	body["model"] = "no-such-model"
	if r := chat(t, g.URL, body, nil); r.Status != http.StatusNotFound {
		t.Errorf("unknown model: %d; want 404", r.Status)
	}
	if n := counter(t, g.Registry(), "warmpath_queue_inflight", map[string]string{"model": "no-such-model"}); n != 0 {
		t.Errorf("queue state for an unknown model: %v", n)
	}
}

// FuzzRequestClass feeds client bodies and X-Warmpath-Priority headers to
// the parser: an accepted request has a valid class, an upstream body
// that is JSON and carries no client priority, and a sane ticket.
func FuzzRequestClass(f *testing.F) {
	for _, seed := range []struct{ body, header string }{
		{`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, ""},
		{`{"model":"m","service_tier":"flex","priority":7,"messages":[{"role":"user","content":"hi"}]}`, ""},
		{`{"model":"m","service_tier":"priority","messages":[{"role":"system","content":"s"},{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}`, "background"},
		{`{"model":"m","service_tier":null,"messages":[{"role":"assistant","content":null}]}`, " Interactive "},
		{`{"model":"m","service_tier":1,"messages":[{"role":"user","content":"hi"}]}`, "urgent"},
	} {
		f.Add(seed.body, seed.header, false)
		f.Add(seed.body, seed.header, true)
	}
	f.Fuzz(func(t *testing.T, body, header string, vllm bool) {
		p := &tenancy.Principal{TenantID: "t", TenantName: "t", DefaultClass: "interactive", ClassCeiling: "interactive", Weight: 2}
		r, err := request.Parse(request.Chat, http.Header{fairq.HeaderPriority: {header}}, []byte(body), p)
		if err != nil {
			return
		}
		if c := r.Class(); c != fairq.Interactive && c != fairq.Background {
			t.Fatalf("class %v", c)
		}
		ub, err := r.UpstreamBody(vllm)
		if err != nil || !json.Valid(ub) {
			t.Fatalf("upstream body %q: %v", ub, err)
		}
		var fields struct {
			Priority *int `json:"priority"`
		}
		_ = json.Unmarshal(ub, &fields)
		if want := vllm && r.Class() == fairq.Background; (fields.Priority != nil) != want || (want && *fields.Priority != 1) {
			t.Fatalf("upstream priority %v for class %v, vllm_priority %v", fields.Priority, r.Class(), vllm)
		}
		tk := admission.Ticket(r, r.EstimatedTokens(0))
		if tk.Cost < 0 || tk.Attained < 0 || tk.Turn < 0 || tk.Weight != 2 {
			t.Fatalf("ticket %+v", tk)
		}
	})
}

// BenchmarkAdmission measures the gateway's admission below saturation:
// the fair queue's fast path (a capacity check over the fleet's published
// state, the grant, and its release with usage) against admitting at
// once. It never blocks, sleeps or calls Redis, so the difference is the
// latency the queue adds to a request while the fleet has room.
func BenchmarkAdmission(b *testing.B) {
	sim, err := vllmsim.NewFleet(vllmsim.Config{Replicas: 8, Speed: 50})
	if err != nil {
		b.Fatal(err)
	}
	testrun.Start(b, "vllmsim", sim.Run)
	cfg := fleetConfig(sim)
	g, err := New(cfg, Options{})
	if err != nil {
		b.Fatal(err)
	}
	testrun.Start(b, "gateway", g.Run)
	testrun.Eventually(b, 10*time.Second, func() bool {
		ready := 0
		for _, rep := range g.fleet.Snapshot().Replicas {
			if st := rep.State(); st.Healthy && !st.ScrapedAt.IsZero() {
				ready++
			}
		}
		return ready == 8
	}, "the fleet to be ready (8 replicas healthy and scraped)")
	p := &tenancy.Principal{TenantID: "acme", TenantName: "acme", DefaultClass: "interactive", ClassCeiling: "interactive", Weight: 1}
	body := []byte(`{"model":"qwen3-32b","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"},{"role":"assistant","content":"hi"},{"role":"user","content":"more"}]}`)
	r, err := request.Parse(request.Chat, http.Header{}, body, p)
	if err != nil {
		b.Fatal(err)
	}
	u := request.Usage{PromptTokens: 40, CompletionTokens: 10, CachedTokens: 32}
	for _, bb := range []struct {
		name string
		a    admitFunc
	}{{"queue", g.adm.queued}, {"none", admitAll}} {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				release, err := bb.a(ctx, &turn{R: r})
				if err != nil {
					b.Fatal(err)
				}
				release(u)
			}
			if n := queuedDispatches(b, g); n != 0 {
				b.Fatalf("%v requests waited: the benchmark left the fast path", n)
			}
		})
	}
}

// queuedDispatches counts the requests the gateway's queue made wait.
func queuedDispatches(tb testing.TB, g *Gateway) float64 {
	mfs, err := g.Registry().Gather()
	if err != nil {
		tb.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "warmpath_queue_dispatches_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "path" && lp.GetValue() == "queued" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// The example configuration's queue block states the defaults.
func TestExampleQueueConfig(t *testing.T) {
	c, err := LoadConfig("../deploy/warmpath.example.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Queue.WithDefaults(), (admission.Config{}).WithDefaults(); got != want {
		t.Errorf("example queue block %+v; defaults %+v", got, want)
	}
}

// The queue's series reach GET /metrics, and their tenant label is
// bounded by auth.metrics_top_n: past the busiest tenants it is "other".
func TestQueueMetricsOnEndpoint(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	cfg := tenantConfig(sim)
	cfg.Auth.MetricsTopN = 1
	rdb := redisFor(t, &cfg)
	g := startGateway(t, cfg, rdb)
	for _, id := range []string{"first", "second"} {
		key := newTenant(t, g.URL, id, "")
		if r := chat(t, g.URL, chatBody(id, 0, 2), bearer(key)); r.Status != http.StatusOK {
			t.Fatalf("%s: status %d: %s", id, r.Status, r.Body)
		}
	}
	resp, err := http.Get("http://" + g.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	tenants := map[string]float64{}
	for line := range strings.Lines(string(raw)) {
		if !strings.HasPrefix(line, "warmpath_queue_dispatches_total{") {
			continue
		}
		labels, value, _ := strings.Cut(strings.TrimPrefix(line, "warmpath_queue_dispatches_total"), " ")
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			t.Fatalf("bad sample %q", line)
		}
		if v == 0 {
			continue // series are created at zero for the tenant's classes
		}
		if !strings.Contains(labels, `class="interactive"`) || !strings.Contains(labels, `path="fast"`) {
			t.Errorf("unexpected dispatch %s", line)
		}
		_, after, _ := strings.Cut(labels, `tenant="`)
		name, _, _ := strings.Cut(after, `"`)
		tenants[name] += v
	}
	if want := map[string]float64{"first": 1, tenancy.Other: 1}; fmt.Sprint(tenants) != fmt.Sprint(want) {
		t.Errorf("warmpath_queue_dispatches_total by tenant on /metrics = %v; want %v\n%s", tenants, want, raw)
	}
}

// A replica joins the interactive reserve when an interactive request is
// sent to it, up to InteractiveReserve replicas and never all of them,
// and leaves it ReserveIdle after its last one.
// Over HTTP on two simulated replicas: once an interactive turn has gone
// to a replica, background requests go elsewhere, including a background
// session bound to that replica (it is rebound), while the interactive
// session stays; when interactive traffic stops for ReserveIdle,
// background may use the replica again. ReserveIdle is an hour, so the
// reserve cannot lapse however slowly the requests run (with 300 ms, a
// loaded machine let it lapse before the sixth background request), and
// idleReserve stands for the hour without interactive traffic.
func TestQueueInteractiveReserve(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	cfg.Queue.Saturation.ReserveIdle = time.Hour
	g := startGateway(t, cfg, redisFor(t, &cfg))
	bg := map[string]string{"X-Warmpath-Priority": "background", "X-Session-ID": "shared"}
	inter := map[string]string{"X-Warmpath-Priority": "interactive", "X-Session-ID": "shared"}

	conv := newConversation("you are the reserve test", words("reserve", 200))
	conv.header = bg
	home := conv.turn(t, g.URL, "next step").replica()
	// The same session, now interactive, sticks to home and reserves it.
	conv.header = inter
	if r := conv.turn(t, g.URL, "and then?").replica(); r != home {
		t.Fatalf("interactive turn of the session went to %s; want its bound replica %s", r, home)
	}
	conv.header = bg
	if r := conv.turn(t, g.URL, "go on"); r.replica() == home {
		t.Errorf("background turn went to the reserved replica %s", r.replica())
	} else if got := r.Header.Get("X-Warmpath-Rebind"); got != scoring.RebindReserved {
		t.Errorf("background session left the reserve with rebind %q; want %q", got, scoring.RebindReserved)
	}
	for i := range 6 {
		r := chat(t, g.URL, chatBody(fmt.Sprintf("bg-%d", i), 0, 4), map[string]string{"X-Warmpath-Priority": "background"})
		if r.Status != http.StatusOK || r.replica() == home {
			t.Errorf("background request %d: status %d on %s; want 200 off the reserved %s", i, r.Status, r.replica(), home)
		}
	}
	ic := newConversation("you are the reserve test", words("reserve", 200))
	ic.header = map[string]string{"X-Warmpath-Priority": "interactive"}
	ic.turn(t, g.URL, "more")
	reserveGauge := func() map[string]float64 {
		out := map[string]float64{}
		for _, rep := range sim.Replicas() {
			n := rep.Info().Name
			out[n] = counter(t, g.Registry(), "warmpath_queue_interactive_reserve", map[string]string{"replica": n})
		}
		return out
	}
	for n, v := range reserveGauge() {
		if want := map[bool]float64{true: 1, false: 0}[n == home]; v != want {
			t.Errorf("warmpath_queue_interactive_reserve{replica=%q} = %v; want %v", n, v, want)
		}
	}
	// Interactive traffic stops: the reserve lapses and background may
	// go anywhere again.
	g.idleReserve()
	if v := reserveGauge()[home]; v != 0 {
		t.Errorf("warmpath_queue_interactive_reserve{replica=%q} = %v after the reserve lapsed; want 0", home, v)
	}
	n := 0
	testrun.Eventually(t, 10*time.Second, func() bool {
		n++
		return chat(t, g.URL, chatBody(fmt.Sprintf("after-%d", n), 0, 4), map[string]string{"X-Warmpath-Priority": "background"}).replica() == home
	}, "a background request on the formerly reserved replica")
}

// idleReserve dates every replica's last interactive request ReserveIdle
// back, as if no interactive request had been sent for that long: the
// reserve's clock moved on instead of the test waiting for it.
func (g *testGateway) idleReserve() {
	g.adm.queue.Capacity().ReleaseReserve()
}

// Over HTTP on two simulated replicas that run one sequence each: a
// session's turn bound to a busy replica heads the queue when the other
// replica frees. It waits for its replica (staying beats moving its
// prefix), and the request behind it, which routing sends to the free
// replica, goes at once. Nothing else re-checks the queue here (no
// scrapes, no recheck), so before routing-aware dispatch the head went to
// its busy replica's engine queue and the second request waited.
func TestQueueDispatchesAroundBoundHead(t *testing.T) {
	r := startBoundHead(t, 0)
	r.freeOther()
	<-r.other
	testrun.Eventually(t, 10*time.Second, func() bool { return r.depth("background") == 0 }, "the request behind the bound turn dispatched")
	if d := r.depth("interactive"); d != 1 {
		t.Errorf("interactive queue depth %v once %s freed; want the bound turn still waiting for %s", d, r.away, r.home)
	}
	r.finish(t)
}

// A streaming background request leaves its engine's queue at its first
// token, so the background request queued behind it (background may have
// one in an engine queue) dispatches then: not at the next scrape (none
// comes here) nor when the first request finishes, half a minute later.
func TestQueueBackgroundRoomAtFirstToken(t *testing.T) {
	clock := newGatedClock()
	sim := startSim(t, vllmsim.Config{Clock: clock, Replicas: 1, Speed: 1})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	cfg.Queue.RecheckInterval = time.Hour
	cfg.Health.Interval, cfg.Health.ScrapeInterval, cfg.Health.StaleAfter = time.Hour, time.Hour, 2*time.Hour
	g := startGateway(t, cfg, redisFor(t, &cfg))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	bg := map[string]string{"X-Warmpath-Priority": "background"}
	stream := func(seed string, maxTokens int) map[string]any {
		b := chatBody(seed, 0, maxTokens)
		b["stream"] = true
		return b
	}
	clock.pause()
	asyncChat(ctx, g.URL, stream("long", 3000), bg) // 3,000 steps of 11 ms
	testrun.Eventually(t, 10*time.Second, func() bool {
		return counter(t, g.Registry(), "warmpath_replica_inflight_requests", nil) == 1
	}, "the first background request sent to the paused engine")
	second := asyncChat(ctx, g.URL, stream("short", 4), bg)
	testrun.Eventually(t, 10*time.Second, func() bool { return queued(t, g, nil) == 1 }, "the second background request queued")
	clock.resume()
	select {
	case r := <-second:
		if r.Status != 200 {
			t.Fatalf("second request: %d %s", r.Status, r.Body)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the second background request still queued 15 s after the first one's first token")
	}
}

// A non-streaming request's first byte is its end, so only the scrapes
// say whether it started: requests the engine runs leave room for more,
// and the queue does not cap a replica at EngineWaiting of them in flight.
func TestQueueNonStreamingRunningLeaveRoom(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	cfg := fleetConfig(sim)
	cfg.Queue.Saturation = admission.Saturation{EngineWaiting: 2}
	cfg.Queue.RecheckInterval = 20 * time.Millisecond
	g := startGateway(t, cfg, redisFor(t, &cfg))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const n = 6 // each decodes 3,000 tokens: half a minute at 11 ms a step
	for i := range n {
		asyncChat(ctx, g.URL, chatBody(fmt.Sprint("long answer ", i), 0, 3000), nil)
	}
	testrun.Eventually(t, 10*time.Second, func() bool {
		return counter(t, g.Registry(), "warmpath_replica_running", nil) == n
	}, fmt.Sprintf("all %d requests running on the engine", n))
	if q := queued(t, g, nil); q != 0 {
		t.Errorf("%v requests still queued", q)
	}
}

// Over HTTP on two simulated replicas that run one sequence each, with a
// scan of one candidate: when the other replica frees, the queue's head (a
// session's turn bound to the busy replica) cannot start where routing
// sends it and goes there anyway (the fallback), holding the model's room
// until it is sent; the request behind it, which fits the free replica,
// waits meanwhile. Once the head has reached its replica, Refill
// dispatches the request behind it to the free replica. Nothing else
// re-checks the queue here (no scrapes, no recheck, no finish: the engines'
// clock is stopped), so without Refill it waited beside the idle replica.
func TestQueueRefillsAfterUnplacedSend(t *testing.T) {
	r := startBoundHead(t, 1)
	r.freeOther()
	<-r.other
	testrun.Eventually(t, 10*time.Second, func() bool { return r.inflight(r.home) == 2 }, "the bound turn sent to its busy "+r.home)
	testrun.Eventually(t, 10*time.Second, func() bool { return r.depth("background") == 0 && r.inflight(r.away) == 1 }, "the request behind the bound turn dispatched to the idle "+r.away)
	r.finish(t)
}

// boundHead is the scene both bound-head tests start from: two simulated
// replicas that run one sequence each, on a stopped clock, with no
// scrapes or recheck; a session's turn running on its home replica
// (blocker), a background request on the other one, away (other, which
// freeOther cancels), the session's next turn queued for its busy home
// (head) and a background request queued behind it (behind).
type boundHead struct {
	clock                        *gatedClock
	home, away                   string
	inflight, depth              func(string) float64
	blocker, other, head, behind <-chan chatResult
	freeOther                    context.CancelFunc
}

// startBoundHead sets the scene, with the queue's scan depth set to
// scanDepth when it is positive.
func startBoundHead(t *testing.T, scanDepth int) *boundHead {
	r := &boundHead{clock: newGatedClock()}
	sim := startSim(t, vllmsim.Config{Clock: r.clock, Replicas: 2, Profile: vllmsim.Profile{MaxNumSeqs: 1}})
	cfg := queueConfig(sim)
	if scanDepth > 0 {
		cfg.Queue.ScanDepth = scanDepth
	}
	cfg.Queue.RecheckInterval = time.Hour
	cfg.Health.Interval, cfg.Health.ScrapeInterval, cfg.Health.StaleAfter = time.Hour, time.Hour, 2*time.Hour
	g := startGateway(t, cfg, redisFor(t, &cfg))
	r.inflight = func(replica string) float64 {
		return counter(t, g.Registry(), "warmpath_replica_inflight_requests", map[string]string{"replica": replica})
	}
	r.depth = func(class string) float64 { return queued(t, g, map[string]string{"class": class}) }
	inter := map[string]string{"X-Session-ID": "bound", "X-Warmpath-Priority": "interactive"}
	bg := map[string]string{"X-Warmpath-Priority": "background"}

	conv := newConversation("you are the bound session", words("bound", 2000))
	conv.header = inter
	r.home = conv.turn(t, g.URL, "and then?").replica()
	body := map[string]any{"model": conv.model, "messages": conv.messages, "max_tokens": 4, "ignore_eos": true}

	r.clock.pause()
	r.blocker = asyncChat(t.Context(), g.URL, body, inter) // the session's turn, running on home
	testrun.Eventually(t, 10*time.Second, func() bool { return r.inflight(r.home) == 1 }, "the session's turn on "+r.home)
	otherCtx, freeOther := context.WithCancel(t.Context())
	r.other, r.freeOther = asyncChat(otherCtx, g.URL, chatBody("other", 0, 4), bg), freeOther
	testrun.Eventually(t, 10*time.Second, func() bool {
		for _, rep := range sim.Replicas() {
			if n := rep.Info().Name; n != r.home && r.inflight(n) == 1 {
				r.away = n
			}
		}
		return r.away != ""
	}, "a request on the other replica")

	r.head = asyncChat(t.Context(), g.URL, body, inter) // bound to home, which is busy
	testrun.Eventually(t, 10*time.Second, func() bool { return r.depth("interactive") == 1 }, "the bound turn queued")
	r.behind = asyncChat(t.Context(), g.URL, chatBody("behind", 0, 4), bg)
	testrun.Eventually(t, 10*time.Second, func() bool { return r.depth("background") == 1 }, "the request behind it queued")
	return r
}

// finish resumes the clock and checks where the three requests ran: the
// session's two turns at home, the one behind them away.
func (r *boundHead) finish(t *testing.T) {
	r.clock.resume()
	for name, ch := range map[string]<-chan chatResult{"blocker": r.blocker, "head": r.head, "behind": r.behind} {
		res := <-ch
		if res.Status != http.StatusOK {
			t.Fatalf("%s: %d %s", name, res.Status, res.Body)
		}
		want := map[string]string{"blocker": r.home, "head": r.home, "behind": r.away}[name]
		if res.replica() != want {
			t.Errorf("%s went to %s; want %s", name, res.replica(), want)
		}
	}
}

// statusQueue is the queue table of the status page's JSON: requests
// waiting, by class.
func statusQueue(t *testing.T, g *testGateway) map[string]int {
	t.Helper()
	q, _ := g.statusReport(time.Now())["queue"].(map[string]int)
	return q
}
