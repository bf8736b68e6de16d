package bench

import (
	"bytes"
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/record"
	"github.com/warmpath/warmpath/vllmsim"
)

// TestRecordReplay records a short live warmpath run on the simulated
// fleet and replays the recording through Analyze with the run's fleet:
// the replayed warmpath cached fraction must be within 2 points of the
// live one, and the recording's own figure (the cached tokens the
// replicas reported) must be the live figure. The run is at scale 0.05
// and 20× speed, so that a wall-clock second of the recording is a
// full-size simulated second, which is what Analyze's prefill and decode
// model assumes.
func TestRecordReplay(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := Config{
		Workload:  "agentic",
		Policies:  []string{"warmpath"},
		Replicas:  2,
		Scale:     0.05,
		Speed:     20,
		Limit:     16,
		RecordDir: dir,
	}
	rep, _ := runLogged(t, cfg)
	live := rep.Results[0]
	if live.Errors != 0 {
		t.Fatalf("live run: %d errors (%s)", live.Errors, live.FirstError)
	}
	tr, err := ReadRecordTrace(filepath.Join(dir, "warmpath"))
	if err != nil {
		t.Fatal(err)
	}
	rec := tr.Recorded
	if rec.Requests != live.Requests+live.Warmup || rec.Unkeyed != 0 || rec.Replicas != 2 {
		t.Errorf("recorded %d requests (%d without block keys) on %d replicas; the run made %d on 2",
			rec.Requests, rec.Unkeyed, rec.Replicas, live.Requests+live.Warmup)
	}
	if rec.PromptTokens != live.PromptTokens || rec.CachedTokens != live.CachedTokens {
		t.Errorf("recorded %d of %d prompt tokens cached; the run measured %d of %d",
			rec.CachedTokens, rec.PromptTokens, live.CachedTokens, live.PromptTokens)
	}
	profile := ScaledProfile(vllmsim.DefaultProfile(), cfg.Scale)
	window := time.Duration(0)
	ar, err := Analyze(t.Context(), AnalyzeConfig{
		Trace: tr, Window: &window, Policies: []string{"warmpath"},
		CacheBlocks:         []int{profile.KVBlocks * profile.BlockSize / tr.BlockTokens},
		PrefillTokensPerSec: DefaultPrefillTokensPerSec * cfg.Scale * cfg.Speed,
	})
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := ar.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", table.String())
	if ar.Replicas != 2 || tr.BlockTokens != 16 {
		t.Errorf("replayed on %d replicas at %d-token blocks; want 2 and 16", ar.Replicas, tr.BlockTokens)
	}
	replayed := ar.Results[0].CachedFraction
	if d := math.Abs(replayed - live.CachedFraction); d > 0.02 {
		t.Errorf("replayed warmpath cached %.1f%%, live %.1f%%: %.1f points apart; want at most 2",
			100*replayed, 100*live.CachedFraction, 100*d)
	}
	if !strings.Contains(table.String(), "recorded: the fleet cached") {
		t.Errorf("analyze table does not show the recorded figure")
	}
}

// TestRecordTrace checks the adapter from recorded entries: time order,
// arrivals from the first replayed entry, sessions, the block size, and
// what is skipped or counted unkeyed.
func TestRecordTrace(t *testing.T) {
	t0 := time.UnixMilli(1_700_000_000_000)
	es := []record.Entry{
		{Time: t0.Add(2 * time.Second), Session: "s1", Blocks: []uint64{1, 2}, BlockTokens: 16, PromptTokens: 40, OutputTokens: 5, Replica: "a", CachedTokens: 32},
		{Time: t0, Session: "s0", PromptTokens: 0, Replica: "a"},
		{Time: t0.Add(time.Second), Session: "s1", Blocks: []uint64{1}, BlockTokens: 16, PromptTokens: 20, OutputTokens: 5, Replica: "b"},
		{Time: t0.Add(3 * time.Second), Session: "s1", BlockTokens: 16, PromptTokens: 44, OutputTokens: 5, Replica: "b", CachedTokens: 4},
	}
	tr, err := RecordTrace(es)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Format != FormatRecord || tr.BlockTokens != 16 || len(tr.Requests) != 3 {
		t.Fatalf("trace %s, %d-token blocks, %d requests; want record, 16, 3", tr.Format, tr.BlockTokens, len(tr.Requests))
	}
	for i, want := range []time.Duration{0, time.Second, 2 * time.Second} {
		if r := tr.Requests[i]; r.Arrival != want || r.Session != "s1" {
			t.Errorf("request %d arrives at %v in session %q; want %v in s1", i, r.Arrival, r.Session, want)
		}
	}
	if got := sessionKey(tr.Format, &tr.Requests[0]); got != "s1" {
		t.Errorf("session key %q; want the recorded s1", got)
	}
	rec := *tr.Recorded
	want := RecordedResult{Requests: 3, PromptTokens: 104, CachedTokens: 36, CachedFraction: 36.0 / 104,
		Replicas: 2, Imbalance: 60.0 * 2 / 68, Unkeyed: 1, UnkeyedPromptTokens: 44, Skipped: 1}
	if rec != want {
		t.Errorf("recorded %+v; want %+v", rec, want)
	}
	es[3].Blocks, es[3].BlockTokens = []uint64{9}, 32
	if _, err := RecordTrace(es); err == nil {
		t.Error("mixed block sizes: no error")
	}
	if _, err := RecordTrace(es[1:2]); err == nil {
		t.Error("no entry with prompt tokens: no error")
	}
}

// TestAnalyzeRecordDir writes entries with a real Recorder and analyzes
// the directory: the report carries the recorded figure.
func TestAnalyzeRecordDir(t *testing.T) {
	dir := t.TempDir()
	r, err := record.New(record.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t0 := time.UnixMilli(1_700_000_000_000)
	for i := range 4 {
		r.Record(record.Entry{Time: t0.Add(time.Duration(i) * time.Second), Tenant: "t", Session: "s",
			Blocks: []uint64{11, 12, 13, uint64(20 + i)}[:3+min(i, 1)], BlockTokens: 16, PromptTokens: 60, OutputTokens: 4,
			Replica: "r0", CachedTokens: 48 * min(i, 1)})
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	tr, err := ReadRecordTrace(dir)
	if err != nil {
		t.Fatal(err)
	}
	ar, err := Analyze(t.Context(), AnalyzeConfig{Trace: tr, Policies: []string{"warmpath"}, CacheBlocks: []int{100}})
	if err != nil {
		t.Fatal(err)
	}
	if ar.Replicas != 1 || ar.Recorded == nil || ar.Recorded.CachedTokens != 144 {
		t.Fatalf("replicas %d, recorded %+v; want 1 replica, 144 cached tokens", ar.Replicas, ar.Recorded)
	}
	// Every later turn repeats the first's 3 full blocks: 48 of 60 tokens.
	if got := ar.Results[0].CachedTokens; got != 144 {
		t.Errorf("replayed %d cached tokens; want 144", got)
	}
	files, err := record.Files(dir)
	if err != nil || len(files) != 1 {
		t.Fatalf("files %v, %v", files, err)
	}
	if _, err := ReadTraceFile(files[0]); err == nil || !strings.Contains(err.Error(), "--record") {
		t.Errorf("a recording read as a trace file: %v; want an error pointing to --record", err)
	}
	if _, err := ReadRecordTrace(t.TempDir()); err == nil {
		t.Error("an empty directory: no error")
	}
}
