package responses

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/nodeclients"

	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/vllmsim"
)

// recorder keeps every request body the handler saw.
type recorder struct {
	next http.Handler

	mu     sync.Mutex // guards bodies, header
	bodies [][]byte
	header []http.Header
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	if r.Method == http.MethodPost && r.URL.Path == "/v1/responses" {
		rc.bodies = append(rc.bodies, b)
		rc.header = append(rc.header, r.Header.Clone())
	}
	rc.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(b))
	rc.next.ServeHTTP(w, r)
}

// sent reports whether any recorded body matches the gjson path.
func (rc *recorder) sent(path string) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, b := range rc.bodies {
		if gjson.GetBytes(b, path).Exists() {
			return true
		}
	}
	return false
}

// nodeClients finds node and the installed npm clients.
func nodeClients(t *testing.T) (node, dir string) { return nodeclients.Find(t, "..") }

// TestNodeClients runs each real Node client against the Responses API
// served over HTTP in front of a two-replica simulated fleet, then checks
// what the client sent: the feature each one is known for must have
// reached the server.
func TestNodeClients(t *testing.T) {
	node, dir := nodeClients(t)
	cases := []struct {
		script string
		sent   []string // gjson paths some request body must match
	}{
		{"openai.mjs", []string{"previous_response_id", "stream"}},
		{"agents.mjs", []string{"previous_response_id", "input.#(type==\"function_call_output\")", "tools.0.name"}},
		{"langchain.mjs", []string{"previous_response_id", "input.#(type==\"function_call_output\")", "tools.0.name"}},
		{"aisdk.mjs", []string{"input.#(type==\"item_reference\")", "input.#(type==\"function_call_output\")", "input.#(role==\"system\")"}},
		{"codex.mjs", []string{"input.#(type==\"function_call_output\")", "input.#(role==\"developer\")", "prompt_cache_key", "tools.#(type==\"namespace\")", "tools.#(type==\"web_search\")", "include"}},
	}
	for _, c := range cases {
		t.Run(strings.TrimSuffix(c.script, ".mjs"), func(t *testing.T) {
			e := newEnvStopped(t, single(t), vllmsim.Config{Replicas: 2})
			rc := &recorder{}
			e.wrap = func(h http.Handler) http.Handler { rc.next = h; return rc }
			e.start(t, e.chat)
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, c.script)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "OPENAI_BASE_URL="+e.url+"/v1", "OPENAI_API_KEY=sk-test",
				"WARMPATH_MODEL="+vllmsim.DefaultModel, "OPENAI_AGENTS_DISABLE_TRACING=1")
			out, err := cmd.CombinedOutput()
			t.Logf("%s:\n%s", c.script, out)
			if err != nil {
				t.Fatalf("%s: %v", c.script, err)
			}
			for _, p := range c.sent {
				if !rc.sent(p) {
					t.Errorf("no request matched %s", p)
				}
			}
			if c.script == "codex.mjs" {
				checkCodexSticky(t, e, rc)
			}
		})
	}
}

// checkCodexSticky: Codex sends store:false with its full history every
// turn; its turns must all carry one session key (its prompt_cache_key),
// so they stay on one replica.
func checkCodexSticky(t *testing.T, e *env, rc *recorder) {
	t.Helper()
	if !rc.sent(`store`) || gjson.GetBytes(rc.bodies[0], "store").Bool() {
		t.Errorf("codex did not send store:false")
	}
	turns := e.chat.recorded()
	if len(turns) < 2 {
		t.Fatalf("%d upstream turns; want at least 2 (tool call, then answer)", len(turns))
	}
	for i, tr := range turns {
		if tr.Session == "" || tr.Session != turns[0].Session || !strings.HasPrefix(tr.Session, "k:") {
			t.Fatalf("turn %d session %q; want every turn on %q", i, tr.Session, turns[0].Session)
		}
	}
	e.chat.mu.Lock()
	replicas := len(e.chat.bound)
	e.chat.mu.Unlock()
	if replicas != 1 {
		t.Fatalf("codex turns used %d session bindings; want 1", replicas)
	}
}
