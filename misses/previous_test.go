package misses

import (
	"fmt"
	"sync"
	"testing"
)

func TestPrevious(t *testing.T) {
	fp := mustPrompt(t, chatBody(t, weatherTools, turn2...)).Fingerprint(Options{})
	p := NewPrevious(3 * fp.Size())
	for i := range 4 {
		p.Put(fmt.Sprint("s", i), fp)
		if i == 1 {
			p.Get("s0") // s0 is now more recent than s1
		}
	}
	if n, b := p.Len(); n != 3 || b != 3*fp.Size() {
		t.Errorf("got %d sessions, %d bytes; want 3 and %d", n, b, 3*fp.Size())
	}
	if p.Get("s1") != nil || p.Get("s0") != fp || p.Get("s3") != fp {
		t.Error("want s1 dropped as the least recently used, s0 and s3 kept")
	}
	p.Put("s3", fp) // replacing counts once
	if _, b := p.Len(); b != 3*fp.Size() {
		t.Errorf("got %d bytes after a replace; want %d", b, 3*fp.Size())
	}
	small := NewPrevious(fp.Size() - 1)
	small.Put("big", fp)
	if n, b := small.Len(); n != 0 || b != 0 {
		t.Errorf("got %d sessions, %d bytes; want a fingerprint over the budget not kept", n, b)
	}
}

func TestPreviousConcurrent(t *testing.T) {
	fp := mustPrompt(t, chatBody(t, nil, turn1...)).Fingerprint(Options{})
	p := NewPrevious(10 * fp.Size())
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 300 {
				k := fmt.Sprint(g, "/", i%20)
				p.Put(k, fp)
				_ = p.Get(k)
			}
		})
	}
	wg.Wait()
	if n, b := p.Len(); n > 10 || b != n*fp.Size() {
		t.Errorf("got %d sessions, %d bytes; want at most 10, %d bytes each", n, b, fp.Size())
	}
}
