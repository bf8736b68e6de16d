package bench

import (
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
	} {
		if _, err := ReadTrace(strings.NewReader(bad)); err == nil {
			t.Errorf("ReadTrace(%q) succeeded", bad)
		}
	}
}
