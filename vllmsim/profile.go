package vllmsim

import (
	"fmt"
	"time"
)

// Profile is the simulated hardware and model: KV capacity, scheduler
// limits and the step-time model
//
//	step = StepBase + PrefillPerToken × prefill tokens
//	       + DecodePerSeq × scheduled sequences
//	       + DecodePerContextToken × context tokens of decoding sequences
//	       + CPULoadPerToken × tokens loaded from the CPU tier
//
// A zero field takes the DefaultProfile value when the profile is resolved
// by NewFleet.
type Profile struct {
	// Name labels the profile in logs.
	Name string
	// KVBlocks is the number of KV-cache blocks (vLLM's num_gpu_blocks).
	KVBlocks int
	// BlockSize is the number of tokens per block.
	BlockSize int
	// MaxNumBatchedTokens is the token budget of one step (prefill chunks
	// plus one token per decoding sequence).
	MaxNumBatchedTokens int
	// MaxNumSeqs is the most sequences running at once.
	MaxNumSeqs int
	// MaxModelLen is the longest prompt plus output, in tokens.
	MaxModelLen int
	// StepBase is the fixed cost of a step (reading the weights once).
	StepBase time.Duration
	// PrefillPerToken is the cost of one prefill token.
	PrefillPerToken time.Duration
	// DecodePerSeq is the cost of each sequence in a step.
	DecodePerSeq time.Duration
	// DecodePerContextToken is the attention cost (KV reads) of one context
	// token of a decoding sequence, per step.
	DecodePerContextToken time.Duration
	// CPULoadPerToken is the cost of loading one token's KV from the CPU
	// offload tier back to the GPU (Config.CPUBlocks), paid in the step
	// that admits the request instead of PrefillPerToken.
	CPULoadPerToken time.Duration
}

// DefaultProfile approximates Qwen3-32B (BF16) served by vLLM on 2×H100 80GB
// with tensor parallelism 2, the per-pod setup of llm-d's "KV-Cache Wins You
// Can See" benchmark (shared/reference/peers.md §2.1).
//
// Sources and estimates:
//   - KVBlocks 19,208 × BlockSize 16 = 307,328 KV tokens: the per-pod KV
//     capacity reported by that benchmark (measured by vLLM there).
//   - MaxNumBatchedTokens 8192 and MaxNumSeqs 256: vLLM's defaults for
//     online serving on an H100-class GPU with chunked prefill.
//   - MaxModelLen 131,072: Qwen3 with YaRN rope scaling ×4 (the replayed
//     trace has prompts up to 123k tokens; native is 32,768).
//   - PrefillPerToken 66.7 µs (≈15,000 prefill tokens/s) — an estimate:
//     2 × 32.8 G parameters ≈ 66 GFLOP per token on ~2 × 990 TFLOP/s dense
//     BF16 at ~50 % utilisation.
//   - StepBase 11 ms — an estimate: the 65.6 GB of weights read once per
//     step at ~6 TB/s effective across two GPUs, plus launch and sampling
//     overhead.
//   - DecodePerSeq 40 µs and DecodePerContextToken 25 ns — estimates:
//     per-sequence sampling and scheduling work, and the attention's KV reads
//     (64 layers × 8 KV heads × 128 × 2 × 2 B ≈ 256 KiB per token, about
//     40 ns per token at 6.7 TB/s peak; 25 ns assumes overlap with the weight
//     reads). Together a step with 32 sequences at 4k context takes ≈15 ms.
//   - CPULoadPerToken 2.6 µs — an estimate: each GPU of the TP=2 pair loads
//     its half of a token's 256 KiB of KV (128 KiB) over its own PCIe Gen5
//     x16 link (64 GB/s per direction, ~50 GB/s achieved with pinned
//     buffers and DMA, the copy method vLLM's offloading connector uses
//     since 0.12). That makes a CPU hit about 25× cheaper than prefilling
//     the same tokens, at the top of the 2–22× faster time to first token
//     vLLM's blog reports for CPU-cached prompts (blog.vllm.ai,
//     2026-01-08, "KV offloading connector"), whose TTFT also pays the
//     rest of the step; a GPU hit costs nothing.
func DefaultProfile() Profile {
	return Profile{
		Name:                  "qwen3-32b-2xh100-tp2",
		KVBlocks:              19208,
		BlockSize:             16,
		MaxNumBatchedTokens:   8192,
		MaxNumSeqs:            256,
		MaxModelLen:           131072,
		StepBase:              11 * time.Millisecond,
		PrefillPerToken:       time.Second / 15000,
		DecodePerSeq:          40 * time.Microsecond,
		DecodePerContextToken: 25 * time.Nanosecond,
		CPULoadPerToken:       2600 * time.Nanosecond,
	}
}

// withDefaults fills zero fields from DefaultProfile.
func (p Profile) withDefaults() Profile {
	d := DefaultProfile()
	if p.Name == "" {
		p.Name = d.Name
	}
	if p.KVBlocks == 0 {
		p.KVBlocks = d.KVBlocks
	}
	if p.BlockSize == 0 {
		p.BlockSize = d.BlockSize
	}
	if p.MaxNumBatchedTokens == 0 {
		p.MaxNumBatchedTokens = d.MaxNumBatchedTokens
	}
	if p.MaxNumSeqs == 0 {
		p.MaxNumSeqs = d.MaxNumSeqs
	}
	if p.MaxModelLen == 0 {
		p.MaxModelLen = d.MaxModelLen
	}
	if p.StepBase == 0 {
		p.StepBase = d.StepBase
	}
	if p.PrefillPerToken == 0 {
		p.PrefillPerToken = d.PrefillPerToken
	}
	if p.DecodePerSeq == 0 {
		p.DecodePerSeq = d.DecodePerSeq
	}
	if p.DecodePerContextToken == 0 {
		p.DecodePerContextToken = d.DecodePerContextToken
	}
	if p.CPULoadPerToken == 0 {
		p.CPULoadPerToken = d.CPULoadPerToken
	}
	return p
}

func (p Profile) validate() error {
	switch {
	case p.KVBlocks < 1:
		return fmt.Errorf("vllmsim: KV blocks %d < 1", p.KVBlocks)
	case p.BlockSize < 1:
		return fmt.Errorf("vllmsim: block size %d < 1", p.BlockSize)
	case p.MaxNumBatchedTokens < 1:
		return fmt.Errorf("vllmsim: max_num_batched_tokens %d < 1", p.MaxNumBatchedTokens)
	case p.MaxNumSeqs < 1:
		return fmt.Errorf("vllmsim: max_num_seqs %d < 1", p.MaxNumSeqs)
	case p.MaxModelLen < 2:
		return fmt.Errorf("vllmsim: max_model_len %d < 2", p.MaxModelLen)
	case p.StepBase < 0 || p.PrefillPerToken < 0 || p.DecodePerSeq < 0 || p.DecodePerContextToken < 0 || p.CPULoadPerToken < 0:
		return fmt.Errorf("vllmsim: negative step cost in profile %q", p.Name)
	}
	return nil
}

// stepTime is the simulated duration of a step.
func (p *Profile) stepTime(prefillTokens, seqs, contextTokens, loadedTokens int) time.Duration {
	return p.StepBase + time.Duration(prefillTokens)*p.PrefillPerToken +
		time.Duration(seqs)*p.DecodePerSeq + time.Duration(contextTokens)*p.DecodePerContextToken +
		time.Duration(loadedTokens)*p.CPULoadPerToken
}
