package gateway

import (
	"io"
	"testing"
	"time"
)

// Events that arrived together leave in one Read (one write and flush to
// the client), and a Read never waits for more than one event: a partial
// event behind a whole one stays behind.
func TestSSEFilterReleasesWhatArrived(t *testing.T) {
	pr, pw := io.Pipe()
	f := newSSEFilter(pr, false, observer{})
	defer f.Close()
	buf := make([]byte, 32<<10)
	write := func(s string) {
		go func() { _, _ = pw.Write([]byte(s)) }()
	}

	write("data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: {\"c\":3}\n\n")
	n, err := f.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(buf[:n]), "data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: {\"c\":3}\n\n"; got != want {
		t.Fatalf("first read %q, want the three events at once %q", got, want)
	}

	write("data: {\"d\":4}\n\ndata: {\"e\"")
	read := make(chan error, 1)
	go func() { n, err = f.Read(buf); read <- err }() // must return without the rest of e
	select {
	case err = <-read:
	case <-time.After(10 * time.Second): // a guard against a hang, not a wait the test relies on
		t.Fatal("Read waited for the rest of a partial event")
	}
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(buf[:n]), "data: {\"d\":4}\n\n"; got != want {
		t.Fatalf("second read %q, want %q", got, want)
	}

	write(":5}\n\ndata: [DONE]\n\n")
	n, err = f.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(buf[:n]), "data: {\"e\":5}\n\ndata: [DONE]\n\n"; got != want {
		t.Fatalf("third read %q, want %q", got, want)
	}
	pw.Close()
}
