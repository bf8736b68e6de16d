package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/vllmsim"
)

// FuzzParseRequest feeds client bodies to the request parser: it must never
// panic, and what it accepts must yield a valid upstream body and bodies
// for the tokenizer that are JSON.
func FuzzParseRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"x"}]}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
		`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],"session_id":"s","user":"u"}`,
		`{"model":"m","prompt":"once upon"}`,
		`{"model":"m","prompt":[1,2,3]}`,
		`{"model":"m","prompt":[[1,2],[3]]}`,
		`{"model":"m","prompt":["a","b"],"cache_salt":"x"}`,
		`{"model":1}`, `[]`, `{`, ``, `{"model":"m","messages":[{}]}`,
		`{"model":"m","model":"n","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"a","role":"system","content":[{"text":"b"}]}],"priority":3,"session_id":"s"}`,
		`{"mod\u0065l":"m","messages":[{"r\u006fle":"user","content":"h\u00e9"}]}`,
	} {
		f.Add(seed, true)
		f.Add(seed, false)
	}
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		kind := APICompletions
		if chat {
			kind = APIChat
		}
		// Large bodies are parsed while they are validated: the parse
		// must survive invalid JSON.
		_, _ = parseFields(kind, http.Header{}, []byte(body), nil)
		r, err := ParseRequest(kind, http.Header{}, []byte(body), nil)
		if err != nil {
			if _, ok := err.(*apierror.Error); !ok {
				t.Fatalf("parse error is not an httpError: %T %v", err, err)
			}
			return
		}
		ub, err := r.upstreamBody()
		if err != nil {
			t.Fatalf("accepted body has no upstream form: %v", err)
		}
		if !json.Valid(ub) {
			t.Fatalf("upstream body is not JSON: %s", ub)
		}
		checkUpstreamFields(t, r, ub)
		// The in-process tokenizer reads the parsed request; a replica
		// reads tokenizeBody's body: the same ids, or both refuse.
		if tb := r.tokenizeBody(); tb != nil {
			ids, err := r.localTokens(simulatorTokenizer{})
			want, werr := vllmsim.TokenizeBody(tb)
			if (err == nil) != (werr == nil) || !slices.Equal(ids, want) {
				t.Fatalf("in process %v, %v; from the body %v, %v", ids, err, want, werr)
			}
		}
		if tb := r.tokenizeBody(); tb != nil && !json.Valid(tb) {
			t.Fatalf("tokenize body is not JSON: %s", tb)
		}
		// The text rendered while scanning the messages is what a render
		// of the parsed messages gives.
		if got, want := r.approxText(), renderTextSlow(r); !bytes.Equal(got, want) {
			t.Fatalf("scanned text %q; rendered %q", got, want)
		}
		_, _ = r.promptTokenIDs()
		if r.estimatedTokens() < 1 {
			t.Fatal("estimate below 1")
		}
	})
}

// checkUpstreamFields checks that the upstream body ub carries what the
// gateway adds (session_id, include_usage for a stream, an isolated
// tenant's cache_salt) and the client's other top-level fields unchanged.
func checkUpstreamFields(t *testing.T, r *Request, ub []byte) {
	t.Helper()
	up := gjson.ParseBytes(ub)
	if r.session.Value != "" && !r.top.sessionID && up.Get("session_id").String() != r.session.Value {
		t.Fatalf("session_id %q, want %q: %s", up.Get("session_id").String(), r.session.Value, ub)
	}
	if r.stream && !up.Get("stream_options.include_usage").Bool() {
		t.Fatalf("a stream's include_usage is not set: %s", ub)
	}
	if r.cacheSalt != "" && up.Get("cache_salt").String() != r.cacheSalt {
		t.Fatalf("cache_salt %q, want %q: %s", up.Get("cache_salt").String(), r.cacheSalt, ub)
	}
	seen := map[string]bool{}
	gjson.ParseBytes(r.body).ForEach(func(k, v gjson.Result) bool {
		first := !seen[k.Raw]
		seen[k.Raw] = true
		switch k.String() {
		case "session_id", "stream_options", "cache_salt":
		default:
			// Keys written with escapes are left to Get's own rules.
			if got := up.Get(gjson.Escape(k.String())); first && `"`+k.String()+`"` == k.Raw && got.Raw != v.Raw {
				t.Fatalf("field %s: %s upstream, %s sent", k.Raw, got.Raw, v.Raw)
			}
		}
		return true
	})
}

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
		filter := newSSEFilter(io.NopCloser(strings.NewReader(stream)), drop, observer{
			usage: func(Usage) {},
			done:  func(error) { dones++ },
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
		out := normalizeErrorBody(status, []byte(body))
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

// renderTextSlow is approxText as it was before the one-pass scan: a
// gjson Get per field. FuzzParseRequest checks the scan against it.
func renderTextSlow(r *Request) []byte {
	if r.api != APIChat {
		return r.renderText()
	}
	b := []byte{}
	if r.tools.IsArray() {
		b = append(b, "tools\x00"...)
		b = append(b, r.tools.Raw...)
		b = append(b, 0)
	}
	r.messages.ForEach(func(_, msg gjson.Result) bool {
		b = append(b, msg.Get("role").String()...)
		b = append(b, 0)
		c := msg.Get("content")
		if c.Type == gjson.String {
			b = append(b, c.String()...)
		} else {
			c.ForEach(func(_, part gjson.Result) bool {
				b = append(b, part.Get("text").String()...)
				return true
			})
		}
		if tc := msg.Get("tool_calls"); tc.Exists() {
			b = append(b, strings.TrimSpace(tc.Raw)...)
		}
		b = append(b, 0)
		return true
	})
	return b
}
