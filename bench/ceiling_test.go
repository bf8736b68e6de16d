package bench

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// req builds a trace request arriving at at with the given hash ids and
// prompt length.
func req(at time.Duration, input int, ids ...int64) TraceRequest {
	return TraceRequest{Arrival: at, InputTokens: input, OutputTokens: 1, HashIDs: ids, Blocks: chainIDs(ids)}
}

// handTrace is a small trace with 4-token blocks whose ceilings are worked
// out by hand in TestCeiling.
func handTrace() []TraceRequest {
	return []TraceRequest{
		req(0, 12, 0, 1, 2),                      // nothing seen: 0
		req(time.Second, 11, 0, 1, 3),            // [0 1] seen at 0s: 2 blocks, 8 tokens
		req(2*time.Second, 10, 0, 1, 2),          // all seen; last block partial: 3 blocks, 10 tokens
		req(20*time.Minute, 16, 0, 1, 3, 4),      // [0 1 3] last seen at 1s, [0 1] at 2s
		req(20*time.Minute+time.Second, 8, 0, 5), // [0] seen 1s before
		req(20*time.Minute+2*time.Second, 3, 7),  // a new one-block prompt
	}
}

func TestCeiling(t *testing.T) {
	tests := []struct {
		name                 string
		window               time.Duration
		cachedTokens, blocks int64
	}{
		// 0 + 8 + 10 + 12 + 4 + 0 tokens; 0 + 2 + 3 + 3 + 1 + 0 blocks.
		{"unlimited", 0, 34, 9},
		// Request 3 finds everything stale.
		{"10m", 10 * time.Minute, 22, 6},
		// A key seen exactly window ago is fresh: [0 1 3] (1s) and [0 1] (2s).
		{"edge inclusive", 20*time.Minute - time.Second, 34, 9},
		// One nanosecond less: [0 1 3] is stale, [0 1] still fresh.
		{"per-key last seen", 20*time.Minute - time.Second - 1, 30, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Ceiling(handTrace(), 4, tt.window)
			want := CeilingResult{
				Requests: 6, PromptTokens: 60, CachedTokens: tt.cachedTokens,
				Fraction:     float64(tt.cachedTokens) / 60,
				PromptBlocks: 16, CachedBlocks: tt.blocks, BlockFraction: float64(tt.blocks) / 16,
			}
			if got != want {
				t.Errorf("Ceiling = %+v; want %+v", got, want)
			}
		})
	}
}

func TestCeilingEmpty(t *testing.T) {
	if got := Ceiling(nil, 512, 0); got != (CeilingResult{}) {
		t.Errorf("Ceiling(nil) = %+v; want zero", got)
	}
}

// sharedTrace returns the path of the shared Mooncake trace, found by
// walking up from the package directory, or skips the test.
func sharedTrace(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		p := filepath.Join(dir, "shared", "data", "mooncake_conversation_first_half.jsonl")
		if _, err := os.Stat(p); err == nil {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Skip("shared/data/mooncake_conversation_first_half.jsonl not found above the package directory")
		}
		dir = parent
	}
}

func TestCeilingSharedTrace(t *testing.T) {
	tr, err := ReadTraceFile(sharedTrace(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Requests) != 5606 {
		t.Fatalf("got %d requests; want 5606", len(tr.Requests))
	}
	unlimited := Ceiling(tr.Requests, tr.BlockTokens, 0)
	window := Ceiling(tr.Requests, tr.BlockTokens, 10*time.Minute)
	t.Logf("unlimited: %.2f%% of tokens, %.2f%% of blocks; 10m: %.2f%% of tokens, %.2f%% of blocks",
		100*unlimited.Fraction, 100*unlimited.BlockFraction, 100*window.Fraction, 100*window.BlockFraction)
	// The data README: "about 34% of prompt blocks".
	if unlimited.BlockFraction < 0.335 || unlimited.BlockFraction > 0.345 {
		t.Errorf("unlimited block ceiling = %.4f; want about 0.34", unlimited.BlockFraction)
	}
	if unlimited.Fraction < unlimited.BlockFraction-0.01 || unlimited.Fraction > unlimited.BlockFraction+0.01 {
		t.Errorf("token ceiling %.4f far from block ceiling %.4f", unlimited.Fraction, unlimited.BlockFraction)
	}
	if window.Fraction > unlimited.Fraction || window.Fraction < 0.3 {
		t.Errorf("10m ceiling = %.4f; want a little below %.4f", window.Fraction, unlimited.Fraction)
	}
}
