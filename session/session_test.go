package session

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/redistest"
	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/scoring"
)

func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

func TestIdentify(t *testing.T) {
	opening := []byte(`system:You are helpful.|user:hi`)
	tests := []struct {
		name       string
		headers    map[string]string
		body       Body
		wantSource string
		wantPrefix string
	}{
		{"x-session-id wins over everything", map[string]string{"X-Session-ID": "abc", "x-claude-code-session-id": "cc"}, Body{PromptCacheKey: "p", Opening: opening}, SourceHeader, "h:t:abc"},
		{"claude code header", map[string]string{"x-claude-code-session-id": "cc1"}, Body{User: "u"}, SourceHeader, "h:t:cc1"},
		{"codex session_id header", map[string]string{"session_id": "cx"}, Body{}, SourceHeader, "h:t:cx"},
		{"codex session-id header", map[string]string{"session-id": "cx2"}, Body{}, SourceHeader, "h:t:cx2"},
		{"opencode affinity header", map[string]string{"x-session-affinity": "oc"}, Body{}, SourceHeader, "h:t:oc"},
		{"body session_id", nil, Body{SessionID: "s1", PromptCacheKey: "p"}, SourceSessionID, "s:t:s1"},
		{"prompt_cache_key", nil, Body{PromptCacheKey: "pk", User: "u"}, SourcePromptCacheKey, "p:t:pk"},
		{"user", nil, Body{User: "alice", Opening: opening}, SourceUser, "u:t:alice"},
		{"safety identifier", nil, Body{SafetyIdentifier: "sid"}, SourceUser, "u:t:sid"},
		{"opening hash", nil, Body{Opening: opening}, SourceOpening, "o:"},
		{"nothing", nil, Body{}, SourceNone, ""},
		{"blank header ignored", map[string]string{"X-Session-ID": "  "}, Body{User: "bob"}, SourceUser, "u:t:bob"},
		{"long id hashed", map[string]string{"X-Session-ID": strings.Repeat("x", 500)}, Body{}, SourceHeader, "h:t:#"},
		{"control chars hashed", map[string]string{"X-Session-ID": "a\x01b"}, Body{}, SourceHeader, "h:t:#"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.headers {
				h.Set(k, v)
			}
			got := Identify("t", h, tt.body)
			if got.Source != tt.wantSource {
				t.Errorf("source = %q; want %q", got.Source, tt.wantSource)
			}
			if !strings.HasPrefix(got.Value, tt.wantPrefix) || (tt.wantPrefix == "" && got.Value != "") {
				t.Errorf("value = %q; want prefix %q", got.Value, tt.wantPrefix)
			}
			if len(got.Value) > 200 {
				t.Errorf("value is %d bytes long", len(got.Value))
			}
		})
	}
	// The opening hash is stable, scoped, and content-sensitive.
	a := Identify("t", http.Header{}, Body{Opening: opening})
	if b := Identify("t", http.Header{}, Body{Opening: append([]byte{}, opening...)}); a != b {
		t.Errorf("same opening, different keys: %v %v", a, b)
	}
	if b := Identify("other", http.Header{}, Body{Opening: opening}); a == b {
		t.Error("scope not folded into the opening key")
	}
	if b := Identify("t", http.Header{}, Body{Opening: []byte("system:x|user:hi")}); a == b {
		t.Error("different openings share a key")
	}
}

// A client-named session is split by the conversation's opening: an
// agent conversation and a side request under one session id (OpenCode's
// title generation) are two bindings of one family, and a sub-agent is a
// family of its own whose parent is the session it runs in, or the parent
// its headers name.
func TestIdentifyConversations(t *testing.T) {
	agent := []byte("system\x00You are an agent.\x00user\x00fix the bug\x00[tools]")
	title := []byte("system\x00Generate a title.\x00user\x00fix the bug\x00")
	h := http.Header{"X-Session-Affinity": {"ses_1"}}
	a, b := Identify("t", h, Body{Opening: agent}), Identify("t", h, Body{Opening: title})
	if a.Value == b.Value || a.Family != b.Family || a.Family != "h:t:ses_1" || a.Parent != "" {
		t.Errorf("agent %+v, title %+v; want two conversations of family h:t:ses_1", a, b)
	}
	if a.Relatives() != a.Family {
		t.Errorf("relatives = %q; want the family", a.Relatives())
	}
	if again := Identify("t", h, Body{Opening: append([]byte{}, agent...)}); again != a {
		t.Errorf("same conversation keyed %+v then %+v", a, again)
	}
	// No opening (a completion): the named session alone.
	if c := Identify("t", h, Body{}); c.Value != "h:t:ses_1" {
		t.Errorf("completion key = %q; want the session id", c.Value)
	}
	sub := http.Header{"X-Claude-Code-Session-Id": {"cc"}, "X-Claude-Code-Agent-Id": {"a1"}}
	brief := []byte("system\x00You are an agent.\x00user\x00look for tests\x00[tools]")
	k := Identify("t", sub, Body{Opening: brief})
	if k.Family != "h:t:cc/agent/a1" || k.Parent != "h:t:cc" || k.Relatives() != "h:t:cc" || !strings.HasPrefix(k.Value, "h:t:cc/agent/a1/") {
		t.Errorf("sub-agent key %+v; want family a1, parent cc", k)
	}
	sub.Set("X-Claude-Code-Parent-Agent-Id", "a0")
	if k := Identify("t", sub, Body{Opening: brief}); k.Parent != "h:t:cc/agent/a0" {
		t.Errorf("named parent: %+v", k)
	}
	dyn := http.Header{"X-Dynamo-Session-Id": {"run:researcher"}, "X-Dynamo-Parent-Session-Id": {"run"}}
	if k := Identify("t", dyn, Body{Opening: brief}); k.Family != "h:t:run:researcher" || k.Parent != "h:t:run" {
		t.Errorf("dynamo key %+v", k)
	}
	if o := Identify("t", http.Header{}, Body{Opening: agent}); o.Family != "" || o.Parent != "" || o.Relatives() != "" {
		t.Errorf("opening-only key %+v has relatives", o)
	}
}

// A Claude Code sub-agent is a session of its own under the run's, and
// names its parent: the run's main conversation, or the sub-agent that
// spawned it.
func TestIdentifySubAgent(t *testing.T) {
	id := func(hs ...string) Key {
		h := http.Header{}
		for i := 0; i < len(hs); i += 2 {
			h.Set(hs[i], hs[i+1])
		}
		return Identify("t", h, Body{})
	}
	main := id("X-Claude-Code-Session-Id", "run1")
	sub := id("X-Claude-Code-Session-Id", "run1", AgentHeader, "a1")
	nested := id("X-Claude-Code-Session-Id", "run1", AgentHeader, "a2", ParentAgentHeader, "a1")
	other := id("X-Claude-Code-Session-Id", "run2", AgentHeader, "a1")
	if main.Parent != "" {
		t.Errorf("main conversation has parent %q", main.Parent)
	}
	if sub.Value == main.Value || sub.Source != SourceHeader || sub.Parent != main.Value {
		t.Errorf("sub-agent key %+v; want its own key with parent %q", sub, main.Value)
	}
	if nested.Parent != sub.Value || nested.Value == sub.Value {
		t.Errorf("nested sub-agent key %+v; want parent %q", nested, sub.Value)
	}
	if other.Value == sub.Value {
		t.Errorf("one agent id in two runs shares key %q", sub.Value)
	}
	if again := id("X-Claude-Code-Session-Id", "run1", AgentHeader, "a1"); again != sub {
		t.Errorf("same sub-agent, keys %+v and %+v", again, sub)
	}
	long := id("X-Claude-Code-Session-Id", strings.Repeat("s", 120), AgentHeader, strings.Repeat("a", 40))
	if len(long.Value) > 64 || len(long.Parent) > 200 {
		t.Errorf("long ids not hashed: %+v", long)
	}
}

func testBinding() Binding {
	return Binding{Binding: scoring.Binding{Replica: "10.0.0.7:8000", TipDepth: 931, PromptTokens: 15000, PromptBytes: 61000,
		CachedTokens: 15400, Turns: 12, Updated: time.UnixMilli(1789095808123)}, TipKey: 0xfedcba9876543210, TextLen: 59000, TextHash: 0xabcdef0123456789}
}

func TestBindingEncoding(t *testing.T) {
	b := testBinding()
	got, err := decode(b.encode())
	if err != nil {
		t.Fatal(err)
	}
	if got != b {
		t.Errorf("round trip = %+v; want %+v", got, b)
	}
	g := b
	g.GeneratedTokens = 399
	if got, err := decode(g.encode()); err != nil || got != g {
		t.Errorf("round trip with generated tokens = %+v, %v; want %+v", got, err, g)
	}
	// Version 1 records still read the same.
	v1 := "1|10.0.0.7:8000|fedcba9876543210|931|15000|61000|59000|abcdef0123456789|15400|12|1789095808123"
	if got, err := decode(v1); err != nil || got != b {
		t.Errorf("decode(v1) = %+v, %v; want %+v", got, err, b)
	}
	for _, bad := range []string{"", "1|a", "2|r|0|0|0|0|0|0|0|0|0", "1|r|zz|0|0|0|0|0|0|0|0", "1|r|0|x|0|0|0|0|0|0|0",
		"1|r|0|0|0|0|0|q|0|0|0", "1|r|0|0|0|0|0|0|y|0|0", "1|r|0|0|0|0|0|0|0|0|t", "1|r|0|0|0|0|0|0|0|0",
		`{"v":3,"r":"x","u":1}`, `{"v":2,"u":1}`, `{"v":2,"r":"x","tk":"zz","u":1}`, `{"v":2,"r":"x","th":"-1","u":1}`, `[1]`} {
		if _, err := decode(bad); err == nil {
			t.Errorf("decode(%q) succeeded", bad)
		}
	}
}

// Migration 1: version 1 records written by an older gateway are rewritten
// as version 2 without loss, keeping their TTL; re-running changes nothing.
func TestMigrateBindings(t *testing.T) { redistest.Each(t, testMigrateBindings) }

func testMigrateBindings(t *testing.T, tp *redistest.Topology) {
	rdb, prefix := tp.Client(t)
	ctx := context.Background()
	v1 := "1|10.0.0.7:8000|fedcba9876543210|931|15000|61000|59000|abcdef0123456789|15400|12|1789095808123"
	if err := rdb.Set(ctx, prefix+"sess:h:a", v1, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, prefix+"sess:h:b", "1|r|0|0|0|0|0|0|0|0|0", 0).Err(); err != nil {
		t.Fatal(err)
	}
	current := testBinding()
	current.Replica = "other"
	rdb.Set(ctx, prefix+"sess:h:c", current.encode(), time.Hour)
	rdb.Set(ctx, prefix+"sess:h:bad", "1|garbage", time.Hour)
	rdb.Set(ctx, prefix+"other:key", v1, 0) // not a binding
	// Enough more that every master of a Cluster holds some.
	const spread = 30
	for i := range spread {
		if err := rdb.Set(ctx, prefix+"sess:s:"+strconv.Itoa(i), v1, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}

	n, err := MigrateBindings(ctx, rdb, prefix)
	if n != 2+spread || err == nil || !strings.Contains(err.Error(), "1 unreadable") {
		t.Fatalf("MigrateBindings = %d, %v; want %d and one unreadable", n, err, 2+spread)
	}
	s := NewStore(rdb, Options{Prefix: prefix, TTL: time.Hour})
	got, ok, err := s.Lookup(ctx, "h:a")
	if err != nil || !ok || got != testBinding() {
		t.Errorf("migrated binding = %+v, %v, %v; want %+v", got, ok, err, testBinding())
	}
	if v := rdb.Get(ctx, prefix+"sess:h:a").Val(); !strings.HasPrefix(v, `{"v":2`) {
		t.Errorf("stored %q; want a version 2 record", v)
	}
	if ttl := rdb.TTL(ctx, prefix+"sess:h:a").Val(); ttl <= 50*time.Minute {
		t.Errorf("TTL after migration = %v; want about an hour", ttl)
	}
	if ttl := rdb.TTL(ctx, prefix+"sess:h:b").Val(); ttl != -1 {
		t.Errorf("persistent key got TTL %v", ttl)
	}
	if v := rdb.Get(ctx, prefix+"other:key").Val(); v != v1 {
		t.Errorf("a key outside sess: was rewritten: %q", v)
	}
	if n, _ := MigrateBindings(ctx, rdb, prefix); n != 0 {
		t.Errorf("second run migrated %d; want 0", n)
	}
}

func TestStoreRedis(t *testing.T) { redistest.Each(t, testStoreRedis) }

func testStoreRedis(t *testing.T, tp *redistest.Topology) {
	rdb, prefix := tp.Client(t)
	ctx := context.Background()
	s := NewStore(rdb, Options{Prefix: prefix, TTL: time.Minute})
	if _, ok, err := s.Lookup(ctx, "k1"); ok || err != nil {
		t.Fatalf("empty lookup = %v, %v", ok, err)
	}
	if _, err := s.Remember(ctx, "k1", bind("r1", 3), false); err != nil {
		t.Fatal(err)
	}
	// A second store (another gateway process) sees the binding.
	other := NewStore(rdb, Options{Prefix: prefix})
	b, ok, err := other.Lookup(ctx, "k1")
	if err != nil || !ok || b.Replica != "r1" || b.TipDepth != 3 {
		t.Fatalf("other gateway lookup = %+v, %v, %v", b, ok, err)
	}
	ttl := rdb.TTL(ctx, prefix+"sess:k1").Val()
	if ttl <= 0 || ttl > time.Minute {
		t.Errorf("TTL = %v; want (0, 1m]", ttl)
	}
	if err := s.Forget(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.Lookup(ctx, "k1"); ok {
		t.Error("binding survived Forget")
	}
}

// An update kept locally is what this process's lookups see until its
// flush lands, and what other processes see after; a rebinding by another
// process wins over it.
func TestStoreUpdateLocalThenFlush(t *testing.T) { redistest.Each(t, testStoreUpdateLocalThenFlush) }

func testStoreUpdateLocalThenFlush(t *testing.T, tp *redistest.Topology) {
	rdb, prefix := tp.Client(t)
	ctx := context.Background()
	clock := time.UnixMilli(1_800_000_000_000)
	now := func() time.Time { return clock }
	s := NewStore(rdb, Options{Prefix: prefix, Now: now})
	other := NewStore(rdb, Options{Prefix: prefix, Now: now, LocalTrust: -1})
	if _, err := s.Remember(ctx, "k", bind("r1", 3), false); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Millisecond)
	setCached := func(n int) func(*Binding) bool {
		return func(b *Binding) bool { b.CachedTokens = n; return true }
	}
	if _, changed := s.UpdateLocal("k", bind("r1", 3), setCached(900)); !changed {
		t.Fatal("UpdateLocal changed nothing")
	}
	if b, _, _ := s.Lookup(ctx, "k"); b.CachedTokens != 900 {
		t.Errorf("own lookup before the flush: cached %d; want 900", b.CachedTokens)
	}
	if b, _, _ := other.Lookup(ctx, "k"); b.CachedTokens != 0 {
		t.Errorf("other gateway before the flush: cached %d; want 0", b.CachedTokens)
	}
	if err := s.Flush(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if b, _, _ := other.Lookup(ctx, "k"); b.CachedTokens != 900 {
		t.Errorf("other gateway after the flush: cached %d; want 900", b.CachedTokens)
	}
	// Another gateway rebinds: this process's pending copy of the old
	// binding must not shadow it once the trust window has passed.
	clock = clock.Add(time.Millisecond)
	s.UpdateLocal("k", Binding{}, setCached(1200))
	if _, err := other.Remember(ctx, "k", bind("r2", 1), false); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Second)
	if b, _, _ := s.Lookup(ctx, "k"); b.Replica != "r2" {
		t.Errorf("after another gateway's rebinding: %q; want r2", b.Replica)
	}
	if _, changed := s.UpdateLocal("k", Binding{}, func(*Binding) bool { return false }); changed {
		t.Error("UpdateLocal reported a change fn refused")
	}
}

// An update made within the millisecond of the write it follows (a turn
// that ends right after its binding was published) is still what this
// process's lookups see: Redis keeps the stamp to the millisecond, and
// the update is stamped after it.
func TestStoreUpdateLocalSameMillisecond(t *testing.T) {
	redistest.Each(t, testStoreUpdateLocalSameMillisecond)
}

func testStoreUpdateLocalSameMillisecond(t *testing.T, tp *redistest.Topology) {
	rdb, prefix := tp.Client(t)
	ctx := context.Background()
	clock := time.UnixMilli(1_800_000_000_000).Add(300 * time.Microsecond)
	s := NewStore(rdb, Options{Prefix: prefix, Now: func() time.Time { return clock }})
	if _, err := s.Remember(ctx, "k", bind("r1", 3), false); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(200 * time.Microsecond) // the same millisecond
	b, changed := s.UpdateLocal("k", bind("r1", 3), func(b *Binding) bool { b.CachedTokens = 832; return true })
	if !changed || b.Updated.UnixMilli() <= clock.UnixMilli() {
		t.Fatalf("update stamped %v (changed %v); want after the millisecond of %v", b.Updated, changed, clock)
	}
	if b, _, _ := s.Lookup(ctx, "k"); b.CachedTokens != 832 {
		t.Errorf("own lookup before the flush: cached %d; want the update's 832", b.CachedTokens)
	}
}

// Concurrent first turns of one session on several gateways agree on one
// replica.
func TestStoreFirstWriterWins(t *testing.T) { redistest.Each(t, testStoreFirstWriterWins) }

func testStoreFirstWriterWins(t *testing.T, tp *redistest.Topology) {
	rdb, prefix := tp.Client(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make([]string, 8)
	for i := range results {
		wg.Go(func() {
			s := NewStore(rdb, Options{Prefix: prefix})
			b, err := s.Remember(ctx, "race", bind("r"+string(rune('0'+i)), 0), true)
			if err != nil {
				t.Error(err)
			}
			results[i] = b.Replica
		})
	}
	wg.Wait()
	for _, r := range results {
		if r != results[0] {
			t.Fatalf("gateways disagree: %v", results)
		}
	}
}

// A Redis restart (persistence off) loses every binding; the store restores
// the ones it served from memory, and keeps answering while Redis is down.
func TestStoreSurvivesRedisRestart(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	ctx := context.Background()
	s := NewStore(rdb, Options{TTL: time.Minute, LocalTrust: -1})
	if _, err := s.Remember(ctx, "k", bind("r2", 0), false); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	b, ok, err := s.Lookup(ctx, "k")
	if err == nil {
		t.Error("lookup with Redis down reported no error")
	}
	if !ok || b.Replica != "r2" {
		t.Errorf("lookup with Redis down = %+v, %v; want local r2", b, ok)
	}
	srv.Restart(t)
	testrun.Eventually(t, 5*time.Second, func() bool {
		b, ok, err = s.Lookup(ctx, "k")
		return err == nil
	}, "a lookup after Redis restarted")
	if !ok || b.Replica != "r2" {
		t.Fatalf("after restart lookup = %+v, %v, %v", b, ok, err)
	}
	if v := rdb.Get(ctx, "sess:k").Val(); !strings.Contains(v, `"r":"r2"`) {
		t.Errorf("binding not restored into Redis: %q", v)
	}
}

func TestStoreLocalTTLAndBound(t *testing.T) {
	now := time.Unix(1000, 0)
	s := NewStore(nil, Options{TTL: time.Minute, LocalSize: 2, Now: func() time.Time { return now }})
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		if _, err := s.Remember(ctx, k, bind(k, 0), false); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, _ := s.Lookup(ctx, "a"); ok {
		t.Error("oldest binding kept beyond the local bound")
	}
	if b, ok, _ := s.Lookup(ctx, "e"); !ok || b.Replica != "e" {
		t.Errorf("newest binding lost: %+v %v", b, ok)
	}
	now = now.Add(2 * time.Minute)
	if _, ok, _ := s.Lookup(ctx, "e"); ok {
		t.Error("binding outlived its TTL locally")
	}
}

func bind(replica string, tipDepth int) Binding {
	return Binding{Binding: scoring.Binding{Replica: replica, TipDepth: tipDepth}}
}

// A binding this process read from or wrote to Redis is answered from
// memory for LocalTrust, without a round trip: a rebinding by another
// gateway is seen once the window has passed, and local changes do not
// stretch it.
func TestStoreLocalTrust(t *testing.T) { redistest.Each(t, testStoreLocalTrust) }

func testStoreLocalTrust(t *testing.T, tp *redistest.Topology) {
	rdb, prefix := tp.Client(t)
	ctx := context.Background()
	clock := time.UnixMilli(1_800_000_000_000)
	now := func() time.Time { return clock }
	var gets atomic.Int64
	rdb.AddHook(countGets{&gets})
	s := NewStore(rdb, Options{Prefix: prefix, Now: now, LocalTrust: time.Second})
	other := NewStore(rdb, Options{Prefix: prefix, Now: now, LocalTrust: -1})
	if _, err := s.Remember(ctx, "k", bind("r1", 3), true); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Remember(ctx, "k", bind("r2", 1), false); err != nil {
		t.Fatal(err)
	}
	gets.Store(0)
	clock = clock.Add(600 * time.Millisecond)
	if b, ok, err := s.Lookup(ctx, "k"); err != nil || !ok || b.Replica != "r1" {
		t.Fatalf("lookup inside the window = %+v, %v, %v; want the local r1", b, ok, err)
	}
	if n := gets.Load(); n != 0 {
		t.Errorf("lookup inside the window asked Redis %d times; want 0", n)
	}
	// A completed turn's local update is not a check against Redis.
	s.UpdateLocal("k", Binding{}, func(b *Binding) bool { b.CachedTokens = 500; return true })
	clock = clock.Add(400 * time.Millisecond)
	if b, _, _ := s.Lookup(ctx, "k"); b.Replica != "r2" {
		t.Fatalf("lookup after the window = %q; want another gateway's r2", b.Replica)
	}
	if n := gets.Load(); n != 1 {
		t.Errorf("lookup after the window asked Redis %d times; want 1", n)
	}
	// The read refreshed the window.
	clock = clock.Add(999 * time.Millisecond)
	if b, _, _ := s.Lookup(ctx, "k"); b.Replica != "r2" || gets.Load() != 1 {
		t.Errorf("lookup inside the new window = %q after %d GETs; want r2 from memory", b.Replica, gets.Load())
	}
	// A binding whose write failed is never trusted.
	if _, changed := s.UpdateLocal("fresh", bind("r3", 0), func(*Binding) bool { return true }); !changed {
		t.Fatal("UpdateLocal changed nothing")
	}
	if _, ok := s.trusted("fresh"); ok {
		t.Error("a binding Redis never saw is trusted")
	}
}

// countGets counts GET commands.
type countGets struct{ n *atomic.Int64 }

func (countGets) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c countGets) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "get" {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (countGets) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A binding whose write failed (Redis down) reaches Redis with Flush only
// if no other gateway bound the session meanwhile; otherwise the other
// gateway's binding replaces the local copy. A later local change to a
// confirmed binding is a plain write.
func TestStoreFlushUnconfirmed(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	ctx := context.Background()
	a := NewStore(rdb, Options{TTL: time.Minute})
	b := NewStore(rdb, Options{TTL: time.Minute})
	srv.Stop()
	if _, err := a.Remember(ctx, "k", bind("r1", 2), true); err == nil {
		t.Fatal("remember with Redis down reported no error")
	}
	if _, err := a.Remember(ctx, "lone", bind("r3", 1), true); err == nil {
		t.Fatal("remember with Redis down reported no error")
	}
	srv.Restart(t)
	testrun.Eventually(t, 5*time.Second, func() bool {
		_, err := b.Remember(ctx, "k", bind("r2", 1), true)
		return err == nil
	}, "a remember after Redis restarted")
	a.UpdateLocal("k", Binding{}, func(x *Binding) bool { x.CachedTokens = 700; return true })
	if err := a.Flush(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if l, _ := a.Local("k"); l.Replica != "r2" {
		t.Errorf("after the flush the local copy is %q; want the other gateway's r2", l.Replica)
	}
	if stored, _ := decode(rdb.Get(ctx, "sess:k").Val()); stored.Replica != "r2" {
		t.Errorf("Redis holds %q; want r2 kept", stored.Replica)
	}
	a.UpdateLocal("lone", Binding{}, func(x *Binding) bool { x.CachedTokens = 900; return true })
	if err := a.Flush(ctx, "lone"); err != nil {
		t.Fatal(err)
	}
	if stored, _ := decode(rdb.Get(ctx, "sess:lone").Val()); stored.Replica != "r3" || stored.CachedTokens != 900 {
		t.Errorf("Redis holds %+v for the unconfirmed binding; want r3 with 900 cached", stored)
	}
}

// Proposed bindings reach Redis in one batch: a session no one bound is
// written, one another gateway bound first is adopted, one Redis
// confirmed earlier is rewritten with its local change, and a key with
// no local copy is skipped, all in one pipeline; a key given twice is
// written once.
func TestStoreFlushAllProposals(t *testing.T) { redistest.Each(t, testStoreFlushAllProposals) }

func testStoreFlushAllProposals(t *testing.T, tp *redistest.Topology) {
	rdb, prefix := tp.Client(t)
	ctx := context.Background()
	a := NewStore(rdb, Options{Prefix: prefix})
	b := NewStore(rdb, Options{Prefix: prefix})
	if _, err := a.Remember(ctx, "confirmed", bind("r1", 1), false); err != nil {
		t.Fatal(err)
	}
	a.UpdateLocal("confirmed", Binding{}, func(x *Binding) bool { x.CachedTokens = 500; return true })
	a.Propose("new", bind("r1", 2))
	a.Propose("taken", bind("r1", 3))
	b.Propose("taken", bind("r2", 4))
	if err := b.Flush(ctx, "taken"); err != nil {
		t.Fatal(err)
	}
	a.UpdateLocal("new", Binding{}, func(x *Binding) bool { x.CachedTokens = 200; return true })
	sets := &setCounter{}
	rdb.AddHook(sets)
	if err := a.FlushAll(ctx, []string{"new", "taken", "confirmed", "absent", "new"}); err != nil {
		t.Fatal(err)
	}
	if n := sets.n.Load(); n != 3 {
		t.Errorf("the batch sent %d SETs; want 3 (new, taken, confirmed)", n)
	}
	stored := func(k string) Binding {
		b, _ := decode(rdb.Get(ctx, prefix+"sess:"+k).Val())
		return b
	}
	if got := stored("new"); got.Replica != "r1" || got.CachedTokens != 200 {
		t.Errorf("new: Redis holds %+v; want r1 with 200 cached", got)
	}
	if got := stored("taken"); got.Replica != "r2" {
		t.Errorf("taken: Redis holds %+v; want the first writer's r2", got)
	}
	if l, _ := a.Local("taken"); l.Replica != "r2" {
		t.Errorf("taken: a's copy is %+v; want r2 adopted", l)
	}
	if got := stored("confirmed"); got.CachedTokens != 500 {
		t.Errorf("confirmed: Redis holds %+v; want 500 cached", got)
	}
	if n := rdb.Exists(ctx, prefix+"sess:absent").Val(); n != 0 {
		t.Errorf("absent: written")
	}
}

// setCounter is a go-redis hook counting the SETs a pipeline sends.
type setCounter struct{ n atomic.Int64 }

func (h *setCounter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *setCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *setCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if c.Name() == "set" {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// FuzzIdentify feeds arbitrary session headers and bodies to Identify, a
// trust boundary: keys stay short and printable, a conversation key
// extends its family's, and a parent is only ever a named family.
func FuzzIdentify(f *testing.F) {
	f.Add("ses_1", "", "", "", "user", []byte("system\x00hi"))
	f.Add("", "cc", "agent-1", "parent-0", "", []byte("system\x00You are an agent.\x00user\x00task"))
	f.Add(strings.Repeat("x", 300), "a\x01b", "", "", "alice", []byte{})
	f.Fuzz(func(t *testing.T, sid, claude, agent, parent, user string, opening []byte) {
		h := http.Header{}
		for name, v := range map[string]string{"X-Session-ID": sid, "X-Claude-Code-Session-Id": claude,
			"X-Claude-Code-Agent-Id": agent, "X-Claude-Code-Parent-Agent-Id": parent} {
			if v != "" {
				h[http.CanonicalHeaderKey(name)] = []string{v}
			}
		}
		k := Identify("tenant", h, Body{User: user, Opening: opening})
		for _, s := range []string{k.Value, k.Family, k.Parent} {
			if len(s) > 2*maxKeyLen+64 || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
				t.Fatalf("unsafe key %q from %+v", s, k)
			}
		}
		if k.Family != "" && !strings.HasPrefix(k.Value, k.Family) {
			t.Fatalf("conversation key %q does not extend family %q", k.Value, k.Family)
		}
		if k.Parent != "" && k.Source != SourceHeader {
			t.Fatalf("parent %q without a named session (%s)", k.Parent, k.Source)
		}
	})
}
