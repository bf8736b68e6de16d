package request

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/tokenizer/simtok"
)

// simTokenizer is the simulator's /tokenize code, as an in-process
// Tokenizer.
type simTokenizer struct{}

func (simTokenizer) Chat(_, messages, tools string) ([]uint32, error) {
	return simtok.TokenizeChatJSON(messages, tools)
}

func (simTokenizer) Prompt(_, text string) ([]uint32, error) {
	return simtok.TokenizePrompt(text), nil
}

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
		kind := Completions
		if chat {
			kind = Chat
		}
		// Large bodies are parsed while they are validated: the parse
		// must survive invalid JSON.
		_, _ = parseFields(kind, http.Header{}, []byte(body), nil)
		r, err := Parse(kind, http.Header{}, []byte(body), nil)
		if err != nil {
			if _, ok := err.(*apierror.Error); !ok {
				t.Fatalf("parse error is not an httpError: %T %v", err, err)
			}
			return
		}
		ub, err := r.UpstreamBody(false)
		if err != nil {
			t.Fatalf("accepted body has no upstream form: %v", err)
		}
		if !json.Valid(ub) {
			t.Fatalf("upstream body is not JSON: %s", ub)
		}
		checkUpstreamFields(t, r, ub)
		// The in-process tokenizer reads the parsed request; a replica
		// reads tokenizeBody's body: the same ids, or both refuse.
		if tb := r.TokenizeBody(); tb != nil {
			ids, err := r.LocalTokens(simTokenizer{})
			want, werr := simtok.TokenizeBody(tb)
			if (err == nil) != (werr == nil) || !slices.Equal(ids, want) {
				t.Fatalf("in process %v, %v; from the body %v, %v", ids, err, want, werr)
			}
		}
		if tb := r.TokenizeBody(); tb != nil && !json.Valid(tb) {
			t.Fatalf("tokenize body is not JSON: %s", tb)
		}
		// The text rendered while scanning the messages is what a render
		// of the parsed messages gives.
		if got, want := r.ApproxText(), renderTextSlow(r); !bytes.Equal(got, want) {
			t.Fatalf("scanned text %q; rendered %q", got, want)
		}
		_, _ = r.PromptTokenIDs()
		if r.EstimatedTokens(0) < 1 {
			t.Fatal("estimate below 1")
		}
	})
}

// checkUpstreamFields checks that the upstream body ub carries what the
// gateway adds (session_id, include_usage for a stream, an isolated
// tenant's cache_salt) and the client's other top-level fields unchanged.
func checkUpstreamFields(t *testing.T, r *R, ub []byte) {
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
		case "priority":
			// Only the gateway chooses it (classBody), and without
			// vllm_priority it sets none.
			if up.Get("priority").Exists() {
				t.Fatalf("the client's priority reached the replica: %s", ub)
			}
		default:
			// Keys written with escapes are left to Get's own rules.
			if got := up.Get(gjson.Escape(k.String())); first && `"`+k.String()+`"` == k.Raw && got.Raw != v.Raw {
				t.Fatalf("field %s: %s upstream, %s sent", k.Raw, got.Raw, v.Raw)
			}
		}
		return true
	})
}

// renderTextSlow is ApproxText as it was before the one-pass scan: a
// gjson Get per field. FuzzParseRequest checks the scan against it.
func renderTextSlow(r *R) []byte {
	if r.api != Chat {
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
