package bench

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/warmpath/warmpath/gateway"
	"github.com/warmpath/warmpath/record"
)

// RecordedResult is what the fleet actually got on a recording: the
// cached tokens its replicas reported, against which Analyze's simulated
// policies are read.
type RecordedResult struct {
	// Requests and PromptTokens size the recording's replayed requests,
	// and CachedTokens is what their replicas reported cached;
	// CachedFraction is CachedTokens ÷ PromptTokens.
	Requests       int     `json:"requests"`
	PromptTokens   int64   `json:"prompt_tokens"`
	CachedTokens   int64   `json:"cached_tokens"`
	CachedFraction float64 `json:"cached_fraction"`
	// Replicas is how many distinct replicas the recording names, and
	// Imbalance max ÷ mean over them of the prefill tokens each computed
	// (prompt minus cached).
	Replicas  int     `json:"replicas"`
	Imbalance float64 `json:"imbalance"`
	// Unkeyed counts the requests recorded without block keys (routed
	// without tokenizing, no in-process tokenizer configured) and
	// UnkeyedPromptTokens their prompts: every replayed figure counts
	// them as uncached, while the fleet may have cached them.
	Unkeyed             int   `json:"unkeyed"`
	UnkeyedPromptTokens int64 `json:"unkeyed_prompt_tokens"`
	// Skipped counts entries left out of the replay: no prompt tokens
	// (the replica reported no usage).
	Skipped int `json:"skipped,omitempty"`
}

// ReadRecordTrace reads the files the gateway's recorder wrote in each of
// dirs (record.ReadDir; several gateways each write a directory of their
// own) and merges them by time into one trace; see RecordTrace.
func ReadRecordTrace(dirs ...string) (*Trace, error) {
	if len(dirs) == 0 {
		return nil, errors.New("bench: record: no directory")
	}
	var entries []record.Entry
	for _, dir := range dirs {
		n := len(entries)
		err := record.ReadDir(dir, func(e record.Entry) error {
			entries = append(entries, e)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		if len(entries) == n {
			return nil, fmt.Errorf("bench: record: no recorded request in %s", dir)
		}
	}
	return RecordTrace(entries)
}

// RecordTrace turns recorded entries into a trace for Analyze, in time
// order: arrivals count from the first entry, a request's block keys are
// the recorded ones (already chained, full blocks only) at the recording's
// block size, and its session key is the recorded session hash. Entries
// recorded without usage (no prompt tokens) are skipped; entries without
// block keys are kept and count as uncached in every replayed figure
// (Trace.Recorded counts both). The entries must share one block size.
func RecordTrace(entries []record.Entry) (*Trace, error) {
	t := &Trace{Format: FormatRecord, Recorded: &RecordedResult{}}
	rec := t.Recorded
	entries = slices.Clone(entries)
	slices.SortStableFunc(entries, func(a, b record.Entry) int { return a.Time.Compare(b.Time) })
	prefill := map[string]int64{}
	var origin time.Time // the first replayed entry's time
	for i, e := range entries {
		if e.PromptTokens <= 0 {
			rec.Skipped++
			continue
		}
		if len(e.Blocks) > 0 {
			if t.BlockTokens != 0 && e.BlockTokens != t.BlockTokens {
				return nil, fmt.Errorf("bench: record: entry %d has %d-token blocks, an earlier one %d", i, e.BlockTokens, t.BlockTokens)
			}
			t.BlockTokens = e.BlockTokens
		} else {
			rec.Unkeyed++
			rec.UnkeyedPromptTokens += int64(e.PromptTokens)
		}
		if len(t.Requests) == 0 {
			origin = e.Time
		}
		t.Requests = append(t.Requests, TraceRequest{
			Arrival:     e.Time.Sub(origin),
			InputTokens: e.PromptTokens, OutputTokens: e.OutputTokens,
			Blocks: e.Blocks, Session: e.Session,
		})
		rec.Requests++
		rec.PromptTokens += int64(e.PromptTokens)
		rec.CachedTokens += int64(e.CachedTokens)
		prefill[e.Replica] += int64(e.PromptTokens - e.CachedTokens)
	}
	if len(t.Requests) == 0 {
		return nil, fmt.Errorf("bench: record: none of %d entries has prompt tokens", len(entries))
	}
	if t.BlockTokens == 0 {
		return nil, errors.New("bench: record: no entry has block keys (configure routing.tokenizer to record every turn's)")
	}
	rec.CachedFraction = ratio(rec.CachedTokens, rec.PromptTokens)
	rec.Replicas = len(prefill)
	rec.Imbalance = imbalanceOf(prefill)
	return t, nil
}

// imbalanceOf returns max ÷ mean of the values of m, 0 when they sum to 0.
func imbalanceOf(m map[string]int64) float64 {
	var sum, top int64
	for _, v := range m {
		sum += v
		top = max(top, v)
	}
	if sum == 0 {
		return 0
	}
	return float64(top) * float64(len(m)) / float64(sum)
}

// recordTo turns recording on in gateway i's configuration gc of a run of
// policy, when cfg.RecordDir is set: it records under
// RecordDir/<policy>, or RecordDir/<policy>/gateway-<i> with several
// gateways (gateway.RecordConfig). On the simulated fleet the gateway
// then tokenizes in process with the simulator's tokenizer
// (routing.tokenizer: simulator), so that the turns it routes without
// tokenizing (sticky turns) are recorded with their block keys too.
func recordTo(gc *gateway.Config, cfg Config, policy string, i int) {
	if cfg.RecordDir == "" {
		return
	}
	gc.Record.Dir = filepath.Join(cfg.RecordDir, policy)
	if cfg.Gateways > 1 {
		gc.Record.Dir = filepath.Join(gc.Record.Dir, fmt.Sprintf("gateway-%d", i))
	}
	if len(cfg.Fleet) == 0 && cfg.Target == "" {
		gc.Routing.Tokenizer = gateway.TokenizerSimulator
	}
}
