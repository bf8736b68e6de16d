package gateway

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/warmpath/warmpath/vllmsim"
)

// benchBody is a chat body of about n words in one user message, after a
// short system message, as the overhead benchmark sends.
func benchBody(b *testing.B, n int) []byte {
	b.Helper()
	body, err := json.Marshal(map[string]any{"model": "qwen3-32b", "max_tokens": 8, "messages": []msg{{"system", "be brief"}, {"user", words("bench", n)}}})
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// BenchmarkParseRequest parses a body and renders its text, as a
// non-sticky turn of a sticky policy does, for a short and a 16k-word
// prompt.
func BenchmarkParseRequest(b *testing.B) {
	for _, tc := range []struct {
		name  string
		words int
	}{{"short", 60}, {"16k", 16000}} {
		b.Run(tc.name, func(b *testing.B) {
			body := benchBody(b, tc.words)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				r, err := ParseRequest(APIChat, http.Header{}, body, nil)
				if err != nil {
					b.Fatal(err)
				}
				_ = r.approxText()
				if _, err := r.upstreamBody(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLocalTokens tokenizes a 16k-word prompt in process from the
// parsed request's parts, against the /tokenize body a replica is sent
// (built, then parsed again), as the gateway did before.
func BenchmarkLocalTokens(b *testing.B) {
	r, err := ParseRequest(APIChat, http.Header{}, benchBody(b, 16000), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("parts", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.localTokens(simulatorTokenizer{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("body", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := vllmsim.TokenizeValidBody(r.tokenizeBody()); err != nil {
				b.Fatal(err)
			}
		}
	})
}
