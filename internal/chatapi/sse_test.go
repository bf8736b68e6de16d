package chatapi

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
)

func TestReader(t *testing.T) {
	in := ": comment\n\nevent: x\ndata: a\ndata: b\r\n\r\ndata:c\n\nid: 1\n\ndata: " + strings.Repeat("z", 70000) + "\n\ndata: last"
	er := NewReader(strings.NewReader(in))
	for _, want := range []string{"a\nb", "c", strings.Repeat("z", 70000), "last"} {
		got, err := er.Next()
		if err != nil || string(got) != want {
			t.Fatalf("Next = %.40q, %v; want %.40q", got, err, want)
		}
	}
	if _, err := er.Next(); err != io.EOF {
		t.Fatalf("after the last event: %v; want EOF", err)
	}
	big := NewReader(strings.NewReader("data: " + strings.Repeat("y", MaxEventBytes+10) + "\n\n"))
	if _, err := big.Next(); !errors.Is(err, ErrEventTooLarge) {
		t.Fatalf("oversized event: %v; want ErrEventTooLarge", err)
	}
}

func TestReaderDone(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string
		end      error
	}{
		{"done", "data: {\"a\":1}\n\ndata: [DONE]\n\ndata: {\"late\":1}\n\n", []string{`{"a":1}`}, ErrDone},
		{"done, crlf", "data: x\r\n\r\ndata: [DONE]\r\n\r\n", []string{"x"}, ErrDone},
		{"done without its blank line", "data: x\n\ndata: [DONE]", []string{"x"}, ErrDone},
		{"done with spaces", "data:  [DONE] \n\n", nil, ErrDone},
		{"no done", "data: x\n\n", []string{"x"}, io.EOF},
		{"empty", "", nil, io.EOF},
		{"only comments", ": ping\n\n: ping\n\n", nil, io.EOF},
		{"empty data", "data:\n\ndata: \n\n", []string{"", ""}, io.EOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			er := NewReader(iotest.OneByteReader(strings.NewReader(tt.in)))
			var got []string
			var err error
			for {
				var d []byte
				if d, err = er.Next(); err != nil {
					break
				}
				got = append(got, string(d))
			}
			if !errors.Is(err, tt.end) || strings.Join(got, "|") != strings.Join(tt.want, "|") || len(got) != len(tt.want) {
				t.Fatalf("got %q, %v; want %q, %v", got, err, tt.want, tt.end)
			}
			if _, again := er.Next(); !errors.Is(again, tt.end) && tt.end == ErrDone {
				t.Fatalf("after [DONE]: %v; want ErrDone again", again)
			}
		})
	}
}

func TestReaderReadError(t *testing.T) {
	boom := errors.New("boom")
	er := NewReader(io.MultiReader(strings.NewReader("data: x\n\ndata: y"), iotest.ErrReader(boom)))
	if d, err := er.Next(); err != nil || string(d) != "x" {
		t.Fatalf("Next = %q, %v; want x", d, err)
	}
	if _, err := er.Next(); !errors.Is(err, boom) {
		t.Fatalf("Next = %v; want the body's error", err)
	}
}

func TestWriter(t *testing.T) {
	rec := httptest.NewRecorder()
	sw := NewWriter(rec, "")
	if sw.Started() {
		t.Fatal("started before the first event")
	}
	if err := sw.Event("response.created", []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	if err := sw.Event("", []byte("two\nlines")); err != nil {
		t.Fatal(err)
	}
	want := "event: response.created\ndata: {\"a\":1}\n\ndata: two\ndata: lines\n\n"
	if got := rec.Body.String(); got != want {
		t.Fatalf("got %q; want %q", got, want)
	}
	for k, v := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"} {
		if got := rec.Header().Get(k); got != v {
			t.Errorf("%s = %q; want %q", k, got, v)
		}
	}
	if !rec.Flushed || rec.Code != http.StatusOK || !sw.Started() {
		t.Fatalf("flushed %v, code %d", rec.Flushed, rec.Code)
	}
}

// TestWriterUnbuffered reads each event at the client before the next is
// written: nothing is held back.
func TestWriterUnbuffered(t *testing.T) {
	next := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := NewWriter(w, "text/event-stream; charset=utf-8")
		for i := range 3 {
			if err := sw.Event("e", []byte{'0' + byte(i)}); err != nil {
				return
			}
			<-next
		}
	}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream; charset=utf-8" {
		t.Fatalf("Content-Type = %q", ct)
	}
	er := NewReader(bufio.NewReader(resp.Body))
	for i := range 3 {
		d, err := er.Next()
		if err != nil || string(d) != string(rune('0'+i)) {
			t.Fatalf("event %d = %q, %v", i, d, err)
		}
		next <- struct{}{}
	}
}
