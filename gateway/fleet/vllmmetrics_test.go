package fleet

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/warmpath/warmpath/scoring"
)

// parseString parses s with a fresh buffer.
func parseString(s string) (engineMetrics, error) {
	return parseEngineMetrics(strings.NewReader(s), bufio.NewReaderSize(nil, metricsBufSize))
}

var parseTests = []struct {
	name    string
	in      string
	want    engineMetrics // only the exported fields are compared
	wantErr error
}{
	{
		name: "current names",
		in: `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 600.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e+09
`,
		want: engineMetrics{Running: 4, Waiting: 2, KVUsage: 0.25, PrefixQueries: 1000, PrefixHits: 600},
	},
	{
		name: "older names",
		in: `vllm:num_requests_running{model_name="m"} 1
vllm:num_requests_waiting{model_name="m"} 0
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
vllm:gpu_prefix_cache_queries_total{model_name="m"} 10
vllm:gpu_prefix_cache_hits_total{model_name="m"} 5
`,
		want: engineMetrics{Running: 1, KVUsage: 0.5, PrefixQueries: 10, PrefixHits: 5},
	},
	{
		name: "both generations: current names win",
		in: `vllm:gpu_cache_usage_perc{model_name="m"} 0.9
vllm:gpu_prefix_cache_queries_total{model_name="m"} 99
vllm:gpu_prefix_cache_hits_total{model_name="m"} 98
vllm:num_requests_running{model_name="m"} 1
vllm:num_requests_waiting{model_name="m"} 1
vllm:kv_cache_usage_perc{model_name="m"} 0.3
vllm:prefix_cache_queries_total{model_name="m"} 10
vllm:prefix_cache_hits_total{model_name="m"} 5
`,
		want: engineMetrics{Running: 1, Waiting: 1, KVUsage: 0.3, PrefixQueries: 10, PrefixHits: 5},
	},
	{
		name: "several model_name and engine labels: counts summed, kv max",
		in: `vllm:num_requests_running{engine="0",model_name="a"} 3
vllm:num_requests_running{engine="1",model_name="a"} 2
vllm:num_requests_running{engine="0",model_name="b"} 1
vllm:num_requests_waiting{engine="0",model_name="a"} 7
vllm:num_requests_waiting{engine="0",model_name="b"} 1
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="a"} 0.7
vllm:kv_cache_usage_perc{engine="0",model_name="b"} 0.1
vllm:prefix_cache_queries_total{engine="0",model_name="a"} 100
vllm:prefix_cache_queries_total{engine="1",model_name="a"} 50
`,
		want: engineMetrics{Running: 6, Waiting: 8, KVUsage: 0.7, PrefixQueries: 150},
	},
	{
		name: "cache_config_info",
		in: `vllm:num_requests_running 0
vllm:num_requests_waiting 0
vllm:cache_config_info{block_size="64",cache_dtype="auto",enable_prefix_caching="True",num_cpu_blocks="None",num_gpu_blocks="19208",sliding_window="None"} 1.0
vllm:cache_config_info{block_size="32",num_gpu_blocks="1"} 1.0
`,
		want: engineMetrics{BlockSize: 64, NumGPUBlocks: 19208},
	},
	{
		name: "cache_config_info with None blocks",
		in: `vllm:num_requests_running 0
vllm:num_requests_waiting 0
vllm:cache_config_info{block_size="16", num_gpu_blocks="None",} 1
`,
		want: engineMetrics{BlockSize: 16},
	},
	{
		name: "cache_config_info with a CPU tier",
		in: `vllm:num_requests_running 0
vllm:num_requests_waiting 0
vllm:cache_config_info{block_size="16",engine="0",num_cpu_blocks="4096",num_gpu_blocks="512"} 1
`,
		want: engineMetrics{BlockSize: 16, NumGPUBlocks: 512, NumCPUBlocks: 4096},
	},
	{
		name: "garbage and odd formatting",
		in: "vllm:num_requests_running{model_name=\"a\" 3\n" + // unterminated labels
			"vllm:num_requests_waiting abc\n" + // bad value
			"vllm:num_requests_waiting{model_name=\"x}\\\"y\"} 2 1712345678000\n" + // brace and quote in a label, timestamp
			"vllm:num_requests_running\t5\r\n" + // tab, CRLF
			"vllm:num_requests_running{} NaN\n" + // NaN skipped
			"vllm:kv_cache_usage_perc +Inf\n" + // Inf skipped
			"vllm:kv_cache_usage_perc 1.5e-1\n" +
			"vllm:num_requests_runningx 100\n" + // other name with our prefix
			"vllm:\n" +
			"\n" +
			"   \n" +
			"#vllm:num_requests_running 100\n" +
			"not_vllm:num_requests_running 100\n" +
			"vllm:num_requests_running{", // truncated last line, no newline
		want: engineMetrics{Running: 5, Waiting: 2, KVUsage: 0.15},
	},
	{
		name: "no trailing newline",
		in:   "vllm:num_requests_running 1\nvllm:num_requests_waiting 9",
		want: engineMetrics{Running: 1, Waiting: 9},
	},
	{
		name: "huge lines are skipped",
		in: "# HELP " + strings.Repeat("x", 1<<20) + "\n" +
			"vllm:num_requests_running 2\n" +
			"vllm:num_requests_waiting{model_name=\"" + strings.Repeat("y", 100<<10) + "\"} 50\n" +
			"vllm:num_requests_waiting 1\n" +
			"vllm:kv_cache_usage_perc " + strings.Repeat("9", 40<<10) + "\n" +
			"vllm:kv_cache_usage_perc 0.5\n",
		want: engineMetrics{Running: 2, Waiting: 1, KVUsage: 0.5},
	},
	{
		name:    "not vLLM",
		in:      "# TYPE up gauge\nup 1\nprocess_open_fds 10\n",
		wantErr: errNoEngineMetrics,
	},
	{
		name:    "empty",
		in:      "",
		wantErr: errNoEngineMetrics,
	},
}

func TestParseEngineMetrics(t *testing.T) {
	for _, tt := range parseTests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseString(tt.in)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v; want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			checkMetrics(t, got, tt.want)
		})
	}
}

// checkMetrics compares the exported fields.
func checkMetrics(t *testing.T, got, want engineMetrics) {
	t.Helper()
	type pub struct {
		Running, Waiting, KVUsage, PrefixQueries, PrefixHits float64
		BlockSize, NumGPUBlocks                              int
		QueueCount, QueueSum, PrefillCount, PrefillSum       float64
	}
	g := pub{got.Running, got.Waiting, got.KVUsage, got.PrefixQueries, got.PrefixHits, got.BlockSize, got.NumGPUBlocks,
		got.QueueCount, got.QueueSum, got.PrefillCount, got.PrefillSum}
	w := pub{want.Running, want.Waiting, want.KVUsage, want.PrefixQueries, want.PrefixHits, want.BlockSize, want.NumGPUBlocks,
		want.QueueCount, want.QueueSum, want.PrefillCount, want.PrefillSum}
	if g != w {
		t.Errorf("got %+v; want %+v", g, w)
	}
}

func TestParseEngineMetricsFixture(t *testing.T) {
	got, err := parseString(readFixture(t))
	if err != nil {
		t.Fatal(err)
	}
	checkMetrics(t, got, engineMetrics{
		Running: 12, Waiting: 3, KVUsage: 0.4172,
		PrefixQueries: 1.0355e6, PrefixHits: 772096,
		BlockSize: 16, NumGPUBlocks: 19208,
		QueueCount: 443, QueueSum: 12.4, PrefillCount: 443, PrefillSum: 118.3,
	})
	// A name[]-filtered page carries the histograms' count and sum.
	got, err = parseString(filterFixture(readFixture(t)))
	if err != nil || got.QueueCount != 443 || got.PrefillSum != 118.3 {
		t.Errorf("filtered page: %+v, %v", got, err)
	}
}

// The histograms' samples summed over engines, buckets ignored; a page
// with only the prefill histogram counts requests scheduled from it.
func TestParseEngineHistograms(t *testing.T) {
	m, err := parseString(`vllm:num_requests_running{engine="0"} 1
vllm:num_requests_waiting{engine="0"} 0
vllm:request_queue_time_seconds_bucket{engine="0",le="0.3"} 7
vllm:request_queue_time_seconds_count{engine="0"} 10
vllm:request_queue_time_seconds_count{engine="1"} 5
vllm:request_queue_time_seconds_sum{engine="0"} 2.5
vllm:request_prefill_time_seconds_count{engine="0"} 9
vllm:request_prefill_time_seconds_sum{engine="0"} 4
`)
	if err != nil || m.QueueCount != 15 || m.QueueSum != 2.5 || m.PrefillCount != 9 || m.PrefillSum != 4 || m.scheduled() != 15 {
		t.Fatalf("got %+v, %v", m, err)
	}
	m, _ = parseString("vllm:num_requests_running 1\nvllm:request_prefill_time_seconds_count 4\n")
	if m.scheduled() != 4 {
		t.Errorf("scheduled = %v; want the prefill histogram's count", m.scheduled())
	}
	m, _ = parseString("vllm:num_requests_running 1\n")
	if m.scheduled() != -1 {
		t.Errorf("scheduled = %v; want -1 without histograms", m.scheduled())
	}
}

// The arrival meter counts the increments between scrapes and ignores a
// counter that went backwards (an engine restart).
func TestNextRates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	st := &State{}
	m := engineMetrics{QueueCount: 100, PrefixQueries: 50000, PrefixHits: 10000, seen: seenQueueCount}
	if r := nextRates(st, &m, t0); r != (scoring.Meter{}) {
		t.Fatalf("first scrape moved the meter: %+v", r)
	}
	st.ScrapedAt, st.scheduled, st.PrefixQueries, st.PrefixHits = t0, 100, 50000, 10000
	for i := 1; i <= 200; i++ { // 2 requests and 3,000 uncached tokens a second
		m := engineMetrics{QueueCount: 100 + float64(i), PrefixQueries: 50000 + 2000*float64(i), PrefixHits: 10000 + 500*float64(i), seen: seenQueueCount}
		now := t0.Add(time.Duration(i) * 500 * time.Millisecond)
		st.Rates = nextRates(st, &m, now)
		st.ScrapedAt, st.scheduled, st.PrefixQueries, st.PrefixHits = now, m.scheduled(), m.PrefixQueries, m.PrefixHits
	}
	if math.Abs(st.Rates.Requests-2) > 0.1 || math.Abs(st.Rates.PerRequest()-1500) > 1 {
		t.Errorf("rates %+v (per request %v); want 2/s, 1,500 tokens", st.Rates, st.Rates.PerRequest())
	}
	before := st.Rates
	restarted := engineMetrics{QueueCount: 3, PrefixQueries: 100, seen: seenQueueCount}
	if r := nextRates(st, &restarted, st.ScrapedAt.Add(time.Second)); r.Requests >= before.Requests {
		t.Errorf("a restart added to the meter: %+v", r)
	}
}

func TestParseEngineMetricsReadError(t *testing.T) {
	boom := errors.New("boom")
	r := io.MultiReader(strings.NewReader("vllm:num_requests_running 1\nvllm:num_req"), iotest.ErrReader(boom))
	_, err := parseEngineMetrics(r, bufio.NewReaderSize(nil, metricsBufSize))
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v; want %v", err, boom)
	}
}

func TestParseSampleValue(t *testing.T) {
	tests := []struct {
		in   string
		want float64
		ok   bool
	}{
		{" 3", 3, true},
		{" 3.0", 3, true},
		{" 0.25 123", 0.25, true},
		{"\t1e3", 1000, true},
		{" 1.7613129213491416e+09", 1.7613129213491416e+09, true},
		{" -2", -2, true},
		{" 12345678901234567890", 12345678901234567890, true},
		{" ", 0, false},
		{"", 0, false},
		{" NaN", 0, false},
		{" -Inf", 0, false},
		{" 0x", 0, false},
	}
	for _, tt := range tests {
		got, ok := parseSampleValue([]byte(tt.in))
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseSampleValue(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func readFixture(tb testing.TB) string {
	tb.Helper()
	b, err := os.ReadFile("testdata/vllm_metrics.txt")
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// filterFixture keeps the lines a name[]-filtering exporter would send.
func filterFixture(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		for _, n := range metricNames[1:] {
			if strings.HasPrefix(line, n+"{") || strings.HasPrefix(line, n+" ") {
				b.WriteString(line)
				break
			}
		}
	}
	return b.String()
}

func BenchmarkParseEngineMetrics(b *testing.B) {
	full := readFixture(b)
	for _, bc := range []struct {
		name string
		page string
	}{
		{"full", full},
		{"filtered", filterFixture(full)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			br := bufio.NewReaderSize(nil, metricsBufSize)
			r := strings.NewReader(bc.page)
			lines := strings.Count(bc.page, "\n")
			b.SetBytes(int64(len(bc.page)))
			b.ReportAllocs()
			for b.Loop() {
				r.Reset(bc.page)
				if _, err := parseEngineMetrics(r, br); err != nil {
					b.Fatal(err)
				}
			}
			perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(1e9/perOp, "pages/s")
			b.ReportMetric(perOp/float64(lines), "ns/line")
		})
	}
}

func FuzzParseEngineMetrics(f *testing.F) {
	f.Add(readFixture(f))
	for _, tt := range parseTests {
		if len(tt.in) < 4096 {
			f.Add(tt.in)
		}
	}
	f.Fuzz(func(t *testing.T, in string) {
		m, err := parseString(in)
		if err != nil {
			return
		}
		// Sums of huge values may overflow to Inf; single values may not.
		if math.IsNaN(m.KVUsage) || math.IsInf(m.KVUsage, 0) {
			t.Fatalf("non-finite KV usage in %+v", m)
		}
		if m.BlockSize < 0 || m.NumGPUBlocks < 0 {
			t.Fatalf("negative block numbers in %+v", m)
		}
	})
}

// A data-parallel engine's prefix-cache queries are kept by rank, and only
// every rank counting fewer queries is the engine restarting: one rank
// restarting alone is not.
func TestEngineQueriesByRank(t *testing.T) {
	scrape := func(q0, q1 float64) engineMetrics {
		m, err := parseString(fmt.Sprintf("vllm:num_requests_running{engine=\"0\"} 0\n"+
			"vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} %v\n"+
			"vllm:prefix_cache_queries_total{engine=\"1\",model_name=\"m\"} %v\n", q0, q1))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	before := scrape(900, 800)
	if before.PrefixQueries != 1700 || before.EngineQueries[0] != 900 || before.EngineQueries[1] != 800 {
		t.Fatalf("parsed %v by engine, %v in all", before.EngineQueries, before.PrefixQueries)
	}
	if allWentBack(before.EngineQueries, scrape(950, 10).EngineQueries) {
		t.Error("rank 1 restarting alone counted as the engine restarting")
	}
	if !allWentBack(before.EngineQueries, scrape(5, 10).EngineQueries) {
		t.Error("both ranks restarting not counted")
	}
	if !allWentBack(nil, nil) {
		t.Error("an engine without engine labels whose queries went back not counted")
	}
}
