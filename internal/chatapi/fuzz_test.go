package chatapi

import (
	"bytes"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
)

// sseSeeds are upstream streams: FuzzSSEFilter's seeds (gateway/proxy)
// and the shapes the fronts' tests send.
var sseSeeds = []string{
	"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n",
	"data: {\"error\":{\"message\":\"boom\",\"type\":\"x\",\"param\":null,\"code\":500}}\n\ndata: [DONE]\n\n",
	"event: x\r\ndata: a\r\ndata: b\r\n\r\n",
	"data: {\"usage\":null}\n\n",
	": comment\n\ndata: {\n",
	"data:" + strings.Repeat("x", 70000) + "\n\n",
	": comment\n\nevent: x\ndata: a\ndata: b\r\n\r\ndata:c\n\nid: 1\n\ndata: last",
	"data: [DONE]",
	"data:\n\ndata:  [DONE] \r\n",
}

// FuzzReader reads any stream, in one-byte or whole reads, and must
// agree with a line-by-line reading of the SSE rules (reference); it must
// never panic, and after [DONE] it must say ErrDone again.
func FuzzReader(f *testing.F) {
	for _, s := range sseSeeds {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, in string, oneByte bool) {
		var r io.Reader = strings.NewReader(in)
		if oneByte {
			r = iotest.OneByteReader(r)
		}
		er := NewReader(r)
		var got []string
		var err error
		for {
			var d []byte
			if d, err = er.Next(); err != nil {
				break
			}
			got = append(got, string(d))
		}
		want, done := reference(in)
		wantErr := io.EOF
		if done {
			wantErr = ErrDone
		}
		if !errors.Is(err, wantErr) || len(got) != len(want) {
			t.Fatalf("got %d events, %v; want %d, %v", len(got), err, len(want), wantErr)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("event %d = %q; want %q", i, got[i], want[i])
			}
		}
		if done {
			if _, err := er.Next(); !errors.Is(err, ErrDone) {
				t.Fatalf("after [DONE]: %v", err)
			}
		}
	})
}

// reference reads in line by line: the data of each event that has any,
// until [DONE] (done) or the end.
func reference(in string) (events []string, done bool) {
	lines := strings.Split(in, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	var data []string
	end := func() bool {
		if data == nil {
			return false
		}
		d := strings.Join(data, "\n")
		data = nil
		if strings.TrimSpace(d) == "[DONE]" {
			return true
		}
		events = append(events, d)
		return false
	}
	for _, l := range lines {
		l = strings.TrimRight(l, "\r\n")
		if v, ok := strings.CutPrefix(l, "data:"); ok {
			data = append(data, strings.TrimPrefix(v, " "))
		} else if l == "" && end() {
			return events, true
		}
	}
	return events, end()
}

// FuzzWriterReader: what Writer writes, Reader reads back the same,
// payload by payload (a payload is any text without CR that is not
// [DONE]).
func FuzzWriterReader(f *testing.F) {
	f.Add("response.created", `{"a":1}`, "two\nlines")
	f.Add("", "", " leading space")
	f.Fuzz(func(t *testing.T, name, a, b string) {
		if strings.ContainsAny(name, "\r\n") || strings.Contains(a+b, "\r") ||
			strings.TrimSpace(a) == "[DONE]" || strings.TrimSpace(b) == "[DONE]" {
			return
		}
		rec := httptest.NewRecorder()
		sw := NewWriter(rec, "")
		for _, p := range []string{a, b} {
			if err := sw.Event(name, []byte(p)); err != nil {
				t.Fatal(err)
			}
		}
		er := NewReader(bytes.NewReader(rec.Body.Bytes()))
		for _, want := range []string{a, b} {
			got, err := er.Next()
			if err != nil || string(got) != want {
				t.Fatalf("read back %q, %v; want %q (stream %q)", got, err, want, rec.Body.String())
			}
		}
		if _, err := er.Next(); err != io.EOF {
			t.Fatalf("after the events: %v; want EOF", err)
		}
	})
}
