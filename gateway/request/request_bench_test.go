package request

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// benchBody is a chat body of about n words in one user message, after a
// short system message, as the overhead benchmark sends.
func benchBody(b *testing.B, n int) []byte {
	b.Helper()
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	body, err := json.Marshal(map[string]any{"model": "qwen3-32b", "max_tokens": 8, "messages": []msg{{"system", "be brief"}, {"user", benchWords(n)}}})
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// BenchmarkParse parses a body and renders its text, as a
// non-sticky turn of a sticky policy does, for a short and a 16k-word
// prompt.
func BenchmarkParse(b *testing.B) {
	for _, tc := range []struct {
		name  string
		words int
	}{{"short", 60}, {"16k", 16000}} {
		b.Run(tc.name, func(b *testing.B) {
			body := benchBody(b, tc.words)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				r, err := Parse(Chat, http.Header{}, body, nil)
				if err != nil {
					b.Fatal(err)
				}
				_ = r.ApproxText()
				if _, err := r.UpstreamBody(false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchWords is n distinct words, bench0 bench1 …, as the gateway's
// benchmarks send.
func benchWords(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "bench%d", i)
	}
	return b.String()
}
