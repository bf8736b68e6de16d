package fleet

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/warmpath/warmpath/scoring"
)

// engineMetrics is what one scrape of vLLM's /metrics yields.
type engineMetrics struct {
	Running, Waiting          float64 // summed over model_name and engine labels
	KVUsage                   float64 // max over series, 0..1
	PrefixQueries, PrefixHits float64 // summed; current names win over the older gpu_ ones
	BlockSize, NumGPUBlocks   int     // from the first vllm:cache_config_info series with them
	NumCPUBlocks              int     // likewise (its num_cpu_blocks label), 0 when absent
	// EngineQueries holds vllm:prefix_cache_queries_total by its engine
	// label (a data-parallel rank), nil when no series has one.
	EngineQueries map[int]float64
	// QueueCount and QueueSum are the vllm:request_queue_time_seconds
	// histogram's count and sum, PrefillCount and PrefillSum the
	// vllm:request_prefill_time_seconds one's: requests scheduled, and
	// seconds they waited and prefilled, summed over engines.
	QueueCount, QueueSum, PrefillCount, PrefillSum float64

	seen      seenMask
	oldKV     float64 // vllm:gpu_cache_usage_perc, used when the current name is absent
	oldQuery  float64
	oldHits   float64
	haveBlock bool
}

// seenMask records which metric families a scrape contained.
type seenMask uint16

const (
	seenRunning seenMask = 1 << iota
	seenWaiting
	seenKV
	seenOldKV
	seenQueries
	seenOldQueries
	seenHits
	seenOldHits
	seenCacheConfig
	seenQueueCount
	seenPrefillCount
)

// metricKind identifies a metric name the parser uses.
type metricKind uint8

const (
	kindNone metricKind = iota
	kindRunning
	kindWaiting
	kindKV
	kindOldKV
	kindQueries
	kindOldQueries
	kindHits
	kindOldHits
	kindCacheConfig
	kindQueueCount
	kindQueueSum
	kindPrefillCount
	kindPrefillSum
	// Filter-only names: the histograms' family names, for exporters
	// whose name[] filter matches families (Go's promhttp) rather than
	// samples (prometheus_client). The parser reads no sample by them.
	kindQueueFamily
	kindPrefillFamily
)

// metricNames are the sample names the parser reads. They double as the
// name[] filter sent to the exporter (see scrapeQuery).
var metricNames = [...]string{
	kindRunning:     "vllm:num_requests_running",
	kindWaiting:     "vllm:num_requests_waiting",
	kindKV:          "vllm:kv_cache_usage_perc",
	kindOldKV:       "vllm:gpu_cache_usage_perc",
	kindQueries:     "vllm:prefix_cache_queries_total",
	kindOldQueries:  "vllm:gpu_prefix_cache_queries_total",
	kindHits:        "vllm:prefix_cache_hits_total",
	kindOldHits:     "vllm:gpu_prefix_cache_hits_total",
	kindCacheConfig: "vllm:cache_config_info",
	// Only the histograms' _count and _sum samples: prometheus_client's
	// name[] filter matches sample names, so the buckets stay home.
	kindQueueCount:    "vllm:request_queue_time_seconds_count",
	kindQueueSum:      "vllm:request_queue_time_seconds_sum",
	kindPrefillCount:  "vllm:request_prefill_time_seconds_count",
	kindPrefillSum:    "vllm:request_prefill_time_seconds_sum",
	kindQueueFamily:   "vllm:request_queue_time_seconds",
	kindPrefillFamily: "vllm:request_prefill_time_seconds",
}

// kindOf maps a sample name to its kind. A switch on string(b) does not
// allocate.
func kindOf(name []byte) metricKind {
	switch string(name) {
	case "vllm:num_requests_running":
		return kindRunning
	case "vllm:num_requests_waiting":
		return kindWaiting
	case "vllm:kv_cache_usage_perc":
		return kindKV
	case "vllm:gpu_cache_usage_perc":
		return kindOldKV
	case "vllm:prefix_cache_queries_total":
		return kindQueries
	case "vllm:gpu_prefix_cache_queries_total":
		return kindOldQueries
	case "vllm:prefix_cache_hits_total":
		return kindHits
	case "vllm:gpu_prefix_cache_hits_total":
		return kindOldHits
	case "vllm:cache_config_info":
		return kindCacheConfig
	case "vllm:request_queue_time_seconds_count":
		return kindQueueCount
	case "vllm:request_queue_time_seconds_sum":
		return kindQueueSum
	case "vllm:request_prefill_time_seconds_count":
		return kindPrefillCount
	case "vllm:request_prefill_time_seconds_sum":
		return kindPrefillSum
	}
	return kindNone
}

// errNoEngineMetrics reports a /metrics page without vLLM's queue gauges,
// typically a URL that does not point at vLLM.
var errNoEngineMetrics = errors.New("no vllm:num_requests_running or vllm:num_requests_waiting samples")

// metricsBufSize is the line buffer of the parser. Longer lines are skipped
// whole; every line the parser needs is far shorter.
const metricsBufSize = 16 << 10

var vllmPrefix = []byte("vllm:")

// parseEngineMetrics reads Prometheus text exposition from r and extracts
// the vLLM engine metrics. It reads line by line through br (reset onto r),
// looks only at samples whose name starts with "vllm:", and skips comments,
// garbage and over-long lines. It fails on a read error or when the queue
// gauges are missing.
func parseEngineMetrics(r io.Reader, br *bufio.Reader) (engineMetrics, error) {
	var m engineMetrics
	br.Reset(r)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// An over-long line: skip through its end.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			if err == nil {
				continue
			}
			line = nil
		}
		if len(line) > 0 {
			m.parseLine(line)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return m, fmt.Errorf("read: %w", err)
		}
	}
	return m, m.finish()
}

// finish resolves name generations and checks that the page had vLLM's
// queue gauges.
func (m *engineMetrics) finish() error {
	if m.seen&seenKV == 0 && m.seen&seenOldKV != 0 {
		m.KVUsage = m.oldKV
	}
	if m.seen&seenQueries == 0 && m.seen&seenOldQueries != 0 {
		m.PrefixQueries = m.oldQuery
	}
	if m.seen&seenHits == 0 && m.seen&seenOldHits != 0 {
		m.PrefixHits = m.oldHits
	}
	if m.seen&(seenRunning|seenWaiting) == 0 {
		return errNoEngineMetrics
	}
	return nil
}

// parseLine handles one exposition line (with or without its newline).
func (m *engineMetrics) parseLine(line []byte) {
	if !bytes.HasPrefix(line, vllmPrefix) {
		return // comments, blank lines, other exporters' metrics
	}
	end := len(vllmPrefix)
	for end < len(line) && line[end] != '{' && line[end] != ' ' && line[end] != '\t' {
		end++
	}
	kind := kindOf(line[:end])
	if kind == kindNone {
		return
	}
	rest := line[end:]
	var labels []byte
	if len(rest) > 0 && rest[0] == '{' {
		n := labelsEnd(rest)
		if n < 0 {
			return // unterminated label set
		}
		labels, rest = rest[1:n], rest[n+1:]
	}
	v, ok := parseSampleValue(rest)
	if !ok {
		return
	}
	m.add(kind, labels, v)
}

// add folds one sample of kind, with its label set, into m.
func (m *engineMetrics) add(kind metricKind, labels []byte, v float64) {
	switch kind {
	case kindRunning:
		m.Running += v
		m.seen |= seenRunning
	case kindWaiting:
		m.Waiting += v
		m.seen |= seenWaiting
	case kindKV:
		if m.seen&seenKV == 0 || v > m.KVUsage {
			m.KVUsage = v
		}
		m.seen |= seenKV
	case kindOldKV:
		if m.seen&seenOldKV == 0 || v > m.oldKV {
			m.oldKV = v
		}
		m.seen |= seenOldKV
	case kindQueries:
		m.PrefixQueries += v
		m.seen |= seenQueries
		if e, ok := labelInt(labels, "engine"); ok {
			if m.EngineQueries == nil {
				m.EngineQueries = map[int]float64{}
			}
			m.EngineQueries[e] += v
		}
	case kindOldQueries:
		m.oldQuery += v
		m.seen |= seenOldQueries
	case kindHits:
		m.PrefixHits += v
		m.seen |= seenHits
	case kindOldHits:
		m.oldHits += v
		m.seen |= seenOldHits
	case kindQueueCount:
		m.QueueCount += v
		m.seen |= seenQueueCount
	case kindQueueSum:
		m.QueueSum += v
	case kindPrefillCount:
		m.PrefillCount += v
		m.seen |= seenPrefillCount
	case kindPrefillSum:
		m.PrefillSum += v
	case kindCacheConfig:
		m.seen |= seenCacheConfig
		if m.haveBlock {
			return
		}
		bs, _ := labelInt(labels, "block_size")
		nb, _ := labelInt(labels, "num_gpu_blocks")
		if bs > 0 || nb > 0 {
			m.BlockSize, m.NumGPUBlocks, m.haveBlock = bs, nb, true
			m.NumCPUBlocks, _ = labelInt(labels, "num_cpu_blocks")
		}
	}
}

// labelsEnd returns the index of the '}' closing the label set that starts
// at s[0] == '{', honouring quoted values with escapes, or -1.
func labelsEnd(s []byte) int {
	quoted := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == '}':
			return i
		case c == '\n':
			return -1
		}
	}
	return -1
}

// parseSampleValue parses the value after the name or label set: blanks,
// the value, then an optional timestamp. NaN and infinities are rejected.
func parseSampleValue(s []byte) (float64, bool) {
	i := 0
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	j := i
	for j < len(s) && s[j] != ' ' && s[j] != '\t' && s[j] != '\n' && s[j] != '\r' {
		j++
	}
	if j == i {
		return 0, false
	}
	v, ok := parseInt(s[i:j])
	if !ok {
		f, err := strconv.ParseFloat(string(s[i:j]), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, false
		}
		v = f
	}
	return v, true
}

// parseInt parses a small unsigned decimal integer, optionally followed by
// ".0" (Python's float formatting), without allocating. It reports false
// for anything else so the caller can fall back to strconv.
func parseInt(s []byte) (float64, bool) {
	if bytes.HasSuffix(s, []byte(".0")) {
		s = s[:len(s)-2]
	}
	if len(s) == 0 || len(s) > 15 {
		return 0, false
	}
	var n int64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return float64(n), true
}

// labelInt finds label name in a label set (the bytes between the braces)
// and parses its value as an integer. Values like "None" give false.
func labelInt(labels []byte, name string) (int, bool) {
	for len(labels) > 0 {
		labels = bytes.TrimLeft(labels, " \t,")
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 {
			return 0, false
		}
		key := bytes.TrimSpace(labels[:eq])
		rest := bytes.TrimLeft(labels[eq+1:], " \t")
		if len(rest) == 0 || rest[0] != '"' {
			return 0, false
		}
		// Find the closing quote, skipping escapes.
		end := -1
		for i := 1; i < len(rest); i++ {
			if rest[i] == '\\' {
				i++
				continue
			}
			if rest[i] == '"' {
				end = i
				break
			}
		}
		if end < 0 {
			return 0, false
		}
		if string(key) == name {
			v, ok := parseInt(rest[1:end])
			if !ok || v > math.MaxInt32 {
				return 0, false
			}
			return int(v), true
		}
		labels = rest[end+1:]
	}
	return 0, false
}

// scheduled returns the engine's cumulative count of requests scheduled:
// the queue-time histogram's count, else the prefill-time one's, else -1
// (neither exposed).
func (m *engineMetrics) scheduled() float64 {
	switch {
	case m.seen&seenQueueCount != 0:
		return m.QueueCount
	case m.seen&seenPrefillCount != 0:
		return m.PrefillCount
	}
	return -1
}

// nextRates returns the replica's arrival meter after the scrape m taken
// at now, given the state before it: the counters' increments since the
// previous scrape (requests scheduled, uncached prompt tokens = prefix
// queries − hits) are added after decaying the meter by the time between
// the scrapes. A counter that went backwards (an engine restart) adds
// nothing this once.
func nextRates(prev *State, m *engineMetrics, now time.Time) scoring.Meter {
	meter := prev.Rates
	n := m.scheduled()
	if prev.ScrapedAt.IsZero() || n < 0 || prev.scheduled < 0 {
		return meter
	}
	meter.Advance(now.Sub(prev.ScrapedAt).Seconds())
	dn := n - prev.scheduled
	dt := (m.PrefixQueries - m.PrefixHits) - (prev.PrefixQueries - prev.PrefixHits)
	if dn >= 0 && dt >= 0 {
		meter.Add(dn, dt)
	}
	return meter
}
