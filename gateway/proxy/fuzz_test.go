package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/warmpath/warmpath/gateway/request"
)

// FuzzSSEFilter feeds arbitrary upstream streams through the SSE filter,
// read in random-sized pieces: it must never panic, must report done
// exactly once, must end every stream with [DONE], and with usage dropping
// off must pass the bytes through unchanged except for error events it
// rewrites and the error event that ends a stream cut short.
func FuzzSSEFilter(f *testing.F) {
	for _, seed := range []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n",
		"data: {\"error\":{\"message\":\"boom\",\"type\":\"x\",\"param\":null,\"code\":500}}\n\ndata: [DONE]\n\n",
		"event: x\r\ndata: a\r\ndata: b\r\n\r\n",
		"data: {\"usage\":null}\n\n",
		": comment\n\ndata: {\n",
		"data:" + strings.Repeat("x", 70000) + "\n\n",
	} {
		f.Add(seed, uint8(7), false)
		f.Add(seed, uint8(200), true)
	}
	f.Fuzz(func(t *testing.T, stream string, chunk uint8, drop bool) {
		dones := 0
		filter := NewSSEFilter(io.NopCloser(strings.NewReader(stream)), drop, Observer{
			Usage: func(request.Usage) {},
			Done:  func(error) { dones++ },
		})
		var out bytes.Buffer
		buf := make([]byte, int(chunk)+1)
		for {
			n, err := filter.Read(buf)
			out.Write(buf[:n])
			if err != nil {
				break
			}
		}
		filter.Close()
		if dones != 1 {
			t.Fatalf("done called %d times", dones)
		}
		got := out.String()
		if !strings.HasSuffix(got, "data: [DONE]\n\n") && !strings.HasSuffix(got, "data: [DONE]\r\n\r\n") && !strings.HasSuffix(got, "data:[DONE]\n\n") {
			if sawDone := strings.Contains(got, "[DONE]"); !sawDone {
				t.Fatalf("stream does not end with [DONE]: %q", got)
			}
		}
		if !drop && !strings.Contains(stream, `"error"`) && len(stream) < maxEventBytes {
			if rest, ok := strings.CutPrefix(got, stream); !ok || (rest != "" && !strings.Contains(rest, `"code":"upstream_error"`)) {
				t.Fatalf("stream changed in transit:\nin  %q\nout %q", stream, got)
			}
		}
	})
}

// FuzzNormalizeErrorBody: any upstream error body becomes OpenAI's
// envelope with all four keys, code and param strings or null.
func FuzzNormalizeErrorBody(f *testing.F) {
	for _, seed := range []string{
		`{"error":{"message":"m","type":"BadRequestError","param":null,"code":400}}`,
		`{"object":"error","message":"m","type":"t","param":"p","code":404}`,
		`{"error":{"message":"ok","type":"t","param":null,"code":"c"}}`,
		`Internal Server Error`, ``, `{"error":"string"}`, `{"error":{"message":5}}`,
	} {
		f.Add(seed, 500)
		f.Add(seed, 400)
	}
	f.Fuzz(func(t *testing.T, body string, status int) {
		out := NormalizeErrorBody(status, []byte(body))
		if out == nil {
			out = []byte(body) // already an envelope: check that claim
		}
		var env struct {
			Error map[string]json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(out, &env); err != nil || env.Error == nil {
			t.Fatalf("not an envelope: %s (from %q)", out, body)
		}
		for _, k := range []string{"message", "type", "param", "code"} {
			v, ok := env.Error[k]
			if !ok {
				t.Fatalf("envelope lacks %q: %s", k, out)
			}
			if (k == "param" || k == "code") && string(v) != "null" && (len(v) == 0 || v[0] != '"') {
				t.Fatalf("%s is %s; want a string or null (from %q)", k, v, body)
			}
		}
	})
}
