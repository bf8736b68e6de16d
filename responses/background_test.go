package responses

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/chatapi"
	"github.com/warmpath/warmpath/internal/redistest"
	"github.com/warmpath/warmpath/vllmsim"
)

// gate holds every turn of a chatapi.Chat until released, announcing each one.
type gate struct {
	next    chatapi.Chat
	entered chan chatapi.Turn
	release chan struct{}
}

func newGate(next chatapi.Chat) *gate {
	return &gate{next: next, entered: make(chan chatapi.Turn, 16), release: make(chan struct{})}
}

func (g *gate) Complete(ctx context.Context, t chatapi.Turn) (*http.Response, error) {
	g.entered <- t
	select {
	case <-g.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.next.Complete(ctx, t)
}

// getStream opens GET /v1/responses/{id}?stream=true… and reads it to
// the end.
func (e *env) getStream(t *testing.T, id, query string) []sseEvent {
	t.Helper()
	resp, err := http.Get(e.url + "/v1/responses/" + id + "?stream=true" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET stream: %d", resp.StatusCode)
	}
	return readSSE(t, resp.Body)
}

func (e *env) get(t *testing.T, id string) *Response {
	t.Helper()
	code, b := e.do(t, "GET", "/v1/responses/"+id, "", nil)
	var r Response
	if code != 200 || json.Unmarshal(b, &r) != nil {
		t.Fatalf("GET %s: %d %s", id, code, b)
	}
	return &r
}

func TestBackgroundRunAndResume(t *testing.T) { redistest.Each(t, testBackgroundRunAndResume) }

func testBackgroundRunAndResume(t *testing.T, tp *redistest.Topology) {
	var g *gate
	e := newEnvWith(t, tp, vllmsim.Config{}, func(c *simChat) chatapi.Chat { g = newGate(c); return g })
	r := e.create(t, "", map[string]any{"input": "Write a haiku.", "background": true})
	if r.Status != StatusQueued || !r.Background {
		t.Fatalf("create: status %q background %v; want queued", r.Status, r.Background)
	}
	turn := <-g.entered // a worker claimed it and is calling upstream
	if !turn.Background || turn.Session != r.ID {
		t.Fatalf("turn background %v session %q", turn.Background, turn.Session)
	}
	if got := e.get(t, r.ID); got.Status != StatusInProgress {
		t.Fatalf("status while running = %q", got.Status)
	}
	close(g.release)
	evs := e.getStream(t, r.ID, "")
	ts := types(evs)
	if ts[0] != "response.created" || ts[1] != "response.queued" || ts[2] != "response.in_progress" || ts[len(ts)-1] != "response.completed" {
		t.Fatalf("events = %v", ts)
	}
	for i, ev := range evs {
		if ev.Seq != i {
			t.Fatalf("event %d has sequence_number %d", i, ev.Seq)
		}
	}
	// Resume after event 4: exactly the rest, identical bytes.
	rest := e.getStream(t, r.ID, "&starting_after=4")
	if len(rest) != len(evs)-5 || rest[0].Seq != 5 || string(rest[0].Data) != string(evs[5].Data) {
		t.Fatalf("resume: %d events from %d; want %d from 5", len(rest), rest[0].Seq, len(evs)-5)
	}
	if got := e.get(t, r.ID); got.Status != StatusCompleted || len(got.Output) != 1 {
		t.Fatalf("final = %+v", got)
	}
	// A completed background response can be chained.
	r2 := e.create(t, "", map[string]any{"input": "Another.", "previous_response_id": r.ID})
	if r2.Status != StatusCompleted {
		t.Fatalf("chained on background: %+v", r2)
	}
	if code, b := e.do(t, "POST", "/v1/responses/"+r2.ID+"/cancel", "", nil); code != 400 {
		t.Fatalf("cancel of a foreground response: %d %s", code, b)
	}
	if code, _ := e.do(t, "GET", "/v1/responses/"+r2.ID+"?stream=true", "", nil); code != 400 {
		t.Fatalf("GET stream of a foreground response: %d", code)
	}
}

func TestBackgroundCancel(t *testing.T) { redistest.Each(t, testBackgroundCancel) }

func testBackgroundCancel(t *testing.T, tp *redistest.Topology) {
	var g *gate
	e := newEnvWith(t, tp, vllmsim.Config{}, func(c *simChat) chatapi.Chat { g = newGate(c); return g },
		func(o *Options) { o.BackgroundWorkers = 1 })
	running := e.create(t, "", map[string]any{"input": "one", "background": true})
	<-g.entered
	queued := e.create(t, "", map[string]any{"input": "two", "background": true})
	// The queued one is cancelled at once; its stream ends.
	code, b := e.do(t, "POST", "/v1/responses/"+queued.ID+"/cancel", "", nil)
	if code != 200 || !strings.Contains(string(b), `"status":"cancelled"`) {
		t.Fatalf("cancel queued: %d %s", code, b)
	}
	if evs := e.getStream(t, queued.ID, ""); len(evs) != 2 {
		t.Fatalf("cancelled queued stream: %v", types(evs))
	}
	// The running one: its worker is told over pub/sub and stops upstream.
	code, b = e.do(t, "POST", "/v1/responses/"+running.ID+"/cancel", "", nil)
	if code != 200 || !strings.Contains(string(b), `"status":"cancelled"`) {
		t.Fatalf("cancel running: %d %s", code, b)
	}
	evs := e.getStream(t, running.ID, "") // ends when the worker closes the stream
	if ts := types(evs); ts[len(ts)-1] == "response.completed" {
		t.Fatalf("cancelled run completed: %v", ts)
	}
	if got := e.get(t, running.ID); got.Status != StatusCancelled {
		t.Fatalf("status = %q", got.Status)
	}
	// Idempotent.
	if code, b := e.do(t, "POST", "/v1/responses/"+running.ID+"/cancel", "", nil); code != 200 || !strings.Contains(string(b), `"status":"cancelled"`) {
		t.Fatalf("second cancel: %d %s", code, b)
	}
	// The worker is free again and skipped the cancelled job: a new one runs.
	close(g.release)
	third := e.create(t, "", map[string]any{"input": "three", "background": true})
	if ts := types(e.getStream(t, third.ID, "")); ts[len(ts)-1] != "response.completed" {
		t.Fatalf("next job: %v", ts)
	}
	if n := len(e.chat.recorded()); n != 1 {
		t.Fatalf("%d turns reached the model; want 1 (only the third)", n)
	}
}

// TestBackgroundDeadGateway runs a background response on gateway A and
// kills A's Redis connection mid-run: A can neither renew its lease nor
// finish. Gateway B's sweeper must mark the response failed with a reason,
// and B's GET stream must end with response.failed.
func TestBackgroundDeadGateway(t *testing.T) { redistest.Each(t, testBackgroundDeadGateway) }

func testBackgroundDeadGateway(t *testing.T, tp *redistest.Topology) {
	shared, prefix := tp.Client(t)
	f := startSim(t, vllmsim.Config{})
	chat := newSimChat(f)
	g := newGate(chat)

	aRedis := tp.NewClient()
	a := &env{rdb: aRedis, prefix: prefix}
	a.start(t, g)
	r := a.create(t, "", map[string]any{"input": "long job", "background": true})
	<-g.entered // A claimed it and holds the lease
	aRedis.Close()
	t.Cleanup(func() { close(g.release) })

	b := &env{rdb: shared, prefix: prefix}
	b.start(t, chat)
	evs := b.getStream(t, r.ID, "")
	last := evs[len(evs)-1]
	if last.Type != "response.failed" || last.Seq != 2 || !strings.Contains(string(last.Data), "lease lapsed") {
		t.Fatalf("events %v; last %s", types(evs), last.Data)
	}
	got := b.get(t, r.ID)
	if got.Status != StatusFailed || got.Error == nil || !strings.Contains(got.Error.Message, "stopped before it finished") {
		t.Fatalf("final = %+v", got)
	}
}

// TestRedisRestartMidRun loses Redis while a streamed turn is upstream:
// the turn ends with response.failed (it could not be stored), and after
// Redis comes back empty, continuing the lost chain is a clean 400
// previous_response_not_found while new chains work.
func TestRedisRestartMidRun(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	f := startSim(t, vllmsim.Config{})
	chat := newSimChat(f)
	e := &env{rdb: rdb, fleet: f, chat: chat}
	e.start(t, chat)
	r1 := e.create(t, "", map[string]any{"input": "first"})
	chat.mu.Lock()
	chat.before = func(chatapi.Turn) { srv.Stop() }
	chat.mu.Unlock()
	evs := e.stream(t, "", map[string]any{"input": "second", "previous_response_id": r1.ID})
	last := evs[len(evs)-1]
	if last.Type != "response.failed" || !strings.Contains(string(last.Data), "could not be stored") {
		t.Fatalf("turn during the outage ended with %s: %s", last.Type, last.Data)
	}
	chat.mu.Lock()
	chat.before = nil
	chat.mu.Unlock()
	srv.Restart(t)
	code, b := e.do(t, "POST", "/v1/responses", "", map[string]any{"model": vllmsim.DefaultModel, "input": "third", "previous_response_id": r1.ID})
	if _, _, _, c := envelope(t, b); code != 400 || deref(c) != "previous_response_not_found" {
		t.Fatalf("continue lost chain: %d %s", code, b)
	}
	r4 := e.create(t, "", map[string]any{"input": "fresh"})
	if r5 := e.create(t, "", map[string]any{"input": "more", "previous_response_id": r4.ID}); r5.Status != StatusCompleted {
		t.Fatalf("new chain after restart: %+v", r5)
	}
}

// TestBackgroundStreamAndConversation creates a background turn on a
// conversation with stream: true: the creating request streams from the
// first event, the worker takes the conversation's lock, and the turn's
// items are appended.
func TestBackgroundStreamAndConversation(t *testing.T) {
	redistest.Each(t, testBackgroundStreamAndConversation)
}

func testBackgroundStreamAndConversation(t *testing.T, tp *redistest.Topology) {
	e := newEnv(t, tp, vllmsim.Config{})
	_, b := e.do(t, "POST", "/v1/conversations", "", map[string]any{"items": []any{map[string]any{"role": "user", "content": "seed"}}})
	var c Conversation
	_ = json.Unmarshal(b, &c)
	evs := e.stream(t, "", map[string]any{"input": "go on", "background": true, "conversation": c.ID})
	ts := types(evs)
	if ts[0] != "response.created" || ts[1] != "response.queued" || ts[len(ts)-1] != "response.completed" {
		t.Fatalf("events = %v", ts)
	}
	_, b = e.do(t, "GET", "/v1/conversations/"+c.ID+"/items?order=asc", "", nil)
	var l itemList
	if json.Unmarshal(b, &l) != nil || len(l.Data) != 3 || l.Data[1].Content[0].Text != "go on" || l.Data[2].Role != "assistant" {
		t.Fatalf("conversation items: %s", b)
	}
	if turns := e.chat.recorded(); len(turns) != 1 || turns[0].Session != c.ID || !strings.Contains(string(turns[0].Body), `"seed"`) {
		t.Fatalf("upstream turn: %+v", turns)
	}
}

// TestBackgroundShutdownMidRun stops gateway A's Run while its background
// response is upstream: A leaves the lease to lapse, and gateway B's
// sweeper fails the response and ends its stream with response.failed.
func TestBackgroundShutdownMidRun(t *testing.T) { redistest.Each(t, testBackgroundShutdownMidRun) }

func testBackgroundShutdownMidRun(t *testing.T, tp *redistest.Topology) {
	shared, prefix := tp.Client(t)
	f := startSim(t, vllmsim.Config{})
	chat := newSimChat(f)
	g := newGate(chat)
	svcA, err := New(Options{Redis: shared, KeyPrefix: prefix, Logger: testLogger(t), LeaseTTL: 900 * time.Millisecond}, g)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- svcA.Run(ctx) }()
	a := &env{svc: svcA, srv: httptest.NewServer(svcA.Handler())}
	t.Cleanup(a.srv.Close)
	a.url = a.srv.URL
	r := a.create(t, "", map[string]any{"input": "long job", "background": true})
	<-g.entered
	stop()
	if err := <-stopped; err != nil {
		t.Fatalf("A's Run: %v", err)
	}
	b := &env{rdb: shared, prefix: prefix}
	b.start(t, chat)
	evs := b.getStream(t, r.ID, "")
	if last := evs[len(evs)-1]; last.Type != "response.failed" || !strings.Contains(string(last.Data), "lease lapsed") {
		t.Fatalf("events %v; last %s", types(evs), last.Data)
	}
	if got := b.get(t, r.ID); got.Status != StatusFailed {
		t.Fatalf("status = %q", got.Status)
	}
}
