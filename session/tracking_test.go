package session

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/redistest"
)

// getCounter counts the GETs a client sends.
type getCounter struct{ n atomic.Int64 }

func (g *getCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *getCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "get" {
			g.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (g *getCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// With tracking on, a binding this process wrote or read is answered from
// memory, its own writes' notices do not distrust it, another process's
// write does, and trust granted before the tracking connection was lost
// does not survive it.
func TestTracking(t *testing.T) {
	rdb, prefix := redistest.Client(t)
	ctx, cancel := context.WithCancel(t.Context())
	gets := &getCounter{}
	ra := redis.NewClient(rdb.Options())
	ra.AddHook(gets)
	defer ra.Close()
	a := NewStore(ra, Options{Prefix: prefix, TTL: 30 * 60e9})
	other := NewStore(rdb, Options{Prefix: prefix, TTL: 30 * 60e9})
	trk := a.Track(ra.Options(), slog.Default())
	notices, active, ids := make(chan string, 64), make(chan bool, 8), make(chan int64, 8)
	trk.onNotice = func(k string) { notices <- k }
	trk.onActive = func(on bool) { active <- on }
	trk.onConnect = func(id int64) { ids <- id }
	done := make(chan error)
	go func() { done <- trk.Run(ctx) }()
	defer func() { cancel(); <-done }()
	id := <-ids
	if !<-active {
		t.Fatal("tracking did not turn on")
	}
	lookup := func(want string, wantGets int64) {
		t.Helper()
		b, ok, err := a.Lookup(ctx, "k")
		if err != nil || !ok || b.Replica != want {
			t.Fatalf("lookup = %+v, %v, %v; want %s", b, ok, err, want)
		}
		if n := gets.n.Load(); n != wantGets {
			t.Fatalf("%d GETs so far; want %d", n, wantGets)
		}
	}

	if _, err := a.Remember(ctx, "k", bind("r1", 0), false); err != nil {
		t.Fatal(err)
	}
	if k := <-notices; k != "k" {
		t.Fatalf("notice for %q", k)
	}
	lookup("r1", 0) // its own write's notice is absorbed

	if _, err := other.Remember(ctx, "k", bind("r2", 0), false); err != nil {
		t.Fatal(err)
	}
	<-notices
	lookup("r2", 1) // another's write: read again
	lookup("r2", 1) // and trusted from that read

	if err := rdb.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
		t.Fatal(err)
	}
	if <-active {
		t.Fatal("tracking stayed on with its connection killed")
	}
	lookup("r2", 2) // nothing trusted while it is off
	<-ids
	if !<-active {
		t.Fatal("tracking did not come back")
	}
	lookup("r2", 3) // the read before the gap is not trusted after it
	lookup("r2", 3)
	if keys, _ := trk.Notices(); keys != 2 {
		t.Errorf("%d notices; want 2", keys)
	}
}

// The trust rules without a server: a notice that overtakes the answer of
// a call issued before it denies that answer trust, an own write's notice
// is absorbed once, a SET NX that wrote nothing gives back the notice it
// expected (or distrusts its key when another writer's was absorbed in its
// place), and an answer is not trusted when another own write of the key
// was in flight or issued meanwhile (their order in Redis is unknown).
func TestTrackingMarks(t *testing.T) {
	s := NewStore(nil, Options{Prefix: "p:"})
	trk := s.Track(&redis.Options{Addr: "127.0.0.1:1"}, slog.Default())
	trk.distrust(true)
	notice := func(k string) { trk.notice(&redis.Message{PayloadSlice: []string{"p:sess:" + k}}) }
	trusted := func(m mark) bool { return trk.holds("k", trk.settle("k", m)) }

	m := trk.mark("k")
	if !trusted(m) {
		t.Fatal("a fresh mark does not hold")
	}
	notice("k")
	if trusted(m) {
		t.Error("a mark holds after a notice about its key")
	}

	w := trk.markWrite("k")
	notice("k")
	if !trusted(w) {
		t.Error("an own write's notice distrusted its key")
	}
	trk.done("k", w)
	notice("k")
	if trusted(w) {
		t.Error("a second notice was absorbed by one write")
	}

	w = trk.markWrite("k")
	trk.unwritten("k")
	trk.done("k", w)
	notice("k")
	if trusted(w) {
		t.Error("a notice after an unwritten SET NX was absorbed")
	}
	w = trk.markWrite("k")
	notice("k") // another writer's, absorbed in place of the SET NX's
	trk.unwritten("k")
	trk.done("k", w)
	if trusted(w) {
		t.Error("an unwritten SET NX left its key trusted after absorbing another's notice")
	}

	// Two own writes at once: neither answer is trusted.
	w1 := trk.markWrite("k")
	w2 := trk.markWrite("k")
	notice("k")
	notice("k")
	if trusted(w1) || trusted(w2) {
		t.Error("an answer trusted while another own write of its key was in flight")
	}
	trk.done("k", w1)
	trk.done("k", w2)
	// A read, then an own write issued before its answer is used.
	m = trk.mark("k")
	w = trk.markWrite("k")
	if trusted(m) {
		t.Error("a read's answer trusted with an own write issued after it")
	}
	trk.done("k", w)
	notice("k")
	if m := trk.mark("k"); !trusted(m) {
		t.Error("a read with no own write around it not trusted")
	}

	m = trk.mark("k")
	trk.failed()
	if trusted(m) {
		t.Error("a mark holds after a failed write")
	}
	m = trk.mark("k")
	trk.notice(&redis.Message{}) // a notice naming no key
	if trusted(m) {
		t.Error("a mark holds after a flush")
	}
	trk.distrust(false)
	if m := trk.mark("k"); m != (mark{}) || trusted(m) {
		t.Error("marks while tracking is off")
	}
}

// A store that refuses CLIENT TRACKING (the embedded miniredis) ends Run
// at once with ErrTrackingUnsupported, and the store asks it every turn.
func TestTrackingUnsupported(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	s := NewStore(rdb, Options{})
	trk := s.Track(rdb.Options(), slog.Default())
	if err := trk.Run(t.Context()); !errors.Is(err, ErrTrackingUnsupported) {
		t.Fatalf("Run = %v; want ErrTrackingUnsupported", err)
	}
	if trk.On() {
		t.Error("tracking on without the server's support")
	}
}

// A connection that stops answering (the server paused) loses trust
// within three health checks, and tracking comes back once it answers.
func TestTrackingSilentConnection(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	s := NewStore(rdb, Options{})
	trk := s.Track(rdb.Options(), slog.Default())
	active := make(chan bool, 8)
	trk.onActive = func(on bool) { active <- on }
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- trk.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if !<-active {
		t.Fatal("tracking did not turn on")
	}
	if err := rdb.Do(ctx, "CLIENT", "PAUSE", "4500", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	if <-active {
		t.Fatal("tracking turned on again while the server was paused")
	}
	if !<-active {
		t.Fatal("tracking did not come back after the pause")
	}
}
