package request

import (
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
			r, err := Parse(Chat, http.Header{}, []byte(tc.body), nil)
			if tc.msg == "" {
				if err != nil || r.textBytes < len(long) {
					t.Fatalf("Parse = %v; want the request", err)
				}
				return
			}
			e, ok := err.(*apierror.Error)
			if !ok || e.Status != http.StatusBadRequest || !strings.Contains(e.Msg, tc.msg) {
				t.Fatalf("Parse error = %v; want a 400 saying %q", err, tc.msg)
			}
		})
	}
}
