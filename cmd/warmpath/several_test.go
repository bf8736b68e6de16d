package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/redistest"
	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/vllmsim"
)

// The slow model of TestSeveralGateways: one simulated replica whose every
// step takes slowStep, so a background response (16–63 tokens) lasts
// 16–63 s, outlives the failover and is still running when cancelled.
const (
	slowModel = "slow-e2e"
	slowStep  = time.Second
)

// Failover bounds of TestSeveralGateways. With the Redis breaker
// (gateway/redis.go) a request waits at most redis.timeout (250 ms) per
// Redis call before three failures open it, then none at all: chat
// requests authenticate from the key cache and route from in-process
// state, so none should fail and none should wait anywhere near a dial
// timeout (go-redis: 5 s).
//
// A failover takes about 3 s here (node timeout or down-after 1 s, the
// election, the clients' slot-map reload or +switch-master): a chain's
// Redis-only state is back within maxChainRecover, 4× that, for a loaded
// 2-core machine.
const (
	maxFailedChats  = 2               // of ~150 over the window
	maxFailoverP99  = 2 * time.Second // a hang on dials would show ≥ 5 s
	maxChainRecover = 12 * time.Second
	trafficFor      = 15 * time.Second
	killAfter       = 3 * time.Second
)

// Two `warmpath serve` processes over one private Redis Cluster, then one
// private Sentinel topology, share state: a tenant and key made at A work
// at B; a conversation alternating A and B stays on its replica; a
// Responses chain made at A continues at B; a 30/min key admits 30 ± 2 of
// 60 requests over both; a key revoked at A is refused at B within a
// second. Then the master holding most of the run's keys is SIGKILLed
// under 10 requests a second over both gateways for 15 s: at most
// maxFailedChats fail, the p99 over the failover window stays under
// maxFailoverP99, a chain made before the kill continues after it at B
// and A, and two background responses started at A before it still run
// after it; one is polled and cancelled at B (its run aborted at the
// replica), the other must not be left in_progress with neither a run nor
// a lease. One line per topology logs the figures ("FIGURES").
//
// Run alone: go test -race -run TestSeveralGateways -v ./cmd/warmpath
func TestSeveralGateways(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two gateway processes per topology")
	}
	bin := buildBinary(t)
	sim, err := vllmsim.NewFleet(vllmsim.Config{Replicas: 3, Speed: 50})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "vllmsim", sim.Run)
	for _, kind := range []redistest.Kind{redistest.Cluster, redistest.Sentinel} {
		t.Run(string(kind), func(t *testing.T) {
			// A slow replica per topology: its counts are this run's.
			slow, err := vllmsim.NewFleet(vllmsim.Config{Replicas: 1, Model: slowModel, Profile: vllmsim.Profile{StepBase: slowStep}})
			if err != nil {
				t.Fatal(err)
			}
			testrun.Start(t, "vllmsim slow", slow.Run)
			severalGateways(t, bin, kind, append(slices.Clone(sim.Replicas()), slow.Replicas()...), slow.Replicas()[0])
		})
	}
}

// e2e is one run of TestSeveralGateways: two gateways and their clients.
type e2e struct {
	t      *testing.T
	gw     [2]string // A, B
	admin  string
	client *http.Client
}

// do sends method path with body (JSON-encoded unless nil) to gateway i
// with the bearer key and returns the status, headers and body; a
// transport error is status 0 with the error's text as the body.
func (e *e2e) do(i int, method, path, key string, body any) (int, http.Header, []byte) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://"+e.gw[i]+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return 0, nil, []byte(err.Error())
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, resp.Header, []byte(err.Error())
	}
	return resp.StatusCode, resp.Header, raw
}

// must is do that fails the test unless the status is want, and decodes
// the body into out (when not nil).
func (e *e2e) must(want, i int, method, path, key string, body, out any) http.Header {
	e.t.Helper()
	code, h, raw := e.do(i, method, path, key, body)
	if code != want {
		e.t.Fatalf("%s %s at gateway %c: %d %s; want %d", method, path, 'A'+i, code, raw, want)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			e.t.Fatalf("%s %s at gateway %c: decode %s: %v", method, path, 'A'+i, raw, err)
		}
	}
	return h
}

func chatBody(msgs []map[string]string, model string) map[string]any {
	return map[string]any{"model": model, "max_tokens": 4, "messages": msgs}
}

type responseObj struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Prev   string `json:"previous_response_id"`
	Output []struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
}

func severalGateways(t *testing.T, bin string, kind redistest.Kind, replicas []*vllmsim.Replica, slowReplica *vllmsim.Replica) {
	tp := redistest.StartTopology(t, kind)
	rnd := make([]byte, 4)
	rand.Read(rnd)
	prefix := "e2e" + hex.EncodeToString(rnd) + ":"
	adminKey := "admin-key-e2e-" + hex.EncodeToString(rnd)
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "redis:\n  key_prefix: %q\n  addrs: [", prefix)
	for i, a := range tp.Addrs {
		if i > 0 {
			cfg.WriteString(", ")
		}
		fmt.Fprintf(&cfg, "%q", a)
	}
	cfg.WriteString("]\n")
	if tp.MasterName != "" {
		fmt.Fprintf(&cfg, "  master_name: %q\n", tp.MasterName)
	}
	fmt.Fprintf(&cfg, "auth: {mode: keys, admin_key: %q, salt_secret: %q}\n", adminKey, "e2e-salt-secret-0123456789")
	cfg.WriteString("debug: true\nresponses: {background_workers: 2}\nreplicas:\n")
	for _, r := range replicas {
		in := r.Info()
		fmt.Fprintf(&cfg, "  - {url: %q, model: %q, kv_events: %q, kv_replay: %q}\n", in.URL, in.Model, in.KVEndpoint, in.ReplayEndpoint)
	}
	path := filepath.Join(t.TempDir(), "warmpath.yaml")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	e := &e2e{t: t, admin: adminKey, client: &http.Client{Timeout: 15 * time.Second}}
	e.gw = [2]string{freeAddr(t), freeAddr(t)}
	startGatewayProcess(t, bin, path, e.gw[0])
	startGatewayProcess(t, bin, path, e.gw[1])
	const A, B = 0, 1
	model := vllmsim.DefaultModel

	// 1. A tenant and key made at A work at B.
	tenant := "acme-" + hex.EncodeToString(rnd)
	e.must(http.StatusCreated, A, "POST", "/admin/tenants", adminKey, map[string]any{"id": tenant}, nil)
	issue := func(name string, limits map[string]int) (id, secret string) {
		var k struct {
			ID     string `json:"id"`
			APIKey string `json:"api_key"`
		}
		body := map[string]any{"name": name}
		if limits != nil {
			body["limits"] = limits
		}
		e.must(http.StatusCreated, A, "POST", "/admin/tenants/"+tenant+"/keys", adminKey, body, &k)
		return k.ID, k.APIKey
	}
	_, key := issue("main", nil)
	e.must(http.StatusOK, B, "GET", "/admin/tenants/"+tenant, adminKey, nil, nil)
	hello := []map[string]string{{"role": "user", "content": "hello from B"}}
	e.must(http.StatusOK, B, "POST", "/v1/chat/completions", key, chatBody(hello, model), nil)

	// 2. A conversation alternating A and B stays on one replica.
	msgs := []map[string]string{{"role": "system", "content": "sticky conversation " + strings.Repeat("shared context words ", 60)}}
	var home string
	for turn := range 8 {
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("turn %d", turn)})
		var out struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		h := e.must(http.StatusOK, turn%2, "POST", "/v1/chat/completions", key, chatBody(msgs, model), &out)
		replica := h.Get("X-Warmpath-Replica")
		if replica == "" {
			t.Fatal("no X-Warmpath-Replica header: debug headers off?")
		}
		switch {
		case home == "":
			home = replica
		case replica != home && h.Get("X-Warmpath-Rebind") != scoring.RebindSaturated:
			t.Errorf("turn %d at gateway %c went to %s, the conversation's replica is %s (reason %q, rebind %q)",
				turn, 'A'+turn%2, replica, home, h.Get("X-Warmpath-Reason"), h.Get("X-Warmpath-Rebind"))
		}
		if len(out.Choices) > 0 {
			msgs = append(msgs, map[string]string{"role": "assistant", "content": out.Choices[0].Message.Content})
		}
		// A binding reaches the other gateway up to
		// routing.binding_write_spacing after the turn (20 ms until the
		// gateways see each other): a client's next turn comes later
		// than the simulated replicas' few milliseconds.
		time.Sleep(50 * time.Millisecond)
	}

	// 3. A Responses chain made at A continues at B.
	chain := func(at int, prev, input string) (int, responseObj, []byte) {
		body := map[string]any{"model": model, "input": input, "max_output_tokens": 16}
		if prev != "" {
			body["previous_response_id"] = prev
		}
		code, _, raw := e.do(at, "POST", "/v1/responses", key, body)
		var r responseObj
		if code == http.StatusOK {
			_ = json.Unmarshal(raw, &r)
		}
		return code, r, raw
	}
	mustChain := func(at int, prev, input string) responseObj {
		t.Helper()
		code, r, raw := chain(at, prev, input)
		if code != http.StatusOK || r.ID == "" {
			t.Fatalf("POST /v1/responses at gateway %c (previous %q): %d %s", 'A'+at, prev, code, raw)
		}
		return r
	}
	r1 := mustChain(A, "", "first turn of the chain")
	r2 := mustChain(B, r1.ID, "second turn, at B")
	var got responseObj
	e.must(http.StatusOK, B, "GET", "/v1/responses/"+r2.ID, key, nil, &got)
	// incomplete: the simulated answer may run past max_output_tokens.
	if got.Prev != r1.ID || (got.Status != "completed" && got.Status != "incomplete") {
		t.Errorf("GET /v1/responses/%s at B: previous %q, status %q; want %q, completed or incomplete", r2.ID, got.Prev, got.Status, r1.ID)
	}
	r3 := mustChain(A, r2.ID, "third turn, back at A")

	// 4. 30 requests a minute on a key, over both gateways: 30 ± 2 of 60.
	_, limited := issue("limited", map[string]int{"requests_per_minute": 30})
	var admitted, refused, other int
	{
		var mu sync.Mutex
		var wg sync.WaitGroup
		next := make(chan int)
		for range 6 {
			wg.Go(func() {
				for i := range next {
					code, _, raw := e.do(i%2, "POST", "/v1/chat/completions", limited, chatBody([]map[string]string{{"role": "user", "content": fmt.Sprintf("limited %d", i)}}, model))
					mu.Lock()
					switch code {
					case http.StatusOK:
						admitted++
					case http.StatusTooManyRequests:
						refused++
					default:
						other++
						t.Errorf("limited request %d: %d %s", i, code, raw)
					}
					mu.Unlock()
				}
			})
		}
		for i := range 60 {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	if admitted < 28 || admitted > 32 {
		t.Errorf("a 30/min key admitted %d of 60 requests over both gateways (%d refused, %d other); want 30 ± 2", admitted, refused, other)
	}

	// 5. A key revoked at A is refused at B within a second.
	revID, revoked := issue("revoked", nil)
	e.must(http.StatusOK, B, "POST", "/v1/chat/completions", revoked, chatBody(hello, model), nil) // B caches it
	e.must(http.StatusOK, A, "POST", "/admin/tenants/"+tenant+"/keys/"+revID+"/revoke", adminKey, nil, nil)
	revokedAt := time.Now()
	var revocation time.Duration
	for {
		code, _, _ := e.do(B, "POST", "/v1/chat/completions", revoked, chatBody(hello, model))
		if code == http.StatusUnauthorized {
			revocation = time.Since(revokedAt)
			break
		}
		if time.Since(revokedAt) > 3*time.Second {
			t.Fatalf("the key revoked at A still works at B after %v (last %d)", time.Since(revokedAt), code)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if revocation > time.Second {
		t.Errorf("the key revoked at A was refused at B after %v; want within 1s", revocation)
	}

	// 6 and 7. Before the kill: a chain, and a background response on the
	// slow replica, started at A and seen at B.
	pre := mustChain(B, r3.ID, "the turn before the kill")
	var bg responseObj
	begun := time.Now()
	e.must(http.StatusOK, A, "POST", "/v1/responses", key, map[string]any{"model": slowModel, "input": "a long background answer", "background": true}, &bg)
	if bg.ID == "" || (bg.Status != "queued" && bg.Status != "in_progress") {
		t.Fatalf("background response at A: id %q status %q; want queued or in_progress", bg.ID, bg.Status)
	}
	// A second one, left to run: what a client that does not cancel sees.
	var bg2 responseObj
	e.must(http.StatusOK, A, "POST", "/v1/responses", key, map[string]any{"model": slowModel, "input": "another long background answer", "background": true}, &bg2)
	statusOf := func(id string) (int, string, []byte) {
		code, _, raw := e.do(B, "GET", "/v1/responses/"+id, key, nil)
		var r responseObj
		_ = json.Unmarshal(raw, &r)
		return code, r.Status, raw
	}
	bgStatus := func() (int, string, []byte) { return statusOf(bg.ID) }
	if code, st, raw := bgStatus(); code != http.StatusOK || (st != "queued" && st != "in_progress") {
		t.Fatalf("background response polled at B before the kill: %d %s", code, raw)
	}
	for slowReplica.Stats().Running < 2 {
		if time.Since(begun) > 5*time.Second {
			t.Fatal("the background responses do not run on the slow replica")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The master holding the most of the run's keys.
	victim, perMaster, total := busiestMaster(t, tp, prefix)
	tenantMaster, _ := tp.Master(context.Background(), prefix+"resp:{t"+tenant+"}:x")
	leasesMaster, _ := tp.Master(context.Background(), prefix+"resp:leases")
	time.Sleep(500 * time.Millisecond) // replication of the writes above is asynchronous

	// Steady traffic: 10 requests a second, alternating gateways, in five
	// growing conversations, for trafficFor; the kill at killAfter.
	type result struct {
		n, conv         int
		start           time.Time
		took            time.Duration
		code            int
		err             string
		replica, rebind string
	}
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
	)
	convs := make([][]map[string]string, 5)
	for i := range convs {
		convs[i] = []map[string]string{{"role": "system", "content": fmt.Sprintf("steady conversation %d %s", i, strings.Repeat("more context ", 40))}}
	}
	// Meanwhile, from the kill on: continue the chain made before it, and
	// poll and cancel the background response at B.
	var (
		killAt               time.Time
		chainAfter, chainAtA time.Duration // kill to the chain's first continuation (at B), to the next turn at A
		chainErr, bgErr      string
		bgSeen, bgCancelled  time.Duration // kill to a poll at B answering, to the cancel seen at B
		bgFinal              string
		bgLive, bgStopped    bool // running on the slow replica after the failover; aborted by the cancel
	)
	killed := make(chan struct{})
	var side sync.WaitGroup
	side.Go(func() {
		<-killed
		var last string
		for time.Since(killAt) < maxChainRecover {
			code, r, raw := chain(B, pre.ID, "the turn after the kill")
			if code == http.StatusOK {
				if r.Prev != pre.ID {
					chainErr = fmt.Sprintf("continued with previous_response_id %q; want %q", r.Prev, pre.ID)
					return
				}
				chainAfter = time.Since(killAt)
				// A's own breaker closes on its next probe (every 250 ms)
				// and its cluster slot map on the next reload (1 s).
				for {
					code, _, raw := chain(A, r.ID, "and one more at A")
					if code == http.StatusOK {
						chainAtA = time.Since(killAt)
						return
					}
					if time.Since(killAt) > maxChainRecover {
						chainErr = fmt.Sprintf("the turn after that at A, %v after the kill: %d %s", time.Since(killAt).Round(time.Millisecond), code, bytes.TrimSpace(raw))
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			last = fmt.Sprintf("%d %s", code, bytes.TrimSpace(raw))
			time.Sleep(200 * time.Millisecond)
		}
		chainErr = fmt.Sprintf("not continued within %v of the kill; last %s", maxChainRecover, last)
	})
	side.Go(func() {
		<-killed
		var last string
		deadline := killAt.Add(maxChainRecover)
		for bgSeen == 0 && time.Now().Before(deadline) {
			code, st, raw := bgStatus()
			switch {
			case code == http.StatusOK && (st == "queued" || st == "in_progress"):
				bgSeen = time.Since(killAt)
			case code == http.StatusOK:
				bgErr = fmt.Sprintf("polled at B after the kill: status %q before the cancel: %s", st, raw)
				return
			default:
				last = fmt.Sprintf("%d %s", code, bytes.TrimSpace(raw))
				time.Sleep(200 * time.Millisecond)
			}
		}
		if bgSeen == 0 {
			bgErr = fmt.Sprintf("not polled at B within %v of the kill; last %s", maxChainRecover, last)
			return
		}
		// B read it from Redis: the failover is over. Its run must still
		// be generating on the slow replica, else it died in the failover
		// and "in_progress" is a record no gateway works on.
		st := slowReplica.Stats()
		bgLive = st.Running+st.Waiting == 2
		if !bgLive {
			bgErr = fmt.Sprintf("polled at B %v after the kill as in_progress, but %d of the 2 background runs are left on the slow replica (%d aborted in all): runs died in the failover", bgSeen.Round(time.Millisecond), st.Running+st.Waiting, st.Aborted)
		}
		aborted := st.Aborted
		for {
			code, _, raw := e.do(B, "POST", "/v1/responses/"+bg.ID+"/cancel", key, nil)
			if code == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				bgErr = fmt.Sprintf("cancel at B: %d %s", code, bytes.TrimSpace(raw))
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		for {
			code, st, raw := bgStatus()
			if code == http.StatusOK && st != "queued" && st != "in_progress" {
				bgFinal = st
				bgCancelled = time.Since(killAt)
				if st != "cancelled" {
					bgErr = fmt.Sprintf("after the cancel at B: status %q; want cancelled: %s", st, raw)
				}
				if !bgLive {
					return
				}
				// The cancel reached the gateway running it (A or B): the
				// upstream request is aborted.
				for slowReplica.Stats().Aborted == aborted {
					if time.Now().After(deadline.Add(5 * time.Second)) {
						bgErr = "cancelled at B, but the run kept generating on the slow replica"
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
				bgStopped = true
				return
			}
			if time.Now().After(deadline.Add(5 * time.Second)) {
				bgErr = fmt.Sprintf("still %d %q %s after the cancel", code, st, bytes.TrimSpace(raw))
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	tick := time.NewTicker(100 * time.Millisecond)
	begin := time.Now()
	for n := 0; time.Since(begin) < trafficFor; n++ {
		<-tick.C
		if killAt.IsZero() && time.Since(begin) >= killAfter {
			killAt = time.Now()
			tp.Kill(t, victim)
			close(killed)
		}
		c := n % len(convs)
		convs[c] = append(convs[c], map[string]string{"role": "user", "content": fmt.Sprintf("steady turn %d", n)})
		body := chatBody(slices.Clone(convs[c]), model)
		wg.Go(func() {
			start := time.Now()
			code, h, raw := e.do(n%2, "POST", "/v1/chat/completions", key, body)
			r := result{n: n, conv: c, start: start, took: time.Since(start), code: code,
				replica: h.Get("X-Warmpath-Replica"), rebind: h.Get("X-Warmpath-Rebind")}
			if code != http.StatusOK {
				r.err = fmt.Sprintf("gateway %c at +%v: %d %s", 'A'+n%2, start.Sub(begin).Round(time.Millisecond), code, bytes.TrimSpace(raw))
			}
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		})
	}
	tick.Stop()
	wg.Wait()
	side.Wait()

	// The second background response, never cancelled: after the
	// failover it must still run, have ended, or hold a lease a sweeper
	// will fail it by; an in_progress record that no gateway runs and no
	// lease names is stuck until its TTL (30 days).
	bg2Code, bg2St, bg2Raw := statusOf(bg2.ID)
	rec := prefix + "resp:{t" + tenant + "}:" + bg2.ID
	rc := tp.NewClient()
	lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, leaseErr := rc.ZScore(lctx, prefix+"resp:leases", rec).Result()
	recSt, recErr := rc.HGet(lctx, rec, "status").Result()
	lcancel()
	rc.Close()
	sst := slowReplica.Stats()
	bg2Live := sst.Running+sst.Waiting > 0
	bg2Diag := fmt.Sprintf("at B %d %q; record status %q (%v); lease held: %v; still running on the slow replica: %v", bg2Code, bg2St, recSt, recErr, leaseErr == nil, bg2Live)
	// With the lease held a sweeper fails it once the lease lapses
	// (responses.LeaseTTL, 30 s): the dead run is reported above.
	if bg2St == "in_progress" && !bg2Live && leaseErr != nil {
		t.Errorf("the uncancelled background response is stuck in_progress: no run and no lease (%s)", bg2Diag)
	}
	if bg2Code != http.StatusOK {
		t.Errorf("the uncancelled background response at B after the failover: %d %s", bg2Code, bytes.TrimSpace(bg2Raw))
	}

	// The failover window: from the kill until Redis serves the chain
	// again (at least 3 s, the breaker's and the failover's time).
	window := max(chainAfter, 3*time.Second)
	if chainAfter == 0 {
		window = time.Since(killAt)
	}
	var failed []string
	var during []time.Duration
	firstOK := time.Duration(-1)
	for _, r := range results {
		if r.code != http.StatusOK {
			failed = append(failed, r.err)
		}
		if !r.start.Before(killAt) && r.start.Before(killAt.Add(window)) {
			during = append(during, r.took)
		}
		if r.code == http.StatusOK && !r.start.Before(killAt) {
			if d := r.start.Add(r.took).Sub(killAt); firstOK < 0 || d < firstOK {
				firstOK = d
			}
		}
	}
	slices.Sort(during)
	// Sessions that left their replica during the traffic without the
	// policy choosing to (logged: with Redis down each gateway routes from
	// what it knows itself).
	slices.SortFunc(results, func(a, b result) int { return a.n - b.n })
	moved := 0
	last := map[int]string{}
	for _, r := range results {
		if r.code != http.StatusOK {
			continue
		}
		if prev, ok := last[r.conv]; ok && prev != r.replica && r.rebind != scoring.RebindSaturated {
			moved++
		}
		last[r.conv] = r.replica
	}
	var p99 time.Duration
	if len(during) > 0 {
		p99 = during[min(len(during)-1, len(during)*99/100)]
	}
	t.Logf("%s FIGURES: failed %d/%d chat requests; p99 %v over %d requests in the failover window (%v); first chat success %v after the kill; chain continued %v after the kill at B, %v at A (%s); background polled at B %v (running on its replica: %v), cancel at B → %q %v after the kill (run aborted: %v) (%s); %d turns left their session's replica; limiter admitted %d of 60; revocation seen at B after %v; killed master %s held %d of %d keys",
		kind, len(failed), len(results), p99.Round(time.Millisecond), len(during), window.Round(time.Millisecond),
		firstOK.Round(time.Millisecond), chainAfter.Round(time.Millisecond), chainAtA.Round(time.Millisecond), okOr(chainErr), bgSeen.Round(time.Millisecond), bgLive,
		bgFinal, bgCancelled.Round(time.Millisecond), bgStopped, okOr(bgErr), moved, admitted, revocation.Round(time.Millisecond),
		victim, perMaster[victim], total)
	for _, f := range failed {
		t.Log("failed:", f)
	}
	if len(failed) > maxFailedChats {
		t.Errorf("%d of %d chat requests failed around the kill; want at most %d (the breaker serves them from in-process state)", len(failed), len(results), maxFailedChats)
	}
	if p99 > maxFailoverP99 {
		t.Errorf("p99 latency in the failover window %v; want at most %v (requests waiting on Redis dials?)", p99, maxFailoverP99)
	}
	if chainErr != "" {
		t.Errorf("the chain made before the kill: %s", chainErr)
	}
	if bgErr != "" {
		t.Errorf("the background response started at A before the kill: %s", bgErr)
	}
	t.Logf("%s: keys per master before the kill %v; the tenant's Responses slot was on %s, resp:leases on %s; the uncancelled background response: %s", kind, perMaster, tenantMaster, leasesMaster, bg2Diag)
}

func okOr(err string) string {
	if err == "" {
		return "ok"
	}
	return "FAILED: " + err
}

// busiestMaster counts the keys under prefix per master and returns the
// master holding the most, the counts and their total.
func busiestMaster(t *testing.T, tp *redistest.Topology, prefix string) (string, map[string]int, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := tp.NewClient()
	defer c.Close()
	per := map[string]int{}
	total := 0
	if cc, ok := c.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			iter := n.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			seen := map[string]bool{}
			for iter.Next(ctx) {
				seen[iter.Val()] = true
			}
			mu.Lock()
			per[n.Options().Addr] += len(seen)
			total += len(seen)
			mu.Unlock()
			return iter.Err()
		})
		if err != nil {
			t.Fatal(err)
		}
	} else {
		m, err := tp.Master(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		if err := redistest.ScanAll(ctx, c, prefix+"*", func(k string) error { seen[k] = true; return nil }); err != nil {
			t.Fatal(err)
		}
		per[m], total = len(seen), len(seen)
	}
	var best string
	for m, n := range per {
		if best == "" || n > per[best] {
			best = m
		}
	}
	if total == 0 {
		t.Fatalf("no keys under %s on any master", prefix)
	}
	return best, per, total
}
