package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/gateway/request"
)

// Events that arrived together leave in one Read (one write and flush to
// the client), and a Read never waits for more than one event: a partial
// event behind a whole one stays behind.
func TestSSEFilterReleasesWhatArrived(t *testing.T) {
	pr, pw := io.Pipe()
	f := NewSSEFilter(pr, false, Observer{})
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

// A whole answer of declared length is accounted (usage, then done) by
// the read that completes it, before that read returns: the caller passes
// the last bytes on only after done has queued the binding's write. One of
// unknown length ends at EOF. Either ends once.
func TestJSONTapEndsWithItsLastByte(t *testing.T) {
	const body = `{"id":"x","usage":{"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":2}}}`
	for _, tc := range []struct {
		name        string
		length      int64
		doneOnBytes bool
	}{{"declared", int64(len(body)), true}, {"unknown", -1, false}} {
		t.Run(tc.name, func(t *testing.T) {
			var events []string
			tap := &jsonTap{src: io.NopCloser(struct{ io.Reader }{strings.NewReader(body)}), left: tc.length, obs: Observer{
				FirstByte: func() { events = append(events, "first") },
				Usage: func(u request.Usage) {
					events = append(events, "usage")
					if u.PromptTokens != 3 || u.CachedTokens != 2 {
						t.Errorf("usage %+v", u)
					}
				},
				Done: func(err error) { events = append(events, fmt.Sprint("done ", err)) },
			}}
			buf := make([]byte, 4096)
			n, err := tap.Read(buf) // all of it, no EOF yet
			if n != len(body) || err != nil {
				t.Fatalf("Read = %d, %v", n, err)
			}
			if got := strings.Join(events, ","); tc.doneOnBytes != (got == "first,usage,done <nil>") {
				t.Fatalf("after the last bytes: %s", got)
			}
			if _, err := tap.Read(buf); err != io.EOF {
				t.Fatalf("second Read: %v", err)
			}
			_ = tap.Close()
			if got := strings.Join(events, ","); got != "first,usage,done <nil>" {
				t.Fatalf("at the end: %s", got)
			}
		})
	}
}

// An error answer is read once and put back in OpenAI's envelope, its
// Content-Length matching the new body.
func TestReadErrorAnswer(t *testing.T) {
	resp := &http.Response{StatusCode: 400, Header: http.Header{"Content-Type": {"text/plain"}},
		Body: io.NopCloser(strings.NewReader(`{"object":"error","message":"bad","type":"BadRequestError","code":400}`))}
	if err := ReadErrorAnswer(resp); err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if !strings.HasPrefix(string(body), `{"error":`) || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("body %s, Content-Type %q; want the OpenAI envelope as JSON", body, resp.Header.Get("Content-Type"))
	}
	if resp.ContentLength != int64(len(body)) || resp.Header.Get("Content-Length") != strconv.Itoa(len(body)) {
		t.Errorf("Content-Length %d / %q; want %d", resp.ContentLength, resp.Header.Get("Content-Length"), len(body))
	}
}
