package vllmsim

import "time"

// Stats is a snapshot of a replica's engine counters. Counters start at zero
// and are reset by a restart (a new process, as vLLM's metrics are).
type Stats struct {
	// Requests is the number of requests submitted to the engine.
	Requests uint64
	// Finished, Aborted count requests that completed or were dropped
	// (client gone, restart).
	Finished, Aborted uint64
	// PromptTokens and CachedTokens sum, over scheduled requests, the prompt
	// length and the prefix-cache hit (tokens) at first scheduling; the hit
	// includes the tokens loaded from the CPU tier, which CPUCachedTokens
	// counts alone.
	PromptTokens, CachedTokens, CPUCachedTokens uint64
	// PrefillTokens counts prefill tokens actually computed (uncached,
	// including recomputation after preemption).
	PrefillTokens uint64
	// GeneratedTokens counts sampled output tokens.
	GeneratedTokens uint64
	// Running and Waiting are the current queue lengths.
	Running, Waiting int
	// KVUsage is the fraction of KV blocks referenced by requests, 0..1.
	KVUsage float64
	// KVBlocksUsed and KVBlocks are the referenced and total block counts.
	KVBlocksUsed, KVBlocks int
	// Evictions counts cached blocks evicted (one BlockRemoved each).
	Evictions uint64
	// CPUBlocksUsed and CPUEvictions are the CPU tier's blocks held and
	// blocks evicted.
	CPUBlocksUsed int
	CPUEvictions  uint64
	// Preemptions counts recompute preemptions.
	Preemptions uint64
	// Steps counts engine steps.
	Steps uint64
	// SimTime is the engine's simulated clock.
	SimTime time.Duration
}

// histograms returns copies of the queue-time and prefill-time
// histograms.
func (e *engine) histograms() (queue, prefill histogram) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.queueHist.clone(), e.prefillHist.clone()
}

// snapshot returns the current Stats and a copy of the TTFT histogram.
func (e *engine) snapshot() (Stats, histogram) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.stats
	st.Running = len(e.running)
	st.Waiting = len(e.waiting) + len(e.inbox)
	st.KVBlocks = len(e.cache.blocks)
	st.KVBlocksUsed = e.cache.used()
	st.KVUsage = float64(st.KVBlocksUsed) / float64(st.KVBlocks)
	st.Evictions = e.cache.evictions
	st.CPUBlocksUsed, st.CPUEvictions = e.cache.cpu.len(), e.cache.cpu.evictions
	st.SimTime = e.vnow
	return st, e.ttftHist.clone()
}

// load returns the waiting and running request counts, for the
// data-parallel balancer.
func (e *engine) load() (waiting, running int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.waiting) + len(e.inbox), len(e.running)
}

// add sums o's counters into st (for a replica's ranks); KVUsage is left
// to the caller and SimTime is the later of the two.
func (st *Stats) add(o Stats) {
	st.Requests += o.Requests
	st.Finished += o.Finished
	st.Aborted += o.Aborted
	st.PromptTokens += o.PromptTokens
	st.CachedTokens += o.CachedTokens
	st.CPUCachedTokens += o.CPUCachedTokens
	st.PrefillTokens += o.PrefillTokens
	st.GeneratedTokens += o.GeneratedTokens
	st.Running += o.Running
	st.Waiting += o.Waiting
	st.KVBlocksUsed += o.KVBlocksUsed
	st.KVBlocks += o.KVBlocks
	st.Evictions += o.Evictions
	st.Preemptions += o.Preemptions
	st.Steps += o.Steps
	st.CPUBlocksUsed += o.CPUBlocksUsed
	st.CPUEvictions += o.CPUEvictions
	st.SimTime = max(st.SimTime, o.SimTime)
}
