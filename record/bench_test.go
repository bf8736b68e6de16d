package record

import (
	"context"
	"testing"
)

// benchEntry is a 4,096-token prompt's entry: 256 block hashes.
func benchEntry() Entry {
	e := entry(1)
	e.Blocks = make([]uint64, 256)
	for i := range e.Blocks {
		e.Blocks[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	e.PromptTokens = 4096
	return e
}

// BenchmarkRecord measures the request path's cost: handing an entry to
// a running Recorder. Entries the writer cannot keep up with are dropped
// and reported as drop%.
func BenchmarkRecord(b *testing.B) {
	r, err := New(Config{Dir: b.TempDir(), Queue: 4096})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	e := benchEntry()
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		r.Record(e)
		n++
	}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(100*float64(r.Dropped())/float64(n), "drop%")
}

// BenchmarkWrite measures the writer's cost per line (hashing the ids,
// encoding, buffered writing), off the request path.
func BenchmarkWrite(b *testing.B) {
	cfg := Config{Dir: b.TempDir()}
	r, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	w := &rotator{cfg: &r.cfg}
	defer w.close()
	e := benchEntry()
	b.ReportAllocs()
	for b.Loop() {
		r.write(w, e)
	}
	l, _ := appendLine(nil, e)
	b.ReportMetric(float64(len(l)), "B/line")
}
