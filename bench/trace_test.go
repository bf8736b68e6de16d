package bench

import (
	"bufio"
	"os"
	"strings"
	"testing"
	"time"
)

func TestReadTraceMooncake(t *testing.T) {
	tr, err := ReadTraceFile("testdata/mooncake_head400.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if tr.Format != FormatMooncake || tr.BlockTokens != 512 || len(tr.Requests) != 400 {
		t.Fatalf("format %s, block %d, %d requests", tr.Format, tr.BlockTokens, len(tr.Requests))
	}
	first := tr.Requests[0]
	if first.InputTokens != 6758 || first.OutputTokens != 500 || len(first.Blocks) != 14 {
		t.Errorf("first request = %+v", first)
	}
	// Every request starts with block 0, so every first key is equal; the
	// second blocks of the first two requests differ.
	for i, r := range tr.Requests {
		if r.Blocks[0] != first.Blocks[0] {
			t.Fatalf("request %d does not share block 0", i)
		}
		if i > 0 && r.Arrival < tr.Requests[i-1].Arrival {
			t.Fatalf("requests not in arrival order at %d", i)
		}
	}
	if tr.Requests[1].Blocks[1] == first.Blocks[1] {
		t.Error("different hash ids produced equal chained keys")
	}
}

func TestReadTraceOpenAI(t *testing.T) {
	log := `{"timestamp": 0, "model":"m", "messages":[{"role":"system","content":"you are terse"},{"role":"user","content":"hello there"}], "max_tokens": 7}
{"timestamp": 1500, "model":"m", "messages":[{"role":"system","content":"you are terse"},{"role":"user","content":"hello there"},{"role":"assistant","content":"hi"},{"role":"user","content":"` + strings.Repeat("more words ", 40) + `"}]}
`
	tr, err := ReadTrace(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Format != FormatOpenAI || tr.BlockTokens != ChatBlockTokens || len(tr.Requests) != 2 {
		t.Fatalf("got %+v", tr)
	}
	a, b := tr.Requests[0], tr.Requests[1]
	if a.OutputTokens != 7 || b.Arrival != 1500*time.Millisecond || b.InputTokens <= a.InputTokens {
		t.Errorf("requests = %+v / %+v", a, b)
	}
	// The second turn extends the first: their full blocks agree.
	for i := range a.Blocks {
		if a.Blocks[i] != b.Blocks[i] {
			t.Fatalf("block %d differs between turns", i)
		}
	}
}

func TestReadTraceErrors(t *testing.T) {
	for _, bad := range []string{
		``,
		`not json`,
		`{"timestamp": 1}`,
		`{"input_length": 10, "hash_ids": [1]}`,
		`{"timestamp": 0, "input_length": 1000, "hash_ids": [1]}`,
		`{"timestamp": -5, "input_length": 10, "hash_ids": [1]}`,
		`{"timestamp": 0, "messages": "nope"}`,
		`{"timestamp": 1e300, "input_length": 10, "hash_ids": [1]}`,
		`{"timestamp": 0, "input_length": 10, "output_length": -1, "hash_ids": [1]}`,
		`{"timestamp": 0, "max_tokens": -3, "messages": [{"role":"user","content":"hi"}]}`,
	} {
		if _, err := ReadTrace(strings.NewReader(bad)); err == nil {
			t.Errorf("ReadTrace(%q) succeeded", bad)
		}
	}
}

// FuzzReadTrace feeds arbitrary logs to the trace reader, a trust boundary
// (users point analyze and bench at their own logs): it must return a
// trace or an error, never panic, and a trace it returns must hold what
// the replay and the analysis rely on.
func FuzzReadTrace(f *testing.F) {
	fh, err := os.Open("testdata/mooncake_head400.jsonl")
	if err != nil {
		f.Fatal(err)
	}
	sc := bufio.NewScanner(fh)
	for i := 0; i < 4 && sc.Scan(); i++ {
		f.Add(sc.Text())
	}
	fh.Close()
	f.Add(`{"timestamp": 0, "model":"m", "messages":[{"role":"user","content":"hello"}], "max_tokens": 7}` + "\n" +
		`{"timestamp": 9, "messages":[{"role":"user","content":"hello"},{"role":"assistant","content":"hi"},{"role":"user","content":"more"}], "tools":[{"type":"function","function":{"name":"f"}}]}`)
	f.Add(`{"timestamp": 5, "input_length": 513, "output_length": 1, "hash_ids": [0, 7]}` + "\n" + `{"timestamp": 1, "input_length": 1, "hash_ids": [0]}`)
	f.Add(`{"timestamp": 1750000000000, "input_length": 1025, "hash_ids": [0, 1, 2]}` + "\n" + `{"timestamp": 1750000001500, "input_length": 1537, "hash_ids": [0, 1, 5, 6]}`)
	f.Fuzz(func(t *testing.T, log string) {
		tr, err := ReadTrace(strings.NewReader(log))
		if err != nil {
			return
		}
		if len(tr.Requests) == 0 || tr.BlockTokens <= 0 {
			t.Fatalf("trace without requests or block size: %+v", tr)
		}
		for i, r := range tr.Requests {
			if i > 0 && r.Arrival < tr.Requests[i-1].Arrival {
				t.Fatalf("request %d arrives before request %d", i, i-1)
			}
			if r.Arrival < 0 || r.InputTokens <= 0 || r.OutputTokens < 0 {
				t.Fatalf("request %d = %+v", i, r)
			}
			switch tr.Format {
			case FormatMooncake:
				if len(r.Blocks) != len(r.HashIDs) || len(r.Blocks) != (r.InputTokens+MooncakeBlockTokens-1)/MooncakeBlockTokens {
					t.Fatalf("request %d: %d blocks, %d hash ids for %d tokens", i, len(r.Blocks), len(r.HashIDs), r.InputTokens)
				}
				if r.Opening < 1 || r.Opening > len(r.Blocks) {
					t.Fatalf("request %d: opening %d of %d blocks", i, r.Opening, len(r.Blocks))
				}
			case FormatOpenAI:
				if len(r.Blocks) != r.InputTokens/ChatBlockTokens || r.Body == nil {
					t.Fatalf("request %d: %d blocks for %d tokens, body %q", i, len(r.Blocks), r.InputTokens, r.Body)
				}
			default:
				t.Fatalf("format %q", tr.Format)
			}
		}
	})
}
