package routing

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/kvevents"
	"github.com/warmpath/warmpath/scoring/blockindex"
)

// PreciseIndex is the gateway's view of the precise prefix index: the
// blockindex fed by KV events, plus which replicas have sent events at all.
// It is the kvevents.Handler the subscribers feed.
type PreciseIndex struct {
	ix        *blockindex.Index
	blockSize int

	mu      sync.RWMutex             // guards sources and models
	sources map[string]*atomic.Int64 // replicas whose events have arrived → Unix nanos of the last batch
	models  map[string]string

	gen genDetector // which replicas cache generated tokens
}

var (
	_ kvevents.Handler     = (*PreciseIndex)(nil)
	_ kvevents.RankClearer = (*PreciseIndex)(nil)
)

// matchGrace lets speculative blocks outlive routing.speculative_ttl by up
// to this much, so that their expiry (1,000 pairs for a 16k-token prompt,
// about 0.5 ms) runs on the KV-event path, which applies batches every few
// milliseconds under load, and not inside a request's lookup.
const matchGrace = 250 * time.Millisecond

func newPreciseIndex(blockSize, maxEntries int, reg prometheus.Registerer) (*PreciseIndex, error) {
	ix, err := blockindex.New(blockindex.Config{BlockSize: blockSize, MaxEntries: maxEntries, MatchGrace: matchGrace})
	if err != nil {
		return nil, err
	}
	p := &PreciseIndex{ix: ix, blockSize: blockSize, sources: map[string]*atomic.Int64{}, models: map[string]string{}}
	reg.MustRegister(indexCollector{p})
	return p, nil
}

// Apply implements kvevents.Handler.
func (p *PreciseIndex) Apply(replica string, b kvevents.Batch) {
	p.mu.RLock()
	last := p.sources[replica]
	p.mu.RUnlock()
	if last == nil {
		p.mu.Lock()
		if last = p.sources[replica]; last == nil {
			last = new(atomic.Int64)
			p.sources[replica] = last
		}
		p.mu.Unlock()
	}
	last.Store(time.Now().UnixNano())
	p.gen.observe(replica, b)
	p.ix.Apply(replica, b)
}

// LastEvent returns when the replica's last batch arrived, zero if none.
func (p *PreciseIndex) LastEvent(replica string) time.Time {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if last := p.sources[replica]; last != nil {
		return time.Unix(0, last.Load())
	}
	return time.Time{}
}

// Clear implements kvevents.Handler.
func (p *PreciseIndex) Clear(replica string) { p.ix.Clear(replica) }

// ClearRank implements kvevents.RankClearer: one data-parallel rank's
// subscriber joining, restarting or losing a replay clears that rank's
// blocks only.
func (p *PreciseIndex) ClearRank(replica string, rank int) { p.ix.ClearRank(replica, rank) }

// SetModel registers the model a replica serves, which roots its keys.
func (p *PreciseIndex) SetModel(replica, model string) {
	p.mu.RLock()
	same := p.models[replica] == model
	p.mu.RUnlock()
	if same {
		return
	}
	p.mu.Lock()
	p.models[replica] = model
	p.mu.Unlock()
	_ = p.ix.SetReplicaModel(replica, model) // errs only when the replica table is full
}

// Forget drops a replica that left the fleet.
func (p *PreciseIndex) Forget(replica string) {
	p.mu.Lock()
	delete(p.sources, replica)
	delete(p.models, replica)
	p.mu.Unlock()
	p.gen.forget(replica)
	p.ix.Clear(replica)
}

// CachesGenerated reports whether the replica's KV cache keeps the blocks
// its generated tokens fill, as vLLM's does (and llm-d-inference-sim's
// does not), so that a completed turn's output is a cache hit for the
// next turn. A replica whose events have not shown it yet is assumed not
// to (a prediction too low costs less than one too high); one that sends
// no events, vLLM's default.
func (p *PreciseIndex) CachesGenerated(replica string) bool {
	return !p.Receiving(replica) || p.gen.seen(replica)
}

// Receiving reports whether the replica's KV events have ever arrived.
func (p *PreciseIndex) Receiving(replica string) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.sources[replica] != nil
}

// Keys returns the block keys of a prompt of tokens.
func (p *PreciseIndex) Keys(tokens []uint32, model, salt string) []uint64 {
	return p.ix.Keys(tokens, blockindex.Root{Model: model, CacheSalt: salt})
}

// MatchTokens returns, aligned with names, how many prompt tokens each
// replica holds cached as far as the index knows. Like vLLM, at least the
// last prompt token is always computed, so a full hit counts
// promptTokens−1; and an engine hits whole blocks of its own size
// (engineBlocks, aligned with names; 0 or nil when unknown), which speculative
// entries in the index's smaller blocks may not be.
func (p *PreciseIndex) MatchTokens(keys []uint64, names []string, promptTokens int, engineBlocks []int) []int {
	gpu, _ := p.MatchTiers(keys, names, promptTokens, engineBlocks)
	return gpu
}

// MatchTiers is MatchTokens for both tiers: the tokens held on GPU, and
// those after them held in the CPU tier (all zero: cpu is nil).
func (p *PreciseIndex) MatchTiers(keys []uint64, names []string, promptTokens int, engineBlocks []int) (gpu, cpu []int) {
	hits := p.ix.Match(keys, names, nil)
	gpu = make([]int, len(names))
	var cpuTokens []int
	limit := max(0, promptTokens-1)
	for i, h := range hits {
		bs := 1
		if i < len(engineBlocks) && engineBlocks[i] > 0 {
			bs = engineBlocks[i]
		}
		gpu[i] = min(h.Blocks*p.blockSize, limit) / bs * bs
		if h.CPU == 0 {
			continue
		}
		if cpuTokens == nil {
			cpuTokens = make([]int, len(names))
		}
		cpuTokens[i] = min((h.Blocks+h.CPU)*p.blockSize, limit)/bs*bs - gpu[i]
	}
	return gpu, cpuTokens
}

// Holds reports whether replica holds the block with the given key, on
// GPU or in its CPU tier (which a continuing turn loads back).
func (p *PreciseIndex) Holds(replica string, key uint64) bool {
	gpu, cpu := p.Tiers(replica, key)
	return gpu || cpu
}

// Tiers reports whether replica holds the block with the given key on
// GPU, and whether in its CPU tier.
func (p *PreciseIndex) Tiers(replica string, key uint64) (gpu, cpu bool) {
	var buf [1]blockindex.Hit
	h := p.ix.Match([]uint64{key}, []string{replica}, buf[:0])[0]
	return h.Blocks == 1, h.CPU == 1
}

// Speculate records that replica is about to hold keys' blocks, for ttl
// unless their events confirm them.
func (p *PreciseIndex) Speculate(replica string, keys []uint64, ttl time.Duration) {
	p.ix.AddSpeculative(replica, keys, ttl)
}

// indexCollector exposes the index's size per replica at scrape time.
type indexCollector struct{ p *PreciseIndex }

var (
	indexEntriesDesc = prometheus.NewDesc("warmpath_index_entries", "Prefix-index (block, replica) entries per replica, speculative included.", []string{"replica"}, nil)
	indexSpecDesc    = prometheus.NewDesc("warmpath_index_speculative_entries", "Speculative prefix-index entries per replica, awaiting their KV events.", []string{"replica"}, nil)
	indexKeysDesc    = prometheus.NewDesc("warmpath_index_keys", "Distinct block keys in the prefix index.", nil, nil)
	indexEvictDesc   = prometheus.NewDesc("warmpath_index_evictions_total", "Index entries evicted because the index was full.", nil, nil)
	indexSkipDesc    = prometheus.NewDesc("warmpath_index_skipped_events_total", "KV events the index could not apply, by reason.", []string{"reason"}, nil)
	indexSpecOutDesc = prometheus.NewDesc("warmpath_index_speculative_total", "Speculative entries by outcome: confirmed by an event, or expired.", []string{"outcome"}, nil)
	indexCPUDesc     = prometheus.NewDesc("warmpath_index_cpu_entries", "Block keys per replica in the prefix index's CPU tier (blocks the engine offloaded to CPU memory).", []string{"replica"}, nil)
	indexStoredDesc  = prometheus.NewDesc("warmpath_index_stored_blocks_total", "Engine blocks of applied BlockStored events, by tier (the medium: GPU, CPU).", []string{"tier"}, nil)
	indexRemovedDesc = prometheus.NewDesc("warmpath_index_removed_blocks_total", "Engine blocks of applied BlockRemoved events, by tier (the medium: GPU, CPU).", []string{"tier"}, nil)
	indexCPUEvDesc   = prometheus.NewDesc("warmpath_index_cpu_evictions_total", "CPU-tier keys evicted because a replica's tier was full (its num_cpu_blocks; store-only tiers such as LMCache report no removals).", nil, nil)
)

func (c indexCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{indexEntriesDesc, indexSpecDesc, indexKeysDesc, indexEvictDesc, indexSkipDesc, indexSpecOutDesc,
		indexCPUDesc, indexStoredDesc, indexRemovedDesc, indexCPUEvDesc} {
		ch <- d
	}
}

func (c indexCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.p.ix.Stats()
	for name, r := range s.Replicas {
		ch <- prometheus.MustNewConstMetric(indexEntriesDesc, prometheus.GaugeValue, float64(r.Entries), name)
		ch <- prometheus.MustNewConstMetric(indexSpecDesc, prometheus.GaugeValue, float64(r.Speculative), name)
		ch <- prometheus.MustNewConstMetric(indexCPUDesc, prometheus.GaugeValue, float64(r.CPUEntries), name)
	}
	for tier, n := range s.Stored {
		ch <- prometheus.MustNewConstMetric(indexStoredDesc, prometheus.CounterValue, float64(n), string(tier))
	}
	for tier, n := range s.Removed {
		ch <- prometheus.MustNewConstMetric(indexRemovedDesc, prometheus.CounterValue, float64(n), string(tier))
	}
	ch <- prometheus.MustNewConstMetric(indexCPUEvDesc, prometheus.CounterValue, float64(s.CPUEvictions))
	ch <- prometheus.MustNewConstMetric(indexKeysDesc, prometheus.GaugeValue, float64(s.Keys))
	ch <- prometheus.MustNewConstMetric(indexEvictDesc, prometheus.CounterValue, float64(s.Evictions))
	for reason, n := range s.Skipped {
		ch <- prometheus.MustNewConstMetric(indexSkipDesc, prometheus.CounterValue, float64(n), string(reason))
	}
	ch <- prometheus.MustNewConstMetric(indexSpecOutDesc, prometheus.CounterValue, float64(s.Confirmed), "confirmed")
	ch <- prometheus.MustNewConstMetric(indexSpecOutDesc, prometheus.CounterValue, float64(s.Expired), "expired")
}

// ApproxIndex is the tokenizer-free index: chunks of the conversation's
// text, and where the gateway sent them.
type ApproxIndex struct {
	a *blockindex.Approx
}

func newApproxIndex(chunkBytes int) (*ApproxIndex, error) {
	a, err := blockindex.NewApprox(blockindex.ApproxConfig{ChunkBytes: chunkBytes})
	if err != nil {
		return nil, err
	}
	return &ApproxIndex{a: a}, nil
}

// Keys returns the chunk keys of a prompt's text.
func (a *ApproxIndex) Keys(text []byte, model, salt string) []uint64 {
	return a.a.AppendKeys(nil, string(text), blockindex.Root{Model: model, CacheSalt: salt})
}

// MatchTokens estimates cached tokens from matched chunks at
// bytesPerToken (0: request.DefaultBytesPerToken), the same estimate the request's
// prompt length uses.
func (a *ApproxIndex) MatchTokens(keys []uint64, names []string, promptTokens int, bytesPerToken float64) []int {
	if bytesPerToken <= 0 {
		bytesPerToken = request.DefaultBytesPerToken
	}
	hits := a.a.Match(keys, names, nil)
	out := make([]int, len(names))
	for i, h := range hits {
		out[i] = min(int(float64(h.Blocks*a.a.ChunkBytes())/bytesPerToken), max(0, promptTokens-1))
	}
	return out
}

// Record remembers that replica was sent the chunks keys.
func (a *ApproxIndex) Record(replica string, keys []uint64) { a.a.Record(replica, keys) }

// Seen reports whether any of replicas was sent a prompt whose first chunk
// is key, as far as the index still remembers.
func (a *ApproxIndex) Seen(key uint64, replicas []string) bool {
	var buf [64]blockindex.Hit
	dst := buf[:0]
	if len(replicas) > len(buf) {
		dst = nil
	}
	for _, h := range a.a.Match([]uint64{key}, replicas, dst) {
		if h.Blocks > 0 {
			return true
		}
	}
	return false
}

// SizeTo sizes a replica's memory of sent chunks to its KV capacity, as the
// Inference Extension's approximate producer auto-tunes from vLLM's
// cache_config_info.
func (a *ApproxIndex) SizeTo(replica string, kvTokens int) {
	if kvTokens > 0 {
		_ = a.a.SetCapacity(replica, blockindex.ApproxCapacity(kvTokens, a.a.ChunkBytes()))
	}
}

// genRun is how many one-block stores in a row, each chaining from the
// last, show an engine caching the blocks its generated tokens fill:
// decoding fills a request's blocks one at a time, a step apart (the
// prompt's partial last block, then each further block), while a prompt's
// blocks are stored together when its prefill covers them. Two is what an
// answer of 17 tokens or more produces, so a default engine is recognised
// on its first ordinary turn; a prompt-only engine would need two turns in
// a row each adding exactly one block (or prefill chunks of one block).
const genRun = 2

// genTrack bounds the one-block stores remembered per (replica, rank)
// while looking for a run; past it they are forgotten and the search
// starts over.
const genTrack = 4096

// genDetector learns, from each replica's KV events, whether it caches the
// blocks generated tokens fill: a chain of genRun one-block GPU stores.
// It is safe for concurrent use.
type genDetector struct {
	mu    sync.Mutex                   // guards runs and found
	runs  map[genSource]map[uint64]int // engine hash of a one-block store → its run length
	found map[string]bool
}

type genSource struct {
	replica string
	rank    int
}

func (d *genDetector) observe(replica string, b kvevents.Batch) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.found[replica] {
		return
	}
	src := genSource{replica, b.Rank()}
	for _, ev := range b.Events {
		st, ok := ev.(*kvevents.BlockStored)
		if !ok || len(st.BlockHashes) != 1 || st.ParentBlockHash == nil || (st.Medium != "" && st.Medium != "GPU") {
			continue
		}
		if d.runs == nil {
			d.runs, d.found = map[genSource]map[uint64]int{}, map[string]bool{}
		}
		m := d.runs[src]
		if m == nil || len(m) >= genTrack {
			m = map[uint64]int{}
			d.runs[src] = m
		}
		n := m[*st.ParentBlockHash] + 1
		if n >= genRun {
			d.found[replica] = true
			for s := range d.runs {
				if s.replica == replica {
					delete(d.runs, s)
				}
			}
			return
		}
		m[st.BlockHashes[0]] = n
	}
}

func (d *genDetector) seen(replica string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.found[replica]
}

func (d *genDetector) forget(replica string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.found, replica)
	for s := range d.runs {
		if s.replica == replica {
			delete(d.runs, s)
		}
	}
}

// Blocks returns the block index itself: its statistics, its CPU tiers'
// sizes, and (in tests) its raw matches.
func (p *PreciseIndex) Blocks() *blockindex.Index { return p.ix }
