package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/vllmsim"
)

func TestPercentile(t *testing.T) {
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct {
		in   []float64
		p    float64
		want float64
	}{
		{[]float64{1, 2, 3, 4}, 50, 2.5},
		{ten, 90, 9.1},
		{ten, 99, 9.91},
		{ten, 0, 1},
		{ten, 100, 10},
		{[]float64{7}, 99, 7},
	} {
		if got := percentile(c.in, c.p); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("percentile(%v, %v) = %v; want %v", c.in, c.p, got, c.want)
		}
	}
	if !math.IsNaN(percentile(nil, 50)) {
		t.Error("percentile of nothing is not NaN")
	}
}

func TestContentOf(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
		ok   bool
	}{
		{`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, "", false},
		{`{"choices":[{"index":0,"delta":{"content":"ba be bi."}}]}`, "ba be bi.", true},
		{`{"choices":[{"delta":{"content":"a \"q\"\nb"}}]}`, "a \"q\"\nb", true},
		{`{"choices":[{"delta":{"reasoning_content":"x"}}]}`, "", false},
		{`{"choices":[],"usage":{"prompt_tokens":3}}`, "", false},
	} {
		got, ok := contentOf([]byte(c.in))
		if ok != c.ok || string(got) != c.want {
			t.Errorf("contentOf(%s) = %q, %v; want %q, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestReadSSE(t *testing.T) {
	long := strings.Repeat("x", 40<<10) // longer than the reader's buffer
	stream := "data: {\"a\":1}\n\n: comment\ndata:{\"b\":\"" + long + "\"}\n\nevent: x\ndata: [DONE]\n\ndata: {\"after\":1}\n\n"
	var got []string
	if err := readSSE(strings.NewReader(stream), func(d []byte) error { got = append(got, string(d)); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != `{"a":1}` || got[1] != `{"b":"`+long+`"}` {
		t.Errorf("readSSE got %d payloads, first %q", len(got), got[0])
	}
}

func TestScaledProfile(t *testing.T) {
	p := ScaledProfile(vllmsim.DefaultProfile(), 0.1)
	d := vllmsim.DefaultProfile()
	if p.KVBlocks != 1921 || p.MaxNumBatchedTokens != 819 || p.MaxNumSeqs != d.MaxNumSeqs || p.BlockSize != 16 {
		t.Errorf("scaled sizes = %+v", p)
	}
	if p.StepBase != 110*time.Millisecond || p.DecodePerSeq != 400*time.Microsecond || p.DecodePerContextToken != 2500*time.Nanosecond {
		t.Errorf("scaled step costs = %v, %v, %v", p.StepBase, p.DecodePerSeq, p.DecodePerContextToken)
	}
	// A prefill of s·n tokens costs what n tokens cost at full size.
	if full, scaled := 6000*d.PrefillPerToken, 600*p.PrefillPerToken; (full - scaled).Abs() > time.Millisecond {
		t.Errorf("prefill of 600 scaled tokens = %v; full 6,000 = %v", scaled, full)
	}
	if q := ScaledProfile(d, 1); q != d {
		t.Error("scale 1 changed the profile")
	}
}

// testReport builds a two-policy report from synthetic samples.
func testReport() *Report {
	mk := func(policy string, ttft time.Duration, cached int) Result {
		var ss []sample
		for i := range 20 {
			ss = append(ss, sample{session: i, start: time.Duration(i) * time.Second, end: time.Duration(i)*time.Second + 10*time.Second,
				ttft: ttft + time.Duration(i)*time.Millisecond, e2e: 10 * time.Second, engineTTFT: ttft / 2,
				promptTokens: 720, cachedTokens: cached, outputTokens: 100, replica: "r" + string(rune('0'+i%4)), reason: "scored",
				messages: []vllmsim.Message{{Role: "user", Content: "ba be bi"}}, promptKey: "k"})
		}
		ss = append(ss, sample{session: 99, start: time.Second, err: "status 503: no"})
		r := summarize(policy, ss, 0.1)
		r.setPrefill([]float64{100, 100, 100, 300}, "engine")
		r.finishCeiling(newPromptMemo(), 0)
		return *r
	}
	rep := &Report{Workload: "shared-prefix", Started: time.Unix(1e9, 0), Wall: 90 * time.Second,
		Config:  []Param{{"scale", "0.1"}, {"speed", "4 (times are simulated)"}, {"seed", "1"}},
		Params:  []Param{{"groups × users", "150 × 5"}},
		Results: []Result{mk("round-robin", 30*time.Second, 144), mk("warmpath", 500*time.Millisecond, 704)}}
	rep.compare()
	return rep
}

func TestSummarize(t *testing.T) {
	rep := testReport()
	rr, wp := rep.Results[0], rep.Results[1]
	if rr.Requests != 21 || rr.Errors != 1 || rr.FirstError != "status 503: no" {
		t.Errorf("requests %d errors %d first %q", rr.Requests, rr.Errors, rr.FirstError)
	}
	if math.Abs(wp.TTFTP50Ms-509.5) > 1e-6 || math.Abs(wp.EngineTTFTP50Ms-250) > 1e-6 {
		t.Errorf("warmpath p50 TTFT %v, engine %v", wp.TTFTP50Ms, wp.EngineTTFTP50Ms)
	}
	// 20 × 100 tokens (1,000 at full size each) over a 29 s makespan.
	if want := 20 * 1000 / 29.0; math.Abs(wp.OutputTokensPerS-want) > 1e-6 {
		t.Errorf("output tokens/s = %v; want %v", wp.OutputTokensPerS, want)
	}
	if math.Abs(wp.CachedFraction-704.0/720) > 1e-9 || math.Abs(rr.Imbalance-2) > 1e-9 {
		t.Errorf("cached %v imbalance %v", wp.CachedFraction, rr.Imbalance)
	}
	// One prompt repeated: the ceiling credits all but the first, in
	// whole 16-token blocks of its 3 tokens: nothing.
	if wp.Ceiling != 0 || wp.OfCeiling != 0 {
		t.Errorf("ceiling %v of ceiling %v", wp.Ceiling, wp.OfCeiling)
	}
	if math.Abs(wp.TTFTP90Ratio-rr.TTFTP90Ms/wp.TTFTP90Ms) > 1e-9 || rr.TTFTP90Ratio != 1 || wp.ThroughputRatio != 1 {
		t.Errorf("ratios %v %v %v", wp.TTFTP90Ratio, rr.TTFTP90Ratio, wp.ThroughputRatio)
	}
}

func TestReportJSONShape(t *testing.T) {
	var b bytes.Buffer
	if err := testReport().WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Workload string           `json:"workload"`
		Results  []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Workload != "shared-prefix" || len(doc.Results) != 2 {
		t.Fatalf("workload %q, %d results", doc.Workload, len(doc.Results))
	}
	for _, r := range doc.Results {
		if _, ok := r["policy"].(string); !ok {
			t.Errorf("policy is %T", r["policy"])
		}
		for _, k := range []string{"requests", "errors", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "output_tokens_per_s", "cached_fraction", "ceiling", "imbalance"} {
			if _, ok := r[k].(float64); !ok {
				t.Errorf("%s: %s is %T, want a number", r["policy"], k, r[k])
			}
		}
	}
}

// WriteSamples writes one line per request of every policy, the failed
// ones included, with the request's own figures.
func TestWriteSamples(t *testing.T) {
	rep := testReport()
	rep.Results[1].samples[3].timing = &gatewayTiming{prepare: 2 * time.Millisecond}
	rep.Results[1].samples[3].estimate = 40 * time.Millisecond
	var b bytes.Buffer
	if err := rep.WriteSamples(&b); err != nil {
		t.Fatal(err)
	}
	var recs []sampleRecord
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		var r sampleRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		recs = append(recs, r)
	}
	if len(recs) != 42 || recs[0].Policy != "round-robin" || recs[41].Policy != "warmpath" {
		t.Fatalf("%d records, first %q, last %q; want 21 per policy in report order", len(recs), recs[0].Policy, recs[41].Policy)
	}
	errs := 0
	for _, r := range recs {
		if r.Error != "" {
			errs++
		}
	}
	if errs != 2 {
		t.Errorf("%d failed requests written; want 2", errs)
	}
	var got *sampleRecord
	for i := range recs {
		if recs[i].Policy == "warmpath" && recs[i].PrepareMs != nil {
			got = &recs[i]
		}
	}
	if got == nil || *got.PrepareMs != 2 || got.EstimateMs == nil || *got.EstimateMs != 40 || got.CachedTokens != 704 || got.PromptTokens != 720 {
		t.Errorf("record with timing: %+v", got)
	}
}

func TestReportRenders(t *testing.T) {
	rep := testReport()
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"round-robin", "warmpath", "× better)", "97.8 %", "status 503"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	var html bytes.Buffer
	if err := rep.WriteHTML(&html); err != nil {
		t.Fatal(err)
	}
	h := html.String()
	if n := strings.Count(h, "<svg"); n != 2 {
		t.Errorf("HTML has %d charts; want 2", n)
	}
	for _, want := range []string{"TTFT distribution", "cached-prefix fraction", "150 × 5", "<td>warmpath</td>", "</html>"} {
		if !strings.Contains(h, want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
	for _, c := range rep.Charts() {
		walkSVG(t, c.SVG())
	}
}

func TestFleetLRUCeiling(t *testing.T) {
	a := TraceRequest{InputTokens: 32, Blocks: []uint64{1, 2}}
	b := TraceRequest{InputTokens: 16, Blocks: []uint64{3}}
	reqs := []TraceRequest{a, b, a}
	// Two blocks: b evicts a's suffix (touched first, so least recent),
	// and a's return hits its first block only.
	if got := fleetLRUCeiling(reqs, 2); math.Abs(got-16.0/80) > 1e-9 {
		t.Errorf("capacity 2: %v; want 0.2", got)
	}
	// Unlimited: a hits all but its last token.
	if got := fleetLRUCeiling(reqs, 100); math.Abs(got-31.0/80) > 1e-9 {
		t.Errorf("capacity 100: %v; want 31/80", got)
	}
}

func TestFailureKind(t *testing.T) {
	for _, tt := range []struct{ msg, want string }{
		{`status 502: {"error":{"message":"the upstream replica failed before answering; try again","type":"server_error","param":null,"code":"upstream_error"}}`, "status 502 upstream_error"},
		{`status 503: {"error":{"message":"no healthy replica","code":"service_unavailable"}}`, "status 503 service_unavailable"},
		{`status 500: not json`, "status 500"},
		{`stream error: {"error":{"message":"cut","code":"upstream_error"}}`, "stream error upstream_error"},
		{`Post "http://127.0.0.1:1/v1/chat/completions": dial tcp 127.0.0.1:1: connect: connection refused`, "dial tcp 127.0.0.1:1: connect: connection refused"},
		{"bench: cut at the drain deadline", "bench: cut at the drain deadline"},
	} {
		if got := failureKind(tt.msg); got != tt.want {
			t.Errorf("failureKind(%q) = %q; want %q", tt.msg, got, tt.want)
		}
	}
}

// WriteLoad writes one line per engine sample of every result, naming the
// replicas in the order of the per-replica fields.
func TestWriteLoad(t *testing.T) {
	rep := testReport()
	rep.Results[0].Load = []LoadSample{{T: 0, Waiting: []int{1, 0}, Running: []int{2, 3}, KVUsage: []float64{0.5, 0.25}}}
	rep.Results[0].loadNames = []string{"r0", "r1"}
	rep.Results[1].Load = []LoadSample{{T: 0}, {T: 1, Waiting: []int{0, 4}}}
	var b bytes.Buffer
	if err := rep.WriteLoad(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines; want 3:\n%s", len(lines), b.String())
	}
	var first struct {
		Policy   string   `json:"policy"`
		Replicas []string `json:"replicas"`
		Running  []int    `json:"running"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if first.Policy != "round-robin" || len(first.Replicas) != 2 || first.Replicas[1] != "r1" || len(first.Running) != 2 || first.Running[1] != 3 {
		t.Errorf("first line %s; want round-robin's sample with replicas r0, r1", lines[0])
	}
}
