package deploy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/warmpath/warmpath/gateway"
	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/internal/redistest"
	"github.com/warmpath/warmpath/vllmsim"
)

// gettingStartedRecipe returns the real-vLLM recipe of docs/getting-started.md
// (moved there from the README): the first sh block with a `vllm serve`
// line in "Running against a real vLLM fleet", and the first yaml block
// after it (the gateway's configuration).
func gettingStartedRecipe(t *testing.T) (serve, config string) {
	t.Helper()
	readme := mustRead(t, "../docs/getting-started.md")
	const heading = "\n## Running against a real vLLM fleet\n"
	i := strings.Index(readme, heading)
	if i < 0 {
		t.Fatal("docs/getting-started.md has no \"Running against a real vLLM fleet\" section")
	}
	sec := readme[i+len(heading):]
	if j := strings.Index(sec, "\n## "); j >= 0 {
		sec = sec[:j]
	}
	block := func(lang, after string) (string, string) {
		for {
			k := strings.Index(after, "```"+lang+"\n")
			if k < 0 {
				return "", ""
			}
			body := after[k+len(lang)+4:]
			end := strings.Index(body, "\n```")
			if end < 0 {
				t.Fatalf("unterminated %s block in the recipe", lang)
			}
			if lang != "sh" || strings.Contains(body[:end], "vllm serve") {
				return body[:end+1], body[end+4:]
			}
			after = body[end+4:]
		}
	}
	serve, rest := block("sh", sec)
	config, _ = block("yaml", rest)
	if serve == "" || config == "" {
		t.Fatal("the recipe needs a ```sh block with vllm serve and a ```yaml block after it")
	}
	return serve, config
}

// shellWords splits a POSIX shell command line as sh would: backslash
// continuations, single quotes (literal), double quotes and bare words
// (with $VAR and ${VAR} expanded from env), backslash escapes. It handles
// one simple command; operators such as | or ; are errors.
func shellWords(s string, env map[string]string) ([]string, error) {
	s = strings.ReplaceAll(s, "\\\n", " ")
	var words []string
	var w strings.Builder
	inWord := false
	expand := func(i int) (int, error) { // s[i] == '$'
		j := i + 1
		if j < len(s) && s[j] == '{' {
			k := strings.IndexByte(s[j:], '}')
			if k < 0 {
				return 0, fmt.Errorf("unterminated ${ at %d", i)
			}
			w.WriteString(env[s[j+1:j+k]])
			return j + k + 1, nil
		}
		for j < len(s) && (s[j] == '_' || 'A' <= s[j] && s[j] <= 'Z' || 'a' <= s[j] && s[j] <= 'z' || '0' <= s[j] && s[j] <= '9') {
			j++
		}
		if j == i+1 {
			w.WriteByte('$')
			return j, nil
		}
		w.WriteString(env[s[i+1:j]])
		return j, nil
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			if inWord {
				words, inWord = append(words, w.String()), false
				w.Reset()
			}
			i++
			continue
		case strings.IndexByte("|;&<>()`", c) >= 0:
			return nil, fmt.Errorf("shell operator %q at %d", c, i)
		}
		inWord = true
		switch c {
		case '\'':
			k := strings.IndexByte(s[i+1:], '\'')
			if k < 0 {
				return nil, fmt.Errorf("unterminated ' at %d", i)
			}
			w.WriteString(s[i+1 : i+1+k])
			i += k + 2
		case '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				switch {
				case s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`", s[i+1]) >= 0:
					i++
					w.WriteByte(s[i])
				case s[i] == '$':
					j, err := expand(i)
					if err != nil {
						return nil, err
					}
					i = j - 1
				default:
					w.WriteByte(s[i])
				}
			}
			if i >= len(s) {
				return nil, fmt.Errorf("unterminated \"")
			}
			i++
		case '\\':
			if i+1 < len(s) {
				w.WriteByte(s[i+1])
			}
			i += 2
		case '$':
			j, err := expand(i)
			if err != nil {
				return nil, err
			}
			i = j
		default:
			w.WriteByte(c)
			i++
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

func TestShellWords(t *testing.T) {
	got, err := shellWords("vllm serve m \\\n  --x 'a b' \"c $V ${V}\" d$V'\"'e\\ f '{\"t\":\"kv@'\"$V\"':1\"}'", map[string]string{"V": "v"})
	want := []string{"vllm", "serve", "m", "--x", "a b", "c v v", `dv"e f`, `{"t":"kv@v:1"}`}
	if err != nil || strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("got %q, %v; want %q", got, err, want)
	}
	for _, bad := range []string{"a 'b", `a "b`, "a | b", "a ${B"} {
		if _, err := shellWords(bad, nil); err == nil {
			t.Errorf("%q split without error", bad)
		}
	}
}

// podIP stands in for the replica's address in the recipe's topic.
const podIP = "10.0.0.7"

// The getting-started recipe is consistent (the vLLM flags warmpath needs, the
// ports and the model id on both sides), and its gateway configuration,
// pointed at a simulated fleet serving the model id that `vllm serve` line
// serves, answers a chat completion and receives KV events. Served under
// the model path instead, as vLLM without --served-model-name would, the
// same configuration fails and the gateway says why.
func TestGettingStartedRecipe(t *testing.T) {
	serve, config := gettingStartedRecipe(t)
	words, err := shellWords(serve, map[string]string{"POD_IP": podIP})
	if err != nil {
		t.Fatalf("vllm serve line: %v", err)
	}
	if len(words) < 3 || words[0] != "vllm" || words[1] != "serve" {
		t.Fatalf("the sh block runs %q; want vllm serve MODEL …", words)
	}
	v, err := parseVLLMServe(words[2:])
	if err != nil {
		t.Fatal(err)
	}
	ports := checkVLLMServe(t, "getting-started recipe", v)

	path := filepath.Join(t.TempDir(), "warmpath.yaml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	// The secrets the recipe says come from the environment.
	env := map[string]string{"WARMPATH_ADMIN_KEY": "admin-key-from-the-environment", "WARMPATH_SALT_SECRET": "salt-secret-from-the-environment"}
	cfg, err := gateway.LoadConfig(path, func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("recipe configuration: %v", err)
	}
	if err := cfg.Check(); err != nil {
		t.Fatalf("recipe configuration: %v", err)
	}
	if len(cfg.Replicas) == 0 {
		t.Fatal("the recipe configuration lists no replicas")
	}
	for i, r := range cfg.Replicas {
		u, err := url.Parse(r.URL)
		if err != nil {
			t.Fatal(err)
		}
		host := u.Hostname()
		want := fleet.ReplicaSpec{
			URL:            fmt.Sprintf("http://%s:%d", host, ports.HTTP),
			Model:          v.ModelID(),
			KVEndpoint:     fmt.Sprintf("tcp://%s:%d", host, ports.KV),
			ReplayEndpoint: fmt.Sprintf("tcp://%s:%d", host, ports.Replay),
		}
		if r != want {
			t.Errorf("replicas[%d] = %+v; the vllm serve line serves %+v", i, r, want)
		}
	}
	kc, _ := v.flag("kv-events-config")
	if want := fmt.Sprintf("kv@%s:%d@", podIP, ports.HTTP); !strings.Contains(kc, want) {
		t.Errorf("the topic in %s does not name the replica as the gateway does (%s…)", kc, want)
	}
	if t.Failed() {
		return
	}

	t.Run("served under the configured id", func(t *testing.T) {
		r := serveRecipe(t, cfg, v.ModelID())
		if r.status != http.StatusOK || !strings.Contains(r.body, `"chat.completion"`) {
			t.Fatalf("chat completion: %d %s", r.status, r.body)
		}
		if r.warned {
			t.Errorf("the gateway warned about the model:\n%s", r.logs)
		}
	})
	t.Run("served under the model path", func(t *testing.T) {
		if v.ModelID() == v.Model {
			t.Skip("the recipe serves the model under its path")
		}
		r := serveRecipe(t, cfg, v.Model)
		if r.status != http.StatusNotFound {
			t.Errorf("chat completion: %d %s; want the replica's 404", r.status, r.body)
		}
		if !r.warned {
			t.Errorf("the gateway did not warn that the replica does not serve %q:\n%s", cfg.Replicas[0].Model, r.logs)
		}
	})
}

// recipeResult is what serving the recipe produced.
type recipeResult struct {
	status int
	body   string
	warned bool // "does not serve the configured model" was logged
	logs   string
}

// serveRecipe runs cfg's shape against a simulated fleet serving model:
// the same replicas (addresses swapped for the simulator's), Redis the test
// server, everything else as configured. It sends one chat completion for
// the configured model; when it succeeds, it also waits for the replicas'
// KV events to reach the gateway.
func serveRecipe(t *testing.T, cfg gateway.Config, model string) recipeResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sim, err := vllmsim.NewFleet(vllmsim.Config{Replicas: len(cfg.Replicas), Model: model, Speed: 50, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range sim.Replicas() {
		in := r.Info()
		cfg.Replicas[i].URL, cfg.Replicas[i].KVEndpoint, cfg.Replicas[i].ReplayEndpoint = in.URL, in.KVEndpoint, in.ReplayEndpoint
	}
	_, prefix := redistest.Client(t)
	cfg.Listen = "127.0.0.1:0"
	cfg.Redis = gateway.RedisConfig{URL: "redis://" + redistest.Addr(t) + "/0", KeyPrefix: prefix}
	cfg.DevKey = "sk-recipe-test-key" // a tenant's key: imported as the dev tenant's
	logs := &lockedBuffer{}
	gw, err := gateway.New(cfg, gateway.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatalf("gateway.New: %v", err)
	}
	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return sim.Run(ctx) })
	eg.Go(func() error { return gw.Run(ctx) })
	defer func() {
		cancel()
		if err := eg.Wait(); err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	if err := gw.WaitReady(ctx); err != nil {
		t.Fatalf("gateway not ready: %v", err)
	}

	// A prompt of many full KV blocks (the simulator's tokens are words),
	// so the replica publishes BlockStored events for it.
	prompt := strings.Repeat("the README recipe serves this prompt ", 40)
	body := fmt.Sprintf(`{"model":%q,"max_tokens":8,"messages":[{"role":"user","content":%q}]}`, cfg.Replicas[0].Model, prompt)
	chat := func() recipeResult {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+gw.Addr()+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+cfg.DevKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return recipeResult{status: resp.StatusCode, body: string(b)}
	}
	res := chat()

	const warning = "does not serve the configured model"
	deadline := time.Now().Add(30 * time.Second)
	for i := 1; ; i++ {
		res.logs = logs.String()
		res.warned = strings.Contains(res.logs, warning)
		done := res.warned // the mismatch is reported once a replica is healthy
		if res.status == http.StatusOK {
			done = kvEvents(t, gw) > 0
		}
		if done {
			return res
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: status %d, %.0f KV events, warned %v", res.status, kvEvents(t, gw), res.warned)
		}
		time.Sleep(20 * time.Millisecond)
		if res.status == http.StatusOK && i%25 == 0 {
			// A subscriber that connected after the replica published
			// its first batch sees the next one's sequence number and
			// asks for a replay: send another turn every half second.
			if r := chat(); r.status != http.StatusOK {
				t.Fatalf("a later chat completion: %d %s", r.status, r.body)
			}
		}
	}
}

// kvEvents sums warmpath_kvevents_events_total on gw's registry.
func kvEvents(t *testing.T, gw *gateway.Gateway) float64 {
	t.Helper()
	mfs, err := gw.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "warmpath_kvevents_events_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// lockedBuffer is an io.Writer safe for concurrent use, for logs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer // guarded by mu
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
