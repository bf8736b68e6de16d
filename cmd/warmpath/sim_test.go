package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestSimQuirkFlags runs `warmpath sim` with every engine-quirk flag and
// checks that the served engine has them: two data-parallel ranks and a
// CPU tier in vllm:cache_config_info, and no /tokenize.
func TestSimQuirkFlags(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	args := []string{"--http-port", fmt.Sprint(port), "--kv-port", "0", "--speed", "100", "--data-parallel-size", "2", "--first-seq", "1",
		"--no-tokenize", "--prompt-blocks-only", "--cpu-blocks", "64", "--cpu-store-only"}
	go func() { done <- runSim(ctx, args) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("sim returned %v", err)
		}
	}()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	if !waitHealthy(base+"/health", done) {
		t.Fatal("sim never became healthy")
	}
	resp, err := http.Post(base+"/tokenize", "application/json", strings.NewReader(`{"prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("POST /tokenize: %d; want 404 with --no-tokenize", resp.StatusCode)
	}
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`num_cpu_blocks="64"`, `vllm:num_requests_running{engine="1"`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
