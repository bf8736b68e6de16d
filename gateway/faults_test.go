package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/gateway/proxy"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/redistest"
	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/vllmsim"
)

// Redis goes away and comes back empty (persistence off): the gateway keeps
// serving and keeps its sessions sticky from memory, counts the failures,
// and restores the bindings into the new Redis.
func TestRedisRestart(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 4})
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	cfg := fleetConfig(sim)
	cfg.Debug = true
	cfg.Redis.Timeout = 500 * time.Millisecond
	gw := startGateway(t, cfg, rdb)

	convs := make([]*conversation, 4)
	homes := make([]string, len(convs))
	for i := range convs {
		convs[i] = newConversation(words(fmt.Sprintf("r%d", i), 300), "go")
		homes[i] = convs[i].turn(t, gw.URL, "next").replica()
	}
	srv.Stop()
	for i, c := range convs {
		r := c.turn(t, gw.URL, "while redis is down")
		if r.replica() != homes[i] {
			t.Errorf("session %d moved to %s while Redis was down; bound to %s", i, r.replica(), homes[i])
		}
	}
	if got := counter(t, gw.obs.reg, "warmpath_redis_errors_total", nil); got == 0 {
		t.Error("Redis failures not counted")
	}
	srv.Restart(t)
	testrun.Eventually(t, 10*time.Second, func() bool {
		r := convs[0].turn(t, gw.URL, "after restart")
		return r.Status == http.StatusOK && rdb.Exists(t.Context(), gw.cfg.Redis.KeyPrefix+"sess:"+gw.sessionKeyFor(t, convs[0])).Val() == 1
	}, "bindings restored into the restarted Redis")
	for i, c := range convs {
		if r := c.turn(t, gw.URL, "again"); r.replica() != homes[i] {
			t.Errorf("session %d moved to %s after the Redis restart; bound to %s", i, r.replica(), homes[i])
		}
	}
}

// sessionKeyFor derives the session key the gateway uses for c.
func (g *testGateway) sessionKeyFor(t *testing.T, c *conversation) string {
	t.Helper()
	body := fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, c.model, c.messages[0].Content, c.messages[1].Content)
	p, err := g.tenants.auth.Authenticate(t.Context(), http.Header{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := request.Parse(request.Chat, http.Header{}, body, p)
	if err != nil {
		t.Fatal(err)
	}
	return r.Session().Value
}

// A replica restart (empty cache, event sequence back to 0) clears its
// index entries; its sessions notice the loss and rebind, and no request
// fails: in-flight ones the restart kills are retried elsewhere.
func TestReplicaRestartClearsIndex(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	cfg.Routing.SpeculativeTTL = -1
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)

	c := newConversation(words("restart", 600), words("mine", 50))
	home := c.turn(t, gw.URL, "next").replica()
	var rep *vllmsim.Replica
	for _, r := range sim.Replicas() {
		if r.Info().Name == home {
			rep = r
		}
	}
	testrun.Eventually(t, 5*time.Second, func() bool { return gw.router.Index().Blocks().Stats().Replicas[home].Entries > 30 }, "index entries for the home replica")
	rep.Restart()
	// The engine publishes nothing on restart; the next batch it publishes
	// (seq 0 again) tells the subscriber. Poke the restarted replica
	// directly (the gateway may route fresh prompts elsewhere) with a
	// prompt of full blocks, so it stores and publishes something.
	testrun.Eventually(t, 10*time.Second, func() bool {
		r := chat(t, "http://"+home, map[string]any{"model": "qwen3-32b", "max_tokens": 1,
			"messages": []msg{{"user", words(fmt.Sprint("poke", time.Now().UnixNano()), 40)}}}, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("request to the restarted replica: %d %s", r.Status, r.Body)
		}
		return counter(t, gw.obs.reg, "warmpath_kvevents_restarts_total", nil) >= 1
	}, "the subscriber to detect the restart")
	after := c.turn(t, gw.URL, "after restart")
	if got := after.Header.Get("X-Warmpath-Rebind"); got != scoring.RebindEvicted {
		t.Errorf("rebind after the replica restart = %q; want %q", got, scoring.RebindEvicted)
	}
}

// The central topology: the gateway binds one SUB, every engine's PUB
// connects to it and names itself in the topic; routing works as with
// per-replica subscribers.
func TestCentralTopology(t *testing.T) {
	bind := "tcp://" + freePortOutsideEphemeral(t)
	sim := startSim(t, vllmsim.Config{Replicas: 3, KVConnect: bind})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	cfg.KVEvents = KVEventsConfig{Topology: TopologyCentral, Bind: bind}
	cfg.Routing.Policy = "precise-prefix"
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)

	shared := words("central", 800)
	home := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 2, "messages": []msg{{"system", shared}, {"user", "a"}}}, nil).replica()
	// The engines' PUB sockets connect to the gateway's bound SUB; batches
	// published before the subscription propagates are lost (ZeroMQ's slow
	// joiner) and repaired by replay at the next batch, so keep the engine
	// publishing, as real traffic does.
	testrun.Eventually(t, 10*time.Second, func() bool {
		// A prompt of at least one full block, so the engine stores (and
		// publishes) something.
		chat(t, "http://"+home, map[string]any{"model": "qwen3-32b", "max_tokens": 1, "messages": []msg{{"user", words(fmt.Sprint("poke", time.Now().UnixNano()), 40)}}}, nil)
		return gw.router.Index().Receiving(home) && gw.router.Index().Holds(home, gw.router.Index().Keys(vllmsim.TokenizeChat([]vllmsim.Message{{Role: "system", Content: shared}}, nil, false), "qwen3-32b", "")[40])
	}, "events over the central socket")
	for i := range 4 {
		r := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 2, "messages": []msg{{"system", shared}, {"user", fmt.Sprint("b", i)}}}, nil)
		if r.replica() != home || r.Usage.CachedTokens < 700 {
			t.Fatalf("request %d went to %s (cached %d); the prefix is on %s", i, r.replica(), r.Usage.CachedTokens, home)
		}
	}
}

// freePortOutsideEphemeral returns a free loopback host:port below the
// kernel's ephemeral range. Engines connect to the central endpoint before
// it exists; an ephemeral port could meanwhile be taken as the source port of
// some connection (or of the engine's own connect attempt: a TCP
// self-connect), after which nothing reaches the SUB.
func freePortOutsideEphemeral(t *testing.T) string {
	t.Helper()
	for p := 20000 + int(time.Now().UnixNano()%5000); p < 32000; p += 7 {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err == nil {
			ln.Close()
			return ln.Addr().String()
		}
	}
	t.Fatal("no free port below 32000")
	return ""
}

// A replica that accepts connections but never answers (SIGSTOP, a wedged
// engine) holds nobody: requests waiting on it are released the moment
// health checks mark it down and retried elsewhere, its /tokenize calls
// time out and count against it, and no request fails. The header timeout
// here is an hour, so only the release can make this test pass.
func TestHungReplicaReleasesRequests(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 4})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	cfg.Upstream = proxy.Config{HeaderTimeout: time.Hour, TokenizeTimeout: 300 * time.Millisecond}
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)

	convs := make([]*conversation, 8)
	var home string
	for i := range convs {
		convs[i] = newConversation(words(fmt.Sprintf("hung%d", i), 200), "start")
		if r := convs[i].turn(t, gw.URL, "next"); i == 0 {
			home = r.replica()
		}
	}
	// The victim is where session 0 lives: its next turn goes there.
	var victim *vllmsim.Replica
	for _, r := range sim.Replicas() {
		if r.Info().Name == home {
			victim = r
		}
	}
	// The same load with every replica well, then with the victim hung;
	// the latencies of turns answered by the others are logged (issue 12's
	// target: their p99 within 2× of normal), not asserted.
	var mu sync.Mutex
	var served []string
	load := func(label string, turns int) {
		var others []time.Duration
		parallel(len(convs), func(i int) {
			for range turns {
				start := time.Now()
				r := convs[i].turn(t, gw.URL, label)
				d := time.Since(start)
				mu.Lock()
				served = append(served, r.replica())
				if r.replica() != home && r.Header.Get("X-Warmpath-Attempts") == "1" {
					others = append(others, d)
				}
				mu.Unlock()
			}
		})
		slices.Sort(others)
		if n := len(others); n > 0 {
			t.Logf("%s: %d turns on the other replicas, p50 %v, p99 %v, max %v", label, n, others[n/2], others[(n*99+99)/100-1], others[n-1])
		}
	}
	load("all replicas well", 3)
	served = nil
	victim.SetFaults(vllmsim.Faults{Hang: true})
	t.Cleanup(func() { victim.SetFaults(vllmsim.Faults{}) })
	load("one replica hung", 3)
	for _, name := range served {
		if name == victim.Info().Name {
			t.Errorf("a turn was answered by the hung replica")
		}
	}
	released := counter(t, gw.obs.reg, "warmpath_upstream_errors_total", map[string]string{"replica": victim.Info().Name, "kind": "replica_down"})
	if released < 1 {
		t.Errorf("%v requests released from the hung replica; want at least session 0's", released)
	}
	if gw.fleet.Replica(victim.Info().Name).State().Healthy {
		t.Error("the hung replica is still healthy")
	}
}

// A stream whose replica stalls after it started is ended by the idle
// timeout with an error event that the OpenAI SDK raises (never a partial
// answer returned as complete), and counted.
func TestStalledStreamEndsWithErrorEvent(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1, Speed: 1, StreamInterval: 20 * time.Millisecond})
	cfg := fleetConfig(sim)
	cfg.Upstream = proxy.Config{IdleTimeout: 300 * time.Millisecond}
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)

	client := openai.NewClient(option.WithBaseURL(gw.URL+"/v1"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	stream := client.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model:     "qwen3-32b",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(words("stall", 30))},
		MaxTokens: openai.Int(400),
	})
	var chunks int
	for stream.Next() {
		if chunks++; chunks == 2 {
			sim.Replicas()[0].SetFaults(vllmsim.Faults{Hang: true})
		}
	}
	sim.Replicas()[0].SetFaults(vllmsim.Faults{})
	err := stream.Err()
	if err == nil || !strings.Contains(err.Error(), "idle_timeout") {
		t.Fatalf("stream error = %v after %d chunks; want the idle-timeout error event", err, chunks)
	}
	// The error event reaches the client before the stream's end is
	// accounted (the filter writes it, then reports done).
	cut := func() float64 {
		return counter(t, gw.obs.reg, "warmpath_streams_cut_total", map[string]string{"reason": "idle_timeout"})
	}
	testrun.Eventually(t, 5*time.Second, func() bool { return cut() >= 1 }, "the cut stream counted")
	if got := cut(); got != 1 {
		t.Errorf("warmpath_streams_cut_total{reason=idle_timeout} = %v; want 1", got)
	}
}

// A stream cut by the replica dying mid-way ends with an error event and
// [DONE] on the wire.
func TestCutStreamEndsWithErrorEvent(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1, Speed: 1, StreamInterval: 20 * time.Millisecond})
	cfg := fleetConfig(sim)
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)

	body, _ := json.Marshal(map[string]any{"model": "qwen3-32b", "stream": true, "max_tokens": 400,
		"messages": []msg{{"user", words("cut", 30)}}})
	resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var events []string
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: ") {
			events = append(events, strings.TrimSpace(strings.TrimPrefix(line, "data: ")))
			if len(events) == 2 {
				if err := sim.Replicas()[0].SetDown(true); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err != nil {
			break
		}
	}
	n := len(events)
	if n < 3 || events[n-1] != "[DONE]" || !strings.Contains(events[n-2], `"code":"upstream_error"`) {
		t.Fatalf("stream ended with %q; want an upstream_error event, then [DONE]", events[max(0, n-2):])
	}
	if got := counter(t, gw.obs.reg, "warmpath_streams_cut_total", nil); got != 1 {
		t.Errorf("warmpath_streams_cut_total = %v; want 1", got)
	}
}

// A Redis outage opens the breaker: requests stop waiting on Redis and
// keep their sessions from in-process state, and once Redis is back the
// breaker closes within a probe or two and bindings flow into Redis
// again. The latencies during the outage are logged (issue 12 target: at
// most 5 ms added), not asserted.
func TestRedisOutageBreaker(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 4})
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	cfg := fleetConfig(sim)
	cfg.Debug = true
	gw := startGateway(t, cfg, rdb)
	convs := make([]*conversation, 4)
	homes := make([]string, len(convs))
	for i := range convs {
		convs[i] = newConversation(words(fmt.Sprintf("outage%d", i), 300), "go")
		homes[i] = convs[i].turn(t, gw.URL, "next").replica()
	}
	lat := func(label string) {
		var ds []time.Duration
		for i, c := range convs {
			start := time.Now()
			r := c.turn(t, gw.URL, label)
			ds = append(ds, time.Since(start))
			if r.replica() != homes[i] {
				t.Errorf("%s: session %d moved to %s; bound to %s", label, i, r.replica(), homes[i])
			}
		}
		slices.Sort(ds)
		t.Logf("%s: turn latencies %v", label, ds)
	}
	lat("redis up")
	srv.Stop()
	// Sticky lookups answer from memory while the session tracking holds;
	// it notices the server gone, and from then on they ask Redis.
	testrun.Eventually(t, 5*time.Second, func() bool { return counter(t, gw.obs.reg, "warmpath_session_tracking", nil) == 0 }, "session tracking off")
	lat("redis down, breaker closing")
	if got := counter(t, gw.obs.reg, "warmpath_redis_breaker_open", nil); got != 1 {
		t.Fatalf("breaker open = %v after Redis went away; want 1", got)
	}
	before := counter(t, gw.obs.reg, "warmpath_redis_short_circuited_total", nil)
	lat("redis down, breaker open")
	if after := counter(t, gw.obs.reg, "warmpath_redis_short_circuited_total", nil); after <= before {
		t.Errorf("no Redis command was short-circuited while the breaker was open (%v → %v)", before, after)
	}
	srv.Restart(t)
	testrun.Eventually(t, 5*time.Second, func() bool { return counter(t, gw.obs.reg, "warmpath_redis_breaker_open", nil) == 0 }, "the breaker to close")
	lat("redis back")
	if n := len(rdb.Keys(t.Context(), "*sess:*").Val()); n == 0 {
		t.Error("no binding written to the restarted Redis")
	}
}

// Upstream error bodies keep their message but not the engine's internals:
// vLLM's Python exception class names become OpenAI's error types.
func TestUpstreamErrorTypesNormalized(t *testing.T) {
	tests := []struct {
		status int
		body   string
		typ    string
	}{
		{400, `{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}`, "invalid_request_error"},
		{404, `{"object":"error","message":"no such model","type":"NotFoundError","param":null,"code":404}`, "invalid_request_error"},
		{500, `{"error":{"message":"boom","type":"EngineDeadError","param":null,"code":"x"}}`, "server_error"},
		{429, `{"error":{"message":"slow down","type":"requests","param":null,"code":"rate_limit_exceeded"}}`, "requests"},
	}
	for _, tt := range tests {
		out := proxy.NormalizeErrorBody(tt.status, []byte(tt.body))
		if out == nil {
			out = []byte(tt.body)
		}
		var env apierror.Envelope
		if err := json.Unmarshal(out, &env); err != nil {
			t.Fatal(err)
		}
		if env.Error.Type != tt.typ || env.Error.Message == "" {
			t.Errorf("%s → type %q message %q; want %q and the message kept", tt.body, env.Error.Type, env.Error.Message, tt.typ)
		}
	}
}

// Slow request bodies cannot hold the gateway: each is answered 408 once
// server.body_timeout passes and its connection closed, one client holds
// at most server.max_conns_per_client connections, and oversized headers
// are refused. A client that aborts its body counts as 499, not 400.
func TestSlowBodiesAndHugeHeadersAreBounded(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1})
	cfg := fleetConfig(sim)
	cfg.Server = ServerConfig{BodyTimeout: 300 * time.Millisecond, MaxConnsPerClient: 4}
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	addr := gw.Addr()
	slow := make([]net.Conn, 4)
	for i := range slow {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
		slow[i] = c
	}
	// A fifth connection from the same client is closed on arrival. Its
	// request is sent only once the four are surely accepted: the server
	// answers each of them (408) only after accepting it.
	extra, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	for i, c := range slow {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second)) // a bound on the test, not a sync
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("slow body %d: %v", i, err)
		}
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("slow body %d: status %d; want 408", i, resp.StatusCode)
		}
	}
	_ = extra.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := http.ReadResponse(bufio.NewReader(extra), nil); err == nil {
		t.Error("a connection beyond max_conns_per_client was served")
	}
	if got := counter(t, gw.obs.reg, "warmpath_connections_rejected_total", nil); got < 1 {
		t.Errorf("warmpath_connections_rejected_total = %v; want ≥ 1", got)
	}
	if got := counter(t, gw.obs.reg, "warmpath_requests_total", map[string]string{"code": "408"}); got != 4 {
		t.Errorf("requests answered 408 = %v; want 4", got)
	}

	// The slots came back: a normal request works; huge headers do not.
	if r := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "max_tokens": 2, "messages": []msg{{"user", "hi"}}}, nil); r.Status != http.StatusOK {
		t.Errorf("after the slow bodies: status %d", r.Status)
	}
	if r := chat(t, gw.URL, map[string]any{"model": "qwen3-32b", "messages": []msg{{"user", "hi"}}}, map[string]string{"X-Huge": strings.Repeat("h", 200<<10)}); r.Status != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("200 KiB of headers: status %d; want 431", r.Status)
	}

	// A body the client abandons mid-way is a 499.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"model\":")
	c.Close()
	testrun.Eventually(t, 5*time.Second, func() bool {
		return counter(t, gw.obs.reg, "warmpath_requests_total", map[string]string{"code": "499"}) == 1
	}, "the abandoned body counted as 499")
	if got := counter(t, gw.obs.reg, "warmpath_requests_total", map[string]string{"code": "400"}); got != 0 {
		t.Errorf("requests answered 400 = %v; want 0", got)
	}
}

// SIGTERM drains: /readyz answers 503 at once while the listener keeps
// serving for the pre-stop period; then the listener closes, a stream
// that finishes within the drain timeout finishes, and one still open
// after it is ended with an error event and [DONE]; Run returns nil.
func TestGracefulDrain(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1, Speed: 1, StreamInterval: 50 * time.Millisecond})
	cfg := fleetConfig(sim)
	cfg.Server = ServerConfig{PreStop: 400 * time.Millisecond, DrainTimeout: 600 * time.Millisecond}
	rdb := redisFor(t, &cfg)
	g, err := New(cfg, Options{Redis: rdb, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, sigterm := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := g.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	url := "http://" + g.Addr()
	// A long stream: hundreds of tokens at 50 ms each outlast the drain.
	body, _ := json.Marshal(map[string]any{"model": "qwen3-32b", "stream": true, "max_tokens": 400, "ignore_eos": true,
		"messages": []msg{{"user", words("drain", 30)}}})
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // the stream is under way
		t.Fatal(err)
	}

	sigterm()
	testrun.Eventually(t, 2*time.Second, func() bool {
		r, err := http.Get(url + "/readyz")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusServiceUnavailable
	}, "/readyz to answer 503")
	// Still serving during the pre-stop period.
	if r := chat(t, url, map[string]any{"model": "qwen3-32b", "max_tokens": 2, "messages": []msg{{"user", "during pre-stop"}}}, nil); r.Status != http.StatusOK {
		t.Errorf("request during pre-stop: status %d", r.Status)
	}
	var events []string
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: ") {
			events = append(events, strings.TrimSpace(strings.TrimPrefix(line, "data: ")))
		}
		if err != nil {
			break
		}
	}
	n := len(events)
	if n < 2 || events[n-1] != "[DONE]" || !strings.Contains(events[n-2], "shutting down") {
		t.Errorf("the long stream ended with %q; want the shutting-down error event, then [DONE]", events[max(0, n-2):])
	}
	if err := <-done; err != nil {
		t.Errorf("Run = %v after the drain; want nil", err)
	}
	if _, err := net.DialTimeout("tcp", g.Addr(), time.Second); err == nil {
		t.Error("the listener still accepts after the drain")
	}
	if got := counter(t, g.obs.reg, "warmpath_streams_cut_total", map[string]string{"reason": "drain"}); got != 1 {
		t.Errorf("streams cut by the drain = %v; want 1", got)
	}
}

// A replica that restarts while idle (its cache gone, no KV event yet to
// say so) stops being predicted warm as soon as its counters are seen to
// reset: its index entries are cleared, and the session bound to it
// rebinds as evicted instead of predicting a hit it will not get.
func TestIdleRestartForgetsCache(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := fleetConfig(sim)
	cfg.Debug = true
	cfg.Routing.SpeculativeTTL = -1
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	c := newConversation(words("idle restart", 400), "first")
	home := c.turn(t, gw.URL, "second").replica()
	testrun.Eventually(t, 5*time.Second, func() bool { return gw.router.Index().Blocks().Stats().Replicas[home].Entries > 20 }, "the home replica's blocks indexed")
	// Idle, as a replica is once scraped after serving.
	testrun.Eventually(t, 5*time.Second, func() bool { return gw.fleet.Replica(home).State().PrefixQueries > 0 }, "a scrape after the turn")
	for _, r := range sim.Replicas() {
		if r.Info().Name == home {
			r.Restart() // no traffic follows: no event says the cache is gone
		}
	}

	testrun.Eventually(t, 5*time.Second, func() bool {
		return counter(t, gw.obs.reg, "warmpath_replica_restarts_total", map[string]string{"replica": home}) == 1
	}, "the restart seen on /metrics")
	if n := gw.router.Index().Blocks().Stats().Replicas[home].Entries; n != 0 {
		t.Errorf("%d index entries left for the restarted replica", n)
	}
	r := c.turn(t, gw.URL, "after the restart")
	if got := r.Header.Get("X-Warmpath-Rebind"); got != scoring.RebindEvicted {
		t.Errorf("rebind = %q (reason %s, predicted %s); want evicted", got, r.Header.Get("X-Warmpath-Reason"), r.Header.Get("X-Warmpath-Predicted-Cached"))
	}
}

// heldTokenizer fronts a simulated replica and holds every /tokenize call
// that arrives before release is closed, then fails them all at once with
// a 503 (what a host stall does to the calls pending through it: they all
// time out together); later calls and everything else pass through.
type heldTokenizer struct {
	URL     string
	held    chan struct{} // one send per /tokenize call now held
	release chan struct{}
}

func newHeldTokenizer(t *testing.T, target string) *heldTokenizer {
	t.Helper()
	u, err := neturl.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	h := &heldTokenizer{held: make(chan struct{}, 64), release: make(chan struct{})}
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-h.release:
			rp.ServeHTTP(w, r) // the stall is over
			return
		default:
		}
		if r.URL.Path != "/tokenize" {
			rp.ServeHTTP(w, r)
			return
		}
		h.held <- struct{}{}
		<-h.release
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"message":"stalled","type":"ServiceUnavailableError","code":503}}`))
	}))
	t.Cleanup(srv.Close)
	h.URL = srv.URL
	return h
}

// The failures of calls that were pending together are one failure: five
// first turns whose /tokenize calls all fail at once leave their replica
// healthy (health.failures 2), and the turns are served, routed without
// prefix information. Counted one each, they had marked a healthy replica
// down and answered the turns 503 (a host stall of two seconds did that to
// a whole fleet in `warmpath bench --gateways 2`).
func TestFailuresTogetherCountOnce(t *testing.T) {
	sim := startSim(t, vllmsim.Config{Replicas: 1})
	tok := newHeldTokenizer(t, sim.Replicas()[0].Info().URL)
	cfg := fleetConfig(sim)
	cfg.Replicas[0].URL = tok.URL
	cfg.Routing.Policy = scoring.PolicyPrecisePrefix
	gw := startGateway(t, cfg, nil)

	const n = 5
	status := make(chan int, n)
	for i := range n {
		b, _ := json.Marshal(map[string]any{"model": "qwen3-32b", "max_tokens": 2,
			"messages": []msg{{"user", words(fmt.Sprintf("turn%d-", i), 40)}}})
		go func() {
			resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json", bytes.NewReader(b))
			if err != nil {
				status <- 0
				return
			}
			resp.Body.Close()
			status <- resp.StatusCode
		}()
	}
	for range n {
		<-tok.held // all five pending at the replica
	}
	close(tok.release)
	for range n {
		if st := <-status; st != http.StatusOK {
			t.Errorf("a turn whose /tokenize failed with the others: status %d; want 200", st)
		}
	}
	if got := counter(t, gw.obs.reg, "warmpath_replica_health_transitions_total", map[string]string{"to": "unhealthy"}); got != 0 {
		t.Errorf("the replica went unhealthy %v times on one event", got)
	}
}
