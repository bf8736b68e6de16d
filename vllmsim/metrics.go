package vllmsim

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// ttftBuckets are vLLM's bucket bounds for
// vllm:time_to_first_token_seconds, in seconds.
var ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
	1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

// requestBuckets are vLLM's bucket bounds for its per-request latency
// histograms (vllm:request_queue_time_seconds,
// vllm:request_prefill_time_seconds), in seconds.
var requestBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
	120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}

// histogram is a Prometheus-style histogram; not safe for concurrent use
// (the engine guards its own with its mutex).
type histogram struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative; last is +Inf
	sum    float64
	count  uint64
}

func newHistogram(bounds []float64) histogram {
	return histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	i := 0
	for i < len(h.bounds) && v > h.bounds[i] {
		i++
	}
	h.counts[i]++
	h.sum += v
	h.count++
}

func (h *histogram) clone() histogram {
	c := *h
	c.counts = append([]uint64(nil), h.counts...)
	return c
}

// collector exposes one replica's engine state with vLLM's metric names. It
// reads engine snapshots at scrape time, so the engines keep plain counters
// and the registry stays per replica (never the global one). Every series
// carries model_name and engine labels, engine being the data-parallel
// rank ("0" without data parallelism), as vLLM's V1 engines' do.
type collector struct {
	engines   []*engine
	blockSize int
	numBlocks int

	running, waiting, usage, usageOld                   *prometheus.Desc
	queries, hits, prompt, generation, preempt, success *prometheus.Desc
	ttft, queueTime, prefillTime, cacheInfo             *prometheus.Desc
}

func newCollector(engines []*engine, model string, blockSize, numBlocks, cpuBlocks int) *collector {
	cl := prometheus.Labels{"model_name": model}
	engineLabel := []string{"engine"}
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, engineLabel, cl) }
	info := prometheus.Labels{"model_name": model, "block_size": strconv.Itoa(blockSize),
		"num_gpu_blocks": strconv.Itoa(numBlocks), "num_cpu_blocks": strconv.Itoa(cpuBlocks), "cache_dtype": "auto",
		"enable_prefix_caching": "True"}
	return &collector{
		engines: engines, blockSize: blockSize, numBlocks: numBlocks,
		running:     d("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:     d("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		usage:       d("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		usageOld:    d("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (pre-V1 name of vllm:kv_cache_usage_perc)."),
		queries:     d("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		hits:        d("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		prompt:      d("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		generation:  d("vllm:generation_tokens_total", "Number of generation tokens processed."),
		preempt:     d("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine."),
		success:     d("vllm:request_success_total", "Count of successfully processed requests."),
		ttft:        d("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
		queueTime:   d("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
		prefillTime: d("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
		cacheInfo:   prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.", engineLabel, info),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.waiting, c.usage, c.usageOld, c.queries, c.hits,
		c.prompt, c.generation, c.preempt, c.success, c.ttft, c.queueTime, c.prefillTime, c.cacheInfo} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for i, eng := range c.engines {
		c.collect(ch, eng, strconv.Itoa(i))
	}
}

func (c *collector) collect(ch chan<- prometheus.Metric, eng *engine, engineLabel string) {
	st, h := eng.snapshot()
	g := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, engineLabel)
	}
	k := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), engineLabel)
	}
	g(c.running, float64(st.Running))
	g(c.waiting, float64(st.Waiting))
	g(c.usage, st.KVUsage)
	g(c.usageOld, st.KVUsage)
	k(c.queries, st.PromptTokens)
	k(c.hits, st.CachedTokens-st.CPUCachedTokens) // local hits; CPU loads are the connector's
	k(c.prompt, st.PromptTokens)
	k(c.generation, st.GeneratedTokens)
	k(c.preempt, st.Preemptions)
	k(c.success, st.Finished)
	q, p := eng.histograms()
	ch <- h.metric(c.ttft, engineLabel)
	ch <- q.metric(c.queueTime, engineLabel)
	ch <- p.metric(c.prefillTime, engineLabel)
	g(c.cacheInfo, 1)
}

// metric exposes h as a constant Prometheus histogram described by d.
func (h *histogram) metric(d *prometheus.Desc, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(h.bounds))
	var cum uint64
	for i, b := range h.bounds {
		cum += h.counts[i]
		buckets[b] = cum
	}
	return prometheus.MustNewConstHistogram(d, h.count, h.sum, buckets, labels...)
}
