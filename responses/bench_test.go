package responses

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/redistest"
)

// roundTrips counts the client's trips to Redis (a pipeline is one).
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// buildChain stores an n-turn chain the way turns store it: each turn a
// user message and an assistant reply (~600 bytes of chat messages) plus
// its items, linked to the previous turn.
func buildChain(tb testing.TB, st *store, tenant string, n int) (last string) {
	tb.Helper()
	ctx := context.Background()
	prev, root := "", ""
	for i := range n {
		id := newID(prefixResponse)
		if root == "" {
			root = id
		}
		in := []Item{{Type: ItemMessage, ID: newID(prefixMessage), Status: StatusCompleted, Role: "user",
			Content: []Part{{Type: "input_text", Text: fmt.Sprintf("turn %d: %s", i, strings.Repeat("lorem ipsum ", 20))}}}}
		out := []Item{{Type: ItemMessage, ID: newID(prefixMessage), Status: StatusCompleted, Role: "assistant",
			Content: []Part{{Type: "output_text", Text: strings.Repeat("dolor sit amet ", 20)}}}}
		msgs, err := renderItems(append(in, out...))
		if err != nil {
			tb.Fatal(err)
		}
		resp := &Response{ID: id, Object: "response", Status: StatusCompleted, Output: out}
		if err := st.commit(ctx, &record{tenant: tenant, resp: resp, input: in, output: out, msgs: joinMessages(msgs), prev: prev, sess: root}); err != nil {
			tb.Fatal(err)
		}
		prev = id
	}
	return prev
}

func benchStore(b *testing.B) (*store, *roundTrips) {
	addr := redistest.Addr(b)
	_, prefix := redistest.Client(b) // cleans the prefix up afterwards
	rt := &roundTrips{}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	rdb.AddHook(rt)
	b.Cleanup(func() { rdb.Close() })
	return &store{rdb: rdb, prefix: prefix, ttl: DefaultTTL, convTTL: DefaultTTL, evTTL: DefaultEventTTL}, rt
}

// BenchmarkChainRebuild measures rebuilding the context of a 100-turn
// chain for previous_response_id: "script" is what a turn does (one
// EVALSHA walking the links), "per-hop" the naive walk it replaces (one
// HMGET per turn). Both against the real test Redis on loopback.
func BenchmarkChainRebuild(b *testing.B) {
	const turns = 100
	st, rt := benchStore(b)
	last := buildChain(b, st, "bench", turns)
	ctx := context.Background()
	if _, _, _, err := st.chain(ctx, "bench", last); err != nil { // load the script
		b.Fatal(err)
	}
	b.Run("script", func(b *testing.B) {
		b.ReportAllocs()
		rt.n.Store(0)
		for b.Loop() {
			msgs, _, _, err := st.chain(ctx, "bench", last)
			if err != nil || len(msgs) != turns {
				b.Fatalf("chain: %d turns, %v", len(msgs), err)
			}
		}
		b.ReportMetric(float64(rt.n.Load())/float64(b.N), "roundtrips/op")
		b.ReportMetric(turns, "turns/op")
	})
	b.Run("per-hop", func(b *testing.B) {
		b.ReportAllocs()
		rt.n.Store(0)
		for b.Loop() {
			n, id := 0, last
			for id != "" {
				v, err := st.rdb.HMGet(ctx, st.recKey("bench", id), fMsgs, fPrev).Result()
				if err != nil {
					b.Fatal(err)
				}
				id, _ = v[1].(string)
				n++
			}
			if n != turns {
				b.Fatalf("walked %d turns", n)
			}
		}
		b.ReportMetric(float64(rt.n.Load())/float64(b.N), "roundtrips/op")
	})
}

// TestChainRebuildIsOneRoundTrip pins the design property the benchmark
// reports: a 100-turn chain is rebuilt in exactly one trip to Redis.
func TestChainRebuildIsOneRoundTrip(t *testing.T) { redistest.Each(t, testChainRebuildIsOneRoundTrip) }

func testChainRebuildIsOneRoundTrip(t *testing.T, tp *redistest.Topology) {
	_, prefix := tp.Client(t)
	rt := &roundTrips{}
	rdb := tp.NewClient()
	rdb.AddHook(rt)
	t.Cleanup(func() { rdb.Close() })
	st := &store{rdb: rdb, prefix: prefix, ttl: DefaultTTL, convTTL: DefaultTTL}
	last := buildChain(t, st, "acme", 100)
	ctx := context.Background()
	if _, _, _, err := st.chain(ctx, "acme", last); err != nil { // first call loads the script (EVALSHA, then EVAL)
		t.Fatal(err)
	}
	rt.n.Store(0)
	msgs, _, _, err := st.chain(ctx, "acme", last)
	if err != nil || len(msgs) != 100 || rt.n.Load() != 1 {
		t.Fatalf("%d turns in %d round trips, %v; want 100 in 1", len(msgs), rt.n.Load(), err)
	}
	if !strings.Contains(string(msgs[0]), "turn 0:") || !strings.Contains(string(msgs[99]), "turn 99:") {
		t.Fatalf("order: first %.40s…, last %.40s…", msgs[0], msgs[99])
	}
	// Another tenant's walk finds nothing.
	if _, _, _, err := st.chain(ctx, "globex", last); err != errNotFound {
		t.Fatalf("cross-tenant chain: %v", err)
	}
}
