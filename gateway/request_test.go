package gateway

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/warmpath/warmpath/internal/apierror"
)

// A body large enough to be validated beside its parse gets the same
// answers as a small one: invalid JSON is refused as such whatever the
// parse of it found, valid JSON parses.
func TestParseRequestLargeBody(t *testing.T) {
	long := strings.Repeat("word ", parallelValidateBytes/5+1)
	for _, tc := range []struct {
		name, body, msg string
	}{
		{"valid", `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`, ""},
		{"truncated", `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]`, "not valid JSON"},
		{"bad inside", `{"model":"m","messages":[{"role":"user","content":"` + long + `"}],"x":[1,}`, "not valid JSON"},
		{"no model and invalid", `{"messages":[{"role":"user","content":"` + long + `"}],,}`, "not valid JSON"},
		{"no model", `{"messages":[{"role":"user","content":"` + long + `"}]}`, "model parameter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseRequest(APIChat, http.Header{}, []byte(tc.body), nil)
			if tc.msg == "" {
				if err != nil || r.textBytes < len(long) {
					t.Fatalf("ParseRequest = %v; want the request", err)
				}
				return
			}
			e, ok := err.(*apierror.Error)
			if !ok || e.Status != http.StatusBadRequest || !strings.Contains(e.Msg, tc.msg) {
				t.Fatalf("ParseRequest error = %v; want a 400 saying %q", err, tc.msg)
			}
		})
	}
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
			tap := &jsonTap{src: io.NopCloser(struct{ io.Reader }{strings.NewReader(body)}), left: tc.length, obs: observer{
				firstByte: func() { events = append(events, "first") },
				usage: func(u Usage) {
					events = append(events, "usage")
					if u.PromptTokens != 3 || u.CachedTokens != 2 {
						t.Errorf("usage %+v", u)
					}
				},
				done: func(err error) { events = append(events, fmt.Sprint("done ", err)) },
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
