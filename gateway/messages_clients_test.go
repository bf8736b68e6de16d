package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/nodeclients"

	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/vllmsim"
)

// nodeClients finds node and the installed npm clients.
func nodeClients(t *testing.T) (node, dir string) { return nodeclients.Find(t, "..") }

// The @anthropic-ai/sdk client (clients/anthropic.mjs) against the full
// gateway with API keys: create, a raw stream's event sequence, a tool-use
// loop through the beta client, count_tokens, typed errors.
func TestAnthropicSDK(t *testing.T) {
	node, dir := nodeClients(t)
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := tenantConfig(sim)
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	key := newTenant(t, gw.URL, "sdk", "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "anthropic.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "ANTHROPIC_BASE_URL="+gw.URL, "ANTHROPIC_API_KEY="+key,
		"OPENAI_BASE_URL="+gw.URL+"/v1", "WARMPATH_MODEL="+vllmsim.DefaultModel)
	out, err := cmd.CombinedOutput()
	t.Logf("anthropic.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("anthropic.mjs: %v", err)
	}
}

// turnRecord is what the recording proxy saw of one /v1/messages request.
type turnRecord struct {
	session, agent       string
	replica, reason      string
	predicted            int
	input, cacheRead     int
	status               int
	stream, sawToolUse   bool
	sawToolResult, error bool
}

// recordingProxy forwards to the gateway and records each Messages turn:
// the routing headers of the answer (the gateway runs with Debug) and the
// usage its message_delta (or Message) reports.
type recordingProxy struct {
	proxy *httputil.ReverseProxy

	mu    sync.Mutex // guards turns
	turns []turnRecord
}

// newRecordingProxy serves a recordingProxy to target; it returns the
// proxy's URL.
func newRecordingProxy(t *testing.T, target string) (string, *recordingProxy) {
	u, _ := url.Parse(target)
	rp := &recordingProxy{proxy: httputil.NewSingleHostReverseProxy(u)}
	rp.proxy.FlushInterval = -1
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return srv.URL, rp
}

type captureWriter struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (c *captureWriter) WriteHeader(code int) { c.status = code; c.ResponseWriter.WriteHeader(code) }
func (c *captureWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.body.Write(b)
	return c.ResponseWriter.Write(b)
}
func (c *captureWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

func (rp *recordingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var reqBody bytes.Buffer
	if r.Body != nil {
		_, _ = reqBody.ReadFrom(r.Body)
		r.Body.Close()
		r.Body = io.NopCloser(&reqBody)
	}
	raw := append([]byte(nil), reqBody.Bytes()...)
	cw := &captureWriter{ResponseWriter: w}
	rp.proxy.ServeHTTP(cw, r)
	if r.URL.Path != "/v1/messages" {
		return
	}
	h := cw.Header()
	rec := turnRecord{session: r.Header.Get("X-Claude-Code-Session-Id"), agent: r.Header.Get("X-Claude-Code-Agent-Id"),
		replica: h.Get("X-Warmpath-Replica"), reason: h.Get("X-Warmpath-Reason"), status: cw.status,
		stream: gjson.GetBytes(raw, "stream").Bool()}
	rec.predicted, _ = strconv.Atoi(h.Get("X-Warmpath-Predicted-Cached"))
	rec.sawToolResult = bytes.Contains(raw, []byte(`"tool_result"`))
	usage := gjson.GetBytes(cw.body.Bytes(), "usage")
	for _, frame := range strings.Split(cw.body.String(), "\n\n") {
		_, data, _ := strings.Cut(frame, "data: ")
		switch gjson.Get(data, "type").String() {
		case "message_delta":
			usage = gjson.Get(data, "usage")
		case "content_block_start":
			rec.sawToolUse = rec.sawToolUse || gjson.Get(data, "content_block.type").String() == "tool_use"
		case "error":
			rec.error = true
		}
	}
	rec.input, rec.cacheRead = int(usage.Get("input_tokens").Int()), int(usage.Get("cache_read_input_tokens").Int())
	rp.mu.Lock()
	rp.turns = append(rp.turns, rec)
	rp.mu.Unlock()
}

func (rp *recordingProxy) recorded() []turnRecord {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	return append([]turnRecord(nil), rp.turns...)
}

// claudeResult is claude -p --output-format json's answer.
type claudeResult struct {
	Type     string `json:"type"`
	Subtype  string `json:"subtype"`
	IsError  bool   `json:"is_error"`
	NumTurns int    `json:"num_turns"`
	Result   string `json:"result"`
	Session  string `json:"session_id"`
}

// The real Claude Code CLI (clients/node_modules/.bin/claude, pinned in
// clients/package.json), run non-interactively against the full gateway
// (API keys, two replicas) with a scratch HOME and telemetry, update
// checks and nonessential traffic off: ten prompts of one session (the
// first with --session-id, the others with --resume), each asking for a
// tool it may run. Each exits 0 with a reply after a tool round trip; all
// twenty turns stay on one replica, sticky after the first, each predicted
// within a block of the cached tokens the replica reports. The cached
// fraction is logged.
func TestClaudeCodeCLI(t *testing.T) {
	node, dir := nodeClients(t)
	claude := claudeCommand(t, node, dir)
	sim := startSim(t, vllmsim.Config{Replicas: 2})
	cfg := tenantConfig(sim)
	rdb := redisFor(t, &cfg)
	gw := startGateway(t, cfg, rdb)
	key := newTenant(t, gw.URL, "claude-code", "")
	proxyURL, rec := newRecordingProxy(t, gw.URL)

	home, work := t.TempDir(), t.TempDir()
	for _, f := range []string{"main.go", "util.go", "README.md"} {
		if err := os.WriteFile(filepath.Join(work, f), []byte("package main // main\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "TERM=dumb",
		"ANTHROPIC_BASE_URL=" + proxyURL, "ANTHROPIC_AUTH_TOKEN=" + key,
		"ANTHROPIC_MODEL=" + vllmsim.DefaultModel, "ANTHROPIC_SMALL_FAST_MODEL=" + vllmsim.DefaultModel,
		"ANTHROPIC_DEFAULT_HAIKU_MODEL=" + vllmsim.DefaultModel, "ANTHROPIC_DEFAULT_SONNET_MODEL=" + vllmsim.DefaultModel,
		"ANTHROPIC_DEFAULT_OPUS_MODEL=" + vllmsim.DefaultModel,
		"DISABLE_TELEMETRY=1", "DISABLE_AUTOUPDATER=1", "DISABLE_ERROR_REPORTING=1", "DISABLE_BUG_COMMAND=1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY=0"}
	const session = "4b1f3c2e-9a7d-4e5f-8c6b-1d2e3f4a5b6c"
	// Ten prompts of one session, twenty turns: each prompt is a tool call
	// and the answer after its result.
	asks := []string{"Use the Glob tool to find the Go files.", "Now use the Grep tool to search for main.", "Use the Read tool on the first file."}
	type ask struct{ prompt, flag string }
	var prompts []ask
	for i := range 10 {
		flag := "--resume"
		if i == 0 {
			flag = "--session-id"
		}
		prompts = append(prompts, ask{asks[i%len(asks)], flag})
	}
	for i, p := range prompts {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		args := append(slices.Clone(claude[1:]), "-p", p.prompt, "--output-format", "json", "--allowedTools", "Glob Grep Read", p.flag, session)
		cmd := exec.CommandContext(ctx, claude[0], args...)
		cmd.Dir, cmd.Env = work, env
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		cancel()
		if err != nil {
			t.Fatalf("claude -p (prompt %d): %v\nstdout: %s\nstderr: %s", i+1, err, stdout.Bytes(), stderr.Bytes())
		}
		var res claudeResult
		if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
			t.Fatalf("prompt %d: output is not claude's JSON result: %v: %s", i+1, err, stdout.Bytes())
		}
		t.Logf("prompt %d: %s, %d turns: %.80q", i+1, res.Subtype, res.NumTurns, res.Result)
		if res.Type != "result" || res.Subtype != "success" || res.IsError || res.Result == "" || res.Session != session {
			t.Errorf("prompt %d: result %+v", i+1, res)
		}
		if res.NumTurns < 2 {
			t.Errorf("prompt %d: %d turns; want a tool round trip", i+1, res.NumTurns)
		}
	}
	checkClaudeCodeTurns(t, rec.recorded(), session, cfg.Routing.BlockSize)
}

// claudeCommand is the command line that runs the installed Claude Code:
// its native binary, which npm's postinstall puts in place, or, where the
// install ran without scripts, the package's own wrapper that finds the
// platform binary.
func claudeCommand(t *testing.T, node, dir string) []string {
	t.Helper()
	pkg := filepath.Join(dir, "node_modules", "@anthropic-ai", "claude-code")
	for _, cmd := range [][]string{{filepath.Join(pkg, "bin", "claude.exe")}, {node, filepath.Join(pkg, "cli-wrapper.cjs")}} {
		out, err := exec.Command(cmd[0], append(cmd[1:], "--version")...).Output()
		if err == nil && bytes.Contains(out, []byte("Claude Code")) {
			t.Logf("claude: %s (%s)", strings.TrimSpace(string(out)), cmd[len(cmd)-1])
			return cmd
		}
	}
	t.Fatalf("Claude Code is not installed in %s (npm ci --prefix clients)", pkg)
	return nil
}

func checkClaudeCodeTurns(t *testing.T, turns []turnRecord, session string, block int) {
	t.Helper()
	if len(turns) < 2*10 {
		t.Fatalf("%d Messages requests; want at least two per prompt", len(turns))
	}
	var prompt, cached int
	var toolUse, toolResult bool
	home := turns[0].replica
	for i, r := range turns {
		t.Logf("turn %d: %s %-6s stream %-5v prompt %6d cached %6d predicted %6d", i+1, r.replica, r.reason, r.stream, r.input+r.cacheRead, r.cacheRead, r.predicted)
		if r.status != http.StatusOK || r.error {
			t.Errorf("turn %d: status %d, error event %v", i+1, r.status, r.error)
		}
		if r.session != session || r.agent != "" {
			t.Errorf("turn %d: session %q agent %q; want the main conversation of %s", i+1, r.session, r.agent, session)
		}
		if i > 0 {
			if r.replica != home || r.reason != scoring.ReasonSticky {
				t.Errorf("turn %d: %s (%s); the session is on %s", i+1, r.replica, r.reason, home)
			}
			if d := r.predicted - r.cacheRead; d < -block || d > block {
				t.Errorf("turn %d: predicted %d cached tokens; the replica reported %d", i+1, r.predicted, r.cacheRead)
			}
		}
		prompt, cached = prompt+r.input+r.cacheRead, cached+r.cacheRead
		toolUse, toolResult = toolUse || r.sawToolUse, toolResult || r.sawToolResult
	}
	if !toolUse || !toolResult {
		t.Errorf("tool_use answered %v, tool_result sent %v; want a round trip", toolUse, toolResult)
	}
	frac := float64(cached) / float64(prompt)
	t.Logf("Claude Code, %d turns: cached %d of %d prompt tokens (%.1f%%)", len(turns), cached, prompt, 100*frac)
	if frac < 0.9 {
		t.Errorf("cached fraction %.3f; want above 0.9", frac)
	}
}
