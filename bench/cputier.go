package bench

import (
	"fmt"

	"github.com/warmpath/warmpath/scoring"
)

// cpuTier: Analyze's model of a CPU offload tier (AnalyzeConfig.CPUBlocks),
// after vLLM's native offloading connector as vllmsim simulates it. Every
// block a replica's cache stores is also offloaded to an LRU of CPUBlocks
// blocks, touched in the same order. A request hits the longest run of its
// blocks from block 0 on the GPU, then continues that run with blocks the
// CPU tier holds; those are loaded rather than prefilled, at
// scoring.CPUHitCost of a prefilled token's cost, and count as cached (as
// vLLM's cached_tokens counts connector hits). Precise policies see both
// tiers (scoring's Matched and MatchedCPU); the approximate index sees
// neither. A session's tip counts as held while either tier holds it.

// withCPU gives every replica a CPU tier of blocks blocks (none when 0).
func (fl *simFleet) withCPU(universe, blocks int) {
	for _, rp := range fl.reps {
		rp.cpu = nil
		if blocks > 0 {
			rp.cpu = newBlockLRU(universe, blocks)
		}
	}
}

// hit returns the tokens of ids a request of input tokens finds cached on
// the replica (both tiers) and, of those, the ones on the CPU tier.
func (rp *simReplica) hit(ids []int32, input, blockTokens int) (cached, cpu int) {
	gpu := rp.cache.prefix(ids)
	cached = min(gpu*blockTokens, input)
	if rp.cpu == nil {
		return cached, 0
	}
	all := gpu + rp.cpu.prefix(ids[gpu:])
	cpu = min(all*blockTokens, input) - cached
	return cached + cpu, cpu
}

// touch stores ids in the replica's cache and offloads them to its CPU
// tier.
func (rp *simReplica) touch(ids []int32) {
	rp.cache.touch(ids)
	if rp.cpu != nil {
		rp.cpu.touch(ids)
	}
}

// holds reports whether either tier holds block id.
func (rp *simReplica) holds(id int32) bool {
	return rp.cache.contains(id) || rp.cpu != nil && rp.cpu.contains(id)
}

// cpuTokens is the replica's CPU tier in tokens of bt, 0 without one.
func (rp *simReplica) cpuTokens(bt int) int {
	if rp.cpu == nil {
		return 0
	}
	return rp.cpu.capacity * bt
}

// loadCost is the prefill-equivalent work of loading tokens from the CPU
// tier.
func loadCost(tokens int) int { return int(float64(tokens)*scoring.CPUHitCost + 0.5) }

// matchCPU fills, for precise policies on a fleet with CPU tiers, how many
// prompt tokens after each replica's GPU match (matched) its CPU tier
// holds, capped at the prompt's length minus one as the gateway caps them;
// nil otherwise.
func matchCPU(pol *scoring.Policy, fl *simFleet, in *simInput, i int, matched, dst []int) []int {
	if !pol.UsesPrecise || fl.reps[0].cpu == nil {
		return nil
	}
	r := &in.reqs[i]
	ids, bt := in.ids[i], in.blockTokens
	for j, rp := range fl.reps {
		gpu := rp.cache.prefix(ids)
		all := gpu + rp.cpu.prefix(ids[gpu:])
		dst[j] = min(all*bt, max(0, r.InputTokens-1)) - matched[j]
	}
	return dst
}

// cpuParam describes a live benchmark's CPU tier for its report's fleet
// line, "" without one.
func cpuParam(cfg Config) string {
	if n := scaledCPUBlocks(cfg); n > 0 {
		return fmt.Sprintf(", and a CPU offload tier of %d blocks", n)
	}
	return ""
}
