package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/record"
)

func TestAnalyzeCommand(t *testing.T) {
	dir := t.TempDir()
	jsonPath, plotPath := filepath.Join(dir, "report.json"), filepath.Join(dir, "chart.svg")
	var out bytes.Buffer
	err := analyze(t.Context(), []string{
		"--window", "0", "--replicas", "4", "--cache-blocks", "300, 600", "--policies", "round-robin,warmpath",
		"--prefill-rate", "20000", "--time-scale", "0.5", "--seed", "7",
		"--json", jsonPath, "--plot", plotPath,
		"../../bench/testdata/mooncake_head400.jsonl",
	}, &out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ceiling (window unlimited)", "4 replicas at 20000 prefill tokens/s", "time scale 0.5", "round-robin", "warmpath"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}

	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Ceiling      float64 `json:"ceiling"`
		Requests     int     `json:"requests"`
		PromptTokens int64   `json:"prompt_tokens"`
		Results      []struct {
			Policy         string  `json:"policy"`
			CacheBlocks    int     `json:"cache_blocks"`
			CachedFraction float64 `json:"cached_fraction"`
			Imbalance      float64 `json:"imbalance"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Requests != 400 || rep.Ceiling <= 0 || rep.PromptTokens <= 0 || len(rep.Results) != 4 {
		t.Fatalf("report = %+v", rep)
	}
	if r := rep.Results[3]; r.Policy != "warmpath" || r.CacheBlocks != 600 || r.CachedFraction <= 0 || r.Imbalance < 1 {
		t.Errorf("last result = %+v; want warmpath at 600 blocks", r)
	}

	for _, p := range []string{plotPath, filepath.Join(dir, "chart-imbalance.svg")} {
		svg, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		dec := xml.NewDecoder(bytes.NewReader(svg))
		for {
			if _, err := dec.Token(); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s is not well-formed: %v", p, err)
			}
		}
	}
}

// TestRunAnalyze runs the subcommand as main does, printing to stdout.
func TestRunAnalyze(t *testing.T) {
	if err := runAnalyze(t.Context(), []string{"--cache-blocks", "600", "--policies", "warmpath", "../../bench/testdata/mooncake_head400.jsonl"}); err != nil {
		t.Fatal(err)
	}
}

func TestAnalyzeCommandErrors(t *testing.T) {
	trace := "../../bench/testdata/mooncake_head400.jsonl"
	tests := []struct {
		name string
		args []string
	}{
		{"no trace", nil},
		{"two traces", []string{trace, trace}},
		{"missing file", []string{filepath.Join(t.TempDir(), "none.jsonl")}},
		{"bad cache size", []string{"--cache-blocks", "600,lots", trace}},
		{"bad policy", []string{"--policies", "fastest", trace}},
		{"bad flag", []string{"--nope", trace}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := analyze(t.Context(), tt.args, io.Discard); err == nil {
				t.Error("analyze succeeded; want an error")
			}
		})
	}
	if err := analyze(t.Context(), []string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: err = %v; want flag.ErrHelp", err)
	}
}

// --synthetic analyzes the coding-agent log without a file and can write
// it out; it takes no file argument.
func TestAnalyzeSynthetic(t *testing.T) {
	out := filepath.Join(t.TempDir(), "harness.jsonl")
	var table bytes.Buffer
	err := analyze(t.Context(), []string{"--synthetic", "agentic-harness", "--write-trace", out,
		"--cache-blocks", "600", "--policies", "precise-prefix,warmpath"}, &table)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "warmpath at 600 cache blocks, sampled decisions") {
		t.Errorf("table lacks the sampled decisions:\n%s", table.String())
	}
	if st, err := os.Stat(out); err != nil || st.Size() == 0 {
		t.Errorf("trace not written: %v", err)
	}
	if err := analyze(t.Context(), []string{"--synthetic", "agentic-harness", "extra.jsonl"}, io.Discard); err == nil {
		t.Error("--synthetic with a file argument succeeded")
	}
	if err := analyze(t.Context(), []string{"--synthetic", "nope"}, io.Discard); err == nil {
		t.Error("unknown --synthetic succeeded")
	}
}

// --cache-conversations sizes the caches in multiples of the median
// prompt: the blocks it announces are the table's rows; it excludes
// --cache-blocks and wants positive numbers.
func TestAnalyzeCacheConversations(t *testing.T) {
	var table bytes.Buffer
	err := analyze(t.Context(), []string{"--synthetic", "agentic-harness", "--cache-conversations", "1,2",
		"--policies", "round-robin"}, &table)
	if err != nil {
		t.Fatal(err)
	}
	out := table.String()
	head, _, _ := strings.Cut(out, "\n")
	var median, b1, b2 int
	if _, err := fmt.Sscanf(head, "cache per replica: 1,2 conversations of the median prompt (%d tokens) = %d %d blocks", &median, &b1, &b2); err != nil {
		t.Fatalf("first line %q: %v", head, err)
	}
	if want := (median + 256) / 512; b1 != want || b2 != (2*median+256)/512 {
		t.Errorf("blocks %d, %d for a median of %d tokens; want %d, %d", b1, b2, median, want, (2*median+256)/512)
	}
	for _, b := range []int{b1, b2} {
		if !strings.Contains(out, fmt.Sprintf("\n  %*d  ", len("cache blocks"), b)) {
			t.Errorf("table has no row for %d blocks:\n%s", b, out)
		}
	}
	for _, args := range [][]string{
		{"--synthetic", "agentic-harness", "--cache-conversations", "1", "--cache-blocks", "600"},
		{"--synthetic", "agentic-harness", "--cache-conversations", "0"},
		{"--synthetic", "agentic-harness", "--cpu-conversations", "1", "--cpu-blocks", "600"},
	} {
		if err := analyze(t.Context(), args, io.Discard); err == nil {
			t.Errorf("%v succeeded", args)
		}
	}
}

// TestAnalyzeRecord analyzes two gateways' recordings written by the
// record package: merged by time, on as many replicas as they name, with
// the fleet's own figure printed; --record takes no trace file.
func TestAnalyzeRecord(t *testing.T) {
	root := t.TempDir()
	dirs := []string{filepath.Join(root, "a"), filepath.Join(root, "b")}
	t0 := time.UnixMilli(1_700_000_000_000)
	for g, dir := range dirs {
		r, err := record.New(record.Config{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		for i := range 3 {
			r.Record(record.Entry{Time: t0.Add(time.Duration(2*i+g) * time.Second), Session: "s", Blocks: []uint64{1, 2, uint64(3 + 2*i + g)},
				BlockTokens: 16, PromptTokens: 50, OutputTokens: 3, Replica: fmt.Sprintf("r%d", g), CachedTokens: 32 * min(2*i+g, 1)})
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	err := analyze(t.Context(), []string{"--record", strings.Join(dirs, ","), "--cache-blocks", "100", "--policies", "warmpath"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"trace: record, 6 requests, 300 prompt tokens, 16-token blocks; 2 replicas", "recorded: the fleet cached 53.3% of prompt tokens on 2 replicas"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	if err := analyze(t.Context(), []string{"--record", dirs[0], "trace.jsonl"}, io.Discard); err == nil {
		t.Error("--record with a trace file: no error")
	}
}
