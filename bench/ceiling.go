package bench

import "time"

// CeilingResult is the prefix-reuse ceiling of a request log: how much of
// its prompts any cache could have served, had it kept everything seen
// within a window.
type CeilingResult struct {
	// Requests is the number of requests considered.
	Requests int64 `json:"requests"`
	// PromptTokens is the sum of their prompt lengths, and CachedTokens the
	// part that repeats a prefix of an earlier request within the window.
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	// Fraction is CachedTokens ÷ PromptTokens (0 for no tokens).
	Fraction float64 `json:"fraction"`
	// PromptBlocks, CachedBlocks and BlockFraction are the same counted in
	// blocks rather than tokens: a partial last block counts as a block.
	PromptBlocks  int64   `json:"prompt_blocks"`
	CachedBlocks  int64   `json:"cached_blocks"`
	BlockFraction float64 `json:"block_fraction"`
}

// Ceiling returns the fraction of prompt tokens in reqs that repeat a
// prefix of an earlier request arriving at most window before (0 means no
// limit): the hit rate of an ideal, shared cache that keeps every block for
// window. reqs must be in arrival order, as ReadTrace returns them.
//
// For each request it finds the longest k such that the request's first k
// block keys were all seen in one earlier request within the window. Block
// keys are chained, so key k−1 alone names the whole k-block prefix, and a
// fresh key implies fresh ancestors: Ceiling keeps each key's last-seen
// time and walks a request's keys until the first stale or unseen one. The
// request is credited k × blockTokens tokens, capped at its InputTokens
// (the last block of a Mooncake request may be partial).
func Ceiling(reqs []TraceRequest, blockTokens int, window time.Duration) CeilingResult {
	var res CeilingResult
	lastSeen := make(map[uint64]time.Duration, len(reqs)*8)
	for i := range reqs {
		r := &reqs[i]
		k := 0
		for _, key := range r.Blocks {
			t, ok := lastSeen[key]
			if !ok || (window > 0 && r.Arrival-t > window) {
				break
			}
			k++
		}
		for _, key := range r.Blocks {
			lastSeen[key] = r.Arrival
		}
		res.Requests++
		res.PromptTokens += int64(r.InputTokens)
		res.CachedTokens += int64(min(k*blockTokens, r.InputTokens))
		res.PromptBlocks += int64(len(r.Blocks))
		res.CachedBlocks += int64(k)
	}
	res.Fraction = ratio(res.CachedTokens, res.PromptTokens)
	res.BlockFraction = ratio(res.CachedBlocks, res.PromptBlocks)
	return res
}

// ratio returns a ÷ b, or 0 when b is 0.
func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
