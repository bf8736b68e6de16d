package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// buildBinary builds this command once per test binary.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "warmpath")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// `warmpath serve` with no configuration starts on embedded defaults,
// prints a dev key and a curl line, and answers that curl line and the
// official Go client, streaming and not.
func TestServeEmbedded(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "serve", "--listen", "127.0.0.1:0", "--log-level", "warn")
	cmd.Env = append(os.Environ(), "WARMPATH_DEV_KEY=", "WARMPATH_CONFIG=", "WARMPATH_SIM_SPEED=20")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve did not exit cleanly on SIGINT: %v", err)
			}
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			t.Error("serve did not exit within 20s of SIGINT")
		}
	}()

	var base, key, adminKey, curl string
	sc := bufio.NewScanner(stdout)
	for curl == "" && sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if m := regexp.MustCompile(`on (http://\S+)/v1`).FindStringSubmatch(line); m != nil {
			base = m[1]
		}
		if k, ok := strings.CutPrefix(line, "warmpath: dev API key: "); ok {
			key = k
		}
		if m := regexp.MustCompile(`^warmpath: admin key: (\S+) `).FindStringSubmatch(line); m != nil {
			adminKey = m[1]
		}
		if strings.HasPrefix(line, "curl ") {
			curl = line
		}
	}
	go func() { // keep draining so the process never blocks on stdout
		for sc.Scan() {
		}
	}()
	if base == "" || !strings.HasPrefix(key, "sk-dev-") || curl == "" {
		t.Fatalf("banner incomplete: base %q key %q curl %q", base, key, curl)
	}

	// The printed curl line works as printed.
	if _, err := exec.LookPath("curl"); err == nil {
		out, err := exec.CommandContext(ctx, "sh", "-c", curl).Output()
		if err != nil {
			t.Fatalf("%s: %v", curl, err)
		}
		if !strings.Contains(string(out), `"chat.completion"`) || !strings.Contains(string(out), `"usage"`) {
			t.Fatalf("curl answer: %s", out)
		}
	} else {
		t.Log("curl not installed; the Go client checks below cover the same request")
	}

	client := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey(key), option.WithMaxRetries(0))
	params := openai.ChatCompletionNewParams{
		Model:     "qwen3-32b",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello from the Go client")},
		MaxTokens: openai.Int(16),
	}
	resp, err := client.Chat.Completions.New(ctx, params)
	if err != nil || len(resp.Choices) == 0 || resp.Choices[0].Message.Content == "" {
		t.Fatalf("non-streaming: %+v, %v", resp, err)
	}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var text strings.Builder
	for stream.Next() {
		if c := stream.Current(); len(c.Choices) > 0 {
			text.WriteString(c.Choices[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil || text.Len() == 0 {
		t.Fatalf("streaming: %q, %v", text.String(), err)
	}

	// The tenants-and-keys guide's admin examples work as written.
	if _, err := exec.LookPath("curl"); err == nil && adminKey != "" {
		runAdminGuide(t, ctx, bin, base, adminKey)
	} else if os.Getenv("CI") == "true" {
		t.Fatalf("curl installed: %v; admin key printed: %q (CI runs the guide's examples)", err, adminKey)
	}
}

// A refused configuration exits non-zero before printing anything that
// looks like success: no banner, no curl line, one line naming the field.
func TestServeRefusesWPDevKeyBeforeBanner(t *testing.T) {
	bin := buildBinary(t)
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "WARMPATH_CONFIG=", "WARMPATH_DEV_KEY=wp-abcdefabcdef0123456789")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil {
		t.Fatal("serve with a wp- dev key exited 0; want a refusal")
	}
	if stdout.Len() != 0 {
		t.Errorf("serve printed to stdout before refusing:\n%s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "dev_key") {
		t.Errorf("stderr does not name dev_key:\n%s", stderr.String())
	}
}

// --log-format auto writes JSON where no person reads (a pipe, a file) and
// text on a terminal.
func TestLogFormatAuto(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	log, err := newLogger(f, "info", "auto")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hello")
	b, _ := os.ReadFile(f.Name())
	if !strings.HasPrefix(string(b), "{") {
		t.Errorf("auto to a file wrote %q; want JSON", b)
	}
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		defer tty.Close()
		if !isTerminal(tty) {
			t.Error("isTerminal(/dev/tty) = false")
		}
	}
	if _, err := newLogger(f, "info", "yaml"); err == nil {
		t.Error("--log-format yaml accepted")
	}
}
