package record

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/testrun"
)

var t0 = time.Date(2026, 12, 6, 21, 0, 0, 0, time.UTC)

func entry(i int) Entry {
	return Entry{Time: t0.Add(time.Duration(i) * 1500 * time.Millisecond), Tenant: "acme", Session: "sess-" + string(rune('a'+i%3)),
		Blocks: []uint64{1, 2, 1<<63 + uint64(i)}, BlockTokens: 16, PromptTokens: 40 + i, OutputTokens: 7,
		Replica: "vllm-1", CachedTokens: 32}
}

// record runs a Recorder over entries and returns what it wrote, read
// back.
func record(t *testing.T, cfg Config, entries []Entry) (*Recorder, []Entry) {
	t.Helper()
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := testrun.Start(t, "recorder", r.Run)
	for _, e := range entries {
		if !r.Record(e) {
			t.Fatalf("Record dropped an entry with a queue of %d", cfg.Queue)
		}
	}
	stop()
	var got []Entry
	if err := ReadDir(cfg.Dir, func(e Entry) error { got = append(got, e); return nil }); err != nil {
		t.Fatal(err)
	}
	return r, got
}

func TestRoundTrip(t *testing.T) {
	var in []Entry
	for i := range 10 {
		in = append(in, entry(i))
	}
	r, got := record(t, Config{Dir: t.TempDir(), Queue: 64, Key: []byte("k")}, in)
	if len(got) != len(in) || r.Written() != uint64(len(in)) || r.Dropped() != 0 || r.Failed() != 0 {
		t.Fatalf("got %d entries (written %d, dropped %d, failed %d); want %d", len(got), r.Written(), r.Dropped(), r.Failed(), len(in))
	}
	for i, e := range got {
		want := in[i]
		if len(e.Tenant) != 16 || e.Tenant == want.Tenant || e.Tenant != got[0].Tenant {
			t.Errorf("entry %d: got tenant %q; want one 16-digit hash for every line", i, e.Tenant)
		}
		if (e.Session == got[(i+1)%3].Session) || e.Session != got[i%3].Session {
			t.Errorf("entry %d: got session %q; want equal hashes for equal sessions only", i, e.Session)
		}
		want.Tenant, want.Session = e.Tenant, e.Session
		if !reflect.DeepEqual(e, want) {
			t.Errorf("entry %d: got %+v; want %+v", i, e, want)
		}
	}
	_, unkeyed := record(t, Config{Dir: t.TempDir(), Queue: 64}, in[:1])
	if unkeyed[0].Tenant == got[0].Tenant {
		t.Errorf("got tenant hash %q with and without a key; want them to differ", got[0].Tenant)
	}
}

func TestLineHasNoText(t *testing.T) {
	dir := t.TempDir()
	record(t, Config{Dir: dir, Queue: 4}, []Entry{entry(0)})
	names, err := Files(dir)
	if err != nil || len(names) != 1 {
		t.Fatalf("got files %v, %v; want one", names, err)
	}
	b, err := os.ReadFile(names[0])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	})
	want := []string{"block_tokens", "cached_tokens", "hash_ids", "input_length", "output_length", "replica", "session", "tenant", "timestamp"}
	if !slices.Equal(keys, want) {
		t.Errorf("got fields %v; want %v", keys, want)
	}
	if strings.Contains(string(b), "acme") || strings.Contains(string(b), "sess-") {
		t.Errorf("line %s holds the tenant or session in clear", b)
	}
}

func TestRotation(t *testing.T) {
	dir := t.TempDir()
	var in []Entry
	for i := range 50 {
		in = append(in, entry(i))
	}
	line, _ := appendLine(nil, entry(10))
	maxBytes := int64(3 * len(line))
	_, got := record(t, Config{Dir: dir, Queue: 64, MaxFileBytes: maxBytes, Keep: 3}, in)
	names, _ := Files(dir)
	if len(names) != 3 {
		t.Fatalf("got %d files; want 3", len(names))
	}
	for _, n := range names {
		if st, err := os.Stat(n); err != nil || st.Size() > maxBytes {
			t.Errorf("%s: size %d, %v; want at most %d", n, st.Size(), err, maxBytes)
		}
	}
	if len(got) < 4 || got[len(got)-1].PromptTokens != in[49].PromptTokens {
		t.Fatalf("got %d entries; want the newest files' entries, ending with the last", len(got))
	}
	for i := 1; i < len(got); i++ {
		if got[i].PromptTokens != got[i-1].PromptTokens+1 {
			t.Errorf("entries out of order at %d: %d after %d", i, got[i].PromptTokens, got[i-1].PromptTokens)
		}
	}
	// A second run goes on numbering after the files already there.
	record(t, Config{Dir: dir, Queue: 4, Keep: 3}, in[:1])
	after, _ := Files(dir)
	if len(after) != 3 || after[0] != names[1] || after[2] <= names[2] {
		t.Errorf("got files %v after %v; want the oldest dropped and a newer one added", after, names)
	}
}

func TestRecordDropsWhenFull(t *testing.T) {
	r, err := New(Config{Dir: t.TempDir(), Queue: 2})
	if err != nil {
		t.Fatal(err)
	}
	var queued int
	for i := range 5 {
		if r.Record(entry(i)) {
			queued++
		}
	}
	if queued != 2 || r.Dropped() != 3 {
		t.Errorf("got %d queued, %d dropped; want 2 and 3", queued, r.Dropped())
	}
}

func TestConfigErrors(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("New without Dir: got no error")
	}
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Dir: filepath.Join(file, "sub")})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(t.Context()); err == nil {
		t.Error("Run with a Dir under a file: got no error")
	}
}

func TestReadErrors(t *testing.T) {
	for _, l := range []string{
		`not json`,
		`{"timestamp":-1,"input_length":1}`,
		`{"timestamp":1,"input_length":-1}`,
		`{"timestamp":1,"input_length":10,"cached_tokens":11}`,
		`{"timestamp":1,"input_length":10,"output_length":-3}`,
		`{"timestamp":1,"input_length":10,"hash_ids":[1]}`,
		`{"timestamp":1,"input_length":10,"hash_ids":[1.5],"block_tokens":16}`,
		`{"timestamp":1e20,"input_length":10}`,
		`{"timestamp":1,"input_length":10,"replica":"` + strings.Repeat("r", 300) + `"}`,
		`{"timestamp":1,"input_length":10,"block_tokens":-16}`,
	} {
		err := Read(strings.NewReader("\n"+l+"\n"), func(Entry) error { return nil })
		if err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("Read(%.60q): got %v; want an error naming line 2", l, err)
		}
	}
	long := `{"timestamp":1,"replica":"` + strings.Repeat("x", MaxLineBytes) + `"}` + "\n{}\n"
	if err := Read(strings.NewReader(long), func(Entry) error { return nil }); err == nil {
		t.Error("Read of an over-long line: got no error")
	}
	stop := errors.New("stop")
	if err := Read(strings.NewReader("{}\n{}\n"), func(Entry) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("got %v; want fn's error", err)
	}
}

func TestReadTruncatedTail(t *testing.T) {
	l, _ := appendLine(nil, entry(1))
	var n int
	count := func(Entry) error { n++; return nil }
	if err := Read(strings.NewReader(string(l)+string(l[:len(l)/2])), count); err != nil || n != 1 {
		t.Errorf("got %d entries, %v; want the cut-short last line skipped", n, err)
	}
	n = 0
	if err := Read(strings.NewReader(string(l)+string(l[:len(l)-1])), count); err != nil || n != 2 {
		t.Errorf("got %d entries, %v; want a last line without its newline read", n, err)
	}
	if err := Read(strings.NewReader(string(l[:len(l)/2])+"\n"+string(l)), count); err == nil {
		t.Error("got no error for a bad line that is not the last")
	}
}

func TestWriteClamps(t *testing.T) {
	odd := Entry{Tenant: "t", PromptTokens: 10, CachedTokens: 12, OutputTokens: -1}
	_, got := record(t, Config{Dir: t.TempDir(), Queue: 4}, []Entry{odd})
	if len(got) != 1 || got[0].CachedTokens != 10 || got[0].OutputTokens != 0 || got[0].Time.UnixMilli() != 0 {
		t.Errorf("got %+v; want one entry clamped into range", got)
	}
	r, _ := record(t, Config{Dir: t.TempDir(), Queue: 4}, []Entry{{Blocks: []uint64{1}}})
	if r.Failed() != 1 || r.Written() != 0 {
		t.Errorf("got %d failed, %d written; want blocks without a block size refused", r.Failed(), r.Written())
	}
}

// FuzzRead checks that Read never panics and that every line it accepts
// is in range and survives a write and a second read unchanged.
func FuzzRead(f *testing.F) {
	for i := range 3 {
		l, _ := appendLine(nil, entry(i))
		f.Add(string(l))
	}
	f.Add(`{"timestamp":1750000000000,"input_length":1025,"output_length":3,"hash_ids":[0,1,2],"block_tokens":512}` + "\n\n{}")
	f.Add(`{"timestamp":0,"input_length":0,"hash_ids":null,"tenant":"\u00ff\ud800"}`)
	f.Add("{\"timestamp\":1}\r\n[1,2]")
	f.Fuzz(func(t *testing.T, data string) {
		_ = Read(strings.NewReader(data), func(e Entry) error {
			if e.PromptTokens < 0 || e.CachedTokens > e.PromptTokens || e.OutputTokens < 0 || e.Time.Before(time.Unix(0, 0)) {
				t.Fatalf("accepted an entry out of range: %+v", e)
			}
			b, err := appendLine(nil, e)
			if err != nil {
				t.Fatalf("re-encoding %+v: %v", e, err)
			}
			var again []Entry
			if err := Read(strings.NewReader(string(b)), func(e Entry) error { again = append(again, e); return nil }); err != nil {
				t.Fatalf("re-reading %s: %v", b, err)
			}
			if len(again) != 1 || !reflect.DeepEqual(again[0], e) {
				t.Fatalf("round trip: got %+v; want %+v", again, e)
			}
			return nil
		})
	})
}
