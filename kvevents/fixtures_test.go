package kvevents

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// fixtureDir returns the golden fixtures: shared/fixtures/kvevents found
// by walking up from the package directory, or else the copy in
// testdata/fixtures, so the test runs on any checkout.
func fixtureDir(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for dir := wd; ; {
		cand := filepath.Join(dir, "shared", "fixtures", "kvevents")
		if st, err := os.Stat(filepath.Join(cand, "expected.json")); err == nil && !st.IsDir() {
			return cand
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return filepath.Join("testdata", "fixtures")
}

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtureDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type expectedEvent struct {
	Type        string    `json:"type"`
	BlockHashes []uint64  `json:"block_hashes"`
	Parent      *uint64   `json:"parent"`
	Tokens      *[2]int64 `json:"tokens"`
	BlockSize   int       `json:"block_size"`
	Medium      string    `json:"medium"`
	SessionID   string    `json:"session_id"`
	CacheSalt   string    `json:"cache_salt"`
}

type expectedBatch struct {
	TS             float64         `json:"ts"`
	DPRank         *int            `json:"dp_rank"`
	SkippedUnknown int             `json:"skipped_unknown"`
	Events         []expectedEvent `json:"events"`
}

func TestFixturesDecode(t *testing.T) {
	var want map[string]expectedBatch
	if err := json.Unmarshal(readFixture(t, "expected.json"), &want); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"legacy_array", "map_events", "bytes_hashes", "salted_map"} {
		t.Run(name, func(t *testing.T) {
			exp, ok := want[name]
			if !ok {
				t.Fatalf("expected.json has no %q", name)
			}
			got, st, err := Decode(readFixture(t, name+".msgpack"))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if got.TS != exp.TS {
				t.Errorf("TS = %v; want %v", got.TS, exp.TS)
			}
			if !reflect.DeepEqual(got.DPRank, exp.DPRank) {
				t.Errorf("DPRank = %v; want %v", ptrStr(got.DPRank), ptrStr(exp.DPRank))
			}
			if st.UnknownEvents != exp.SkippedUnknown {
				t.Errorf("UnknownEvents = %d; want %d", st.UnknownEvents, exp.SkippedUnknown)
			}
			if len(got.Events) != len(exp.Events) {
				t.Fatalf("%d events; want %d", len(got.Events), len(exp.Events))
			}
			for i, we := range exp.Events {
				checkEvent(t, i, got.Events[i], we)
			}
		})
	}
}

func checkEvent(t *testing.T, i int, ev Event, we expectedEvent) {
	t.Helper()
	if ev.Type() != we.Type {
		t.Errorf("event %d: type %s; want %s", i, ev.Type(), we.Type)
		return
	}
	switch e := ev.(type) {
	case *BlockStored:
		if !reflect.DeepEqual(e.BlockHashes, we.BlockHashes) {
			t.Errorf("event %d: BlockHashes = %v; want %v", i, e.BlockHashes, we.BlockHashes)
		}
		if !reflect.DeepEqual(e.ParentBlockHash, we.Parent) {
			t.Errorf("event %d: ParentBlockHash = %s; want %s", i, ptrStr(e.ParentBlockHash), ptrStr(we.Parent))
		}
		if we.Tokens == nil {
			t.Fatalf("event %d: expected.json lists no tokens", i)
		}
		first, last := we.Tokens[0], we.Tokens[1]
		if n := int(last - first + 1); len(e.TokenIDs) != n {
			t.Errorf("event %d: %d tokens; want %d", i, len(e.TokenIDs), n)
		}
		for j, tok := range e.TokenIDs {
			if int64(tok) != first+int64(j) {
				t.Errorf("event %d: token %d = %d; want %d", i, j, tok, first+int64(j))
				break
			}
		}
		if e.BlockSize != we.BlockSize {
			t.Errorf("event %d: BlockSize = %d; want %d", i, e.BlockSize, we.BlockSize)
		}
		if e.Medium != we.Medium {
			t.Errorf("event %d: Medium = %q; want %q", i, e.Medium, we.Medium)
		}
		if e.SessionID != we.SessionID {
			t.Errorf("event %d: SessionID = %q; want %q", i, e.SessionID, we.SessionID)
		}
		if e.CacheSalt != we.CacheSalt {
			t.Errorf("event %d: CacheSalt = %q; want %q", i, e.CacheSalt, we.CacheSalt)
		}
	case *BlockRemoved:
		if !reflect.DeepEqual(e.BlockHashes, we.BlockHashes) {
			t.Errorf("event %d: BlockHashes = %v; want %v", i, e.BlockHashes, we.BlockHashes)
		}
		if e.Medium != we.Medium {
			t.Errorf("event %d: Medium = %q; want %q", i, e.Medium, we.Medium)
		}
	case *AllBlocksCleared:
	default:
		t.Errorf("event %d: unexpected %T", i, ev)
	}
}

func ptrStr[T any](p *T) string {
	if p == nil {
		return "nil"
	}
	b, _ := json.Marshal(*p)
	return string(b)
}

// TestFixturesDetails checks fields expected.json does not list.
func TestFixturesDetails(t *testing.T) {
	b, _, err := Decode(readFixture(t, "map_events.msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	e := b.Events[0].(*BlockStored)
	if want := [][]ExtraKey{nil, nil}; !reflect.DeepEqual(e.ExtraKeys, want) {
		t.Errorf("ExtraKeys = %#v; want %#v", e.ExtraKeys, want)
	}
	if e.GroupIdx == nil || *e.GroupIdx != 0 {
		t.Errorf("GroupIdx = %s; want 0", ptrStr(e.GroupIdx))
	}
	if e.KVCacheSpecKind != "full_attention" {
		t.Errorf("KVCacheSpecKind = %q; want full_attention", e.KVCacheSpecKind)
	}
	if e.LoRAID != nil || e.LoRAName != "" {
		t.Errorf("LoRA = %s %q; want none", ptrStr(e.LoRAID), e.LoRAName)
	}

	b, _, err = Decode(readFixture(t, "salted_map.msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	e = b.Events[0].(*BlockStored)
	want := [][]ExtraKey{{{Kind: ExtraCacheSalt, Value: "tenant-a"}}, nil}
	if !reflect.DeepEqual(e.ExtraKeys, want) {
		t.Errorf("ExtraKeys = %#v; want %#v", e.ExtraKeys, want)
	}
}

// TestFixturesEncode checks that Encode writes what vLLM writes, byte for
// byte, for the fixtures it can reproduce.
func TestFixturesEncode(t *testing.T) {
	t.Run("legacy_array", func(t *testing.T) {
		raw := readFixture(t, "legacy_array.msgpack")
		b, _, err := Decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Encode(b, FormatArray)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, raw) {
			t.Errorf("Encode(FormatArray) =\n%x\nwant\n%x", got, raw)
		}
	})
	t.Run("map_events", func(t *testing.T) {
		raw := readFixture(t, "map_events.msgpack")
		b, _, err := Decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Encode(b, FormatMap)
		if err != nil {
			t.Fatal(err)
		}
		// The fixture minus its unknown BlockInactive event, which Decode
		// drops: {"type":"BlockInactive","block_hashes":[<uint64>]}.
		inactive := append([]byte("\x82\xa4type\xadBlockInactive\xacblock_hashes\x91\xcf"), 0xda, 0xb8, 0x9b, 0xaa, 0x7b, 0x58, 0x57, 0xc0)
		want := bytes.Replace(raw, inactive, nil, 1)
		if len(want) != len(raw)-len(inactive) {
			t.Fatal("BlockInactive event not found in fixture")
		}
		const eventsHeader = 10 // after 0x93 and the 9-byte float64
		if want[eventsHeader] != 0x95 {
			t.Fatalf("events header %#x; want 0x95", want[eventsHeader])
		}
		want[eventsHeader] = 0x94
		if !bytes.Equal(got, want) {
			t.Errorf("Encode(FormatMap) =\n%x\nwant\n%x", got, want)
		}
	})
}

func TestFixturesFrames(t *testing.T) {
	seq, err := ParseSeq(readFixture(t, "frames_seq.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if seq != 41 {
		t.Errorf("seq = %d; want 41", seq)
	}
	replica, model := ParseTopic(string(readFixture(t, "frames_topic.bin")))
	if replica != "10.0.0.7:8000" || model != "qwen3-32b" {
		t.Errorf("ParseTopic = %q, %q; want 10.0.0.7:8000, qwen3-32b", replica, model)
	}
}

// TestFixtureCopyCurrent keeps testdata/fixtures, subdirectories included,
// in step with the shared fixtures when both exist.
func TestFixtureCopyCurrent(t *testing.T) {
	shared := fixtureDir(t)
	copyDir := filepath.Join("testdata", "fixtures")
	if shared == copyDir {
		t.Skip("shared fixtures not found; using the copy")
	}
	n := 0
	err := filepath.WalkDir(shared, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(shared, path)
		if err != nil {
			return err
		}
		want, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n++
		got, err := os.ReadFile(filepath.Join(copyDir, rel))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s differs from %s (err %v); copy it again", filepath.Join(copyDir, rel), path, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(shared, "vllm-encoder", "batches.json")); err != nil {
		t.Errorf("shared fixtures lack vllm-encoder/batches.json: %v", err)
	}
	t.Logf("%d shared fixture files compared", n)
}
