package bench

import (
	"math"
	"math/rand/v2"
	"slices"
)

// TokenDist is a log-normal distribution of token counts: Median·e^(Sigma·Z)
// for a standard normal Z, rounded and clamped to [Min, Max].
type TokenDist struct {
	Median float64
	Sigma  float64
	Min    int
	Max    int
}

// draw returns one count.
func (d TokenDist) draw(rng *rand.Rand) int {
	v := math.Round(d.Median * math.Exp(d.Sigma*rng.NormFloat64()))
	return min(d.Max, max(d.Min, int(v)))
}

// mean returns the distribution's mean before clamping, Median·e^(Sigma²/2).
func (d TokenDist) mean() float64 { return d.Median * math.Exp(d.Sigma*d.Sigma/2) }

// HarnessSizes draws a harness log's token counts from log-normal
// distributions (see HarnessTraceConfig.Sizes).
type HarnessSizes struct {
	// Task is a run's first message (the task and the files read to start
	// it), Brief a sub-agent's.
	Task, Brief TokenDist
	// Reply is each turn's output and Tool each tool result appended
	// before the next turn.
	Reply, Tool TokenDist
}

// runLength is a run's nominal length in seconds for a's turn counts:
// each turn a pause, a second of prefill and queueing and 15 ms per
// output token, with a fan-out's sub-agent turns added.
func (s *HarnessSizes) runLength(a AgenticHarness) float64 {
	turn := meanClaudePause() + 1 + 0.015*s.Reply.mean()
	return float64(a.Turns) * (1 + a.FanOutProb*float64(a.SubTurns)) * turn
}

// Real-size shape of coding-agent runs (RealSizeHarnessTrace), chosen to
// reproduce the published statistics of 219 Claude Code sessions
// (llm-d's agentic guides, Weka trace): a median of 195k input tokens
// and 317 output tokens per turn, 96 % of turns reusing at least 90 % of
// their input, pauses between turns p50 2 s and p99 11.4 minutes
// (ClaudePause).
var realSizeHarness = AgenticHarness{
	HarnessTokens: 16000, // Claude Code's system prompt and tool schemas
	Turns:         120,   // a run has 60–180 turns
	SubTurns:      8,     // a sub-agent 4–12
	FanOutProb:    0.005,
	FanOut:        3,
}

var realSizes = HarnessSizes{
	Task:  TokenDist{Median: 40000, Sigma: 0.7, Min: 1000, Max: 200000},
	Brief: TokenDist{Median: 6000, Sigma: 0.6, Min: 200, Max: 30000},
	Reply: TokenDist{Median: 317, Sigma: 0.9, Min: 16, Max: 8192},
	Tool:  TokenDist{Median: 1200, Sigma: 1.0, Min: 20, Max: 100000},
}

// Defaults of `warmpath analyze --synthetic agentic-real`: 40 runs, 24
// active at once on average (three per replica of an 8-replica fleet).
const (
	RealSizeRuns   = 40
	RealSizeActive = 24
)

// RealSizeHarnessTrace returns the configuration of a harness log at the
// real size of coding agents (see realSizeHarness and realSizes): runs
// runs, active at once on average, drawn from seed.
func RealSizeHarnessTrace(runs, active int, seed int64) HarnessTraceConfig {
	sizes := realSizes
	return HarnessTraceConfig{Harness: realSizeHarness, Runs: runs, Active: active, Seed: seed, Sizes: &sizes}
}

// first returns a conversation's first message: tokens, or with sizes a
// draw of Task (a run's, when run) or Brief.
func (g *convGen) first(rng *rand.Rand, tokens int, run bool) int {
	switch {
	case g.sizes == nil:
		return tokens
	case run:
		return g.sizes.Task.draw(rng)
	default:
		return g.sizes.Brief.draw(rng)
	}
}

// tool returns a tool result's tokens.
func (g *convGen) tool(rng *rand.Rand) int {
	if g.sizes == nil {
		return uniformInt(rng, g.a.ToolMin, g.a.ToolMax)
	}
	return g.sizes.Tool.draw(rng)
}

// reply returns a reply's tokens.
func (g *convGen) reply(rng *rand.Rand) int {
	if g.sizes == nil {
		return uniformInt(rng, g.a.ReplyMin, g.a.ReplyMax)
	}
	return g.sizes.Reply.draw(rng)
}

// MedianPrompt returns the median of t's prompt lengths, in tokens (0 for
// an empty trace).
func MedianPrompt(t *Trace) int {
	if len(t.Requests) == 0 {
		return 0
	}
	in := make([]int, len(t.Requests))
	for i, r := range t.Requests {
		in[i] = r.InputTokens
	}
	slices.Sort(in)
	return in[(len(in)-1)/2]
}

// ConversationBlocks converts cache sizes in conversations (multiples of
// t's median prompt) to blocks of t, rounding to the nearest and at least
// one.
func ConversationBlocks(t *Trace, convs []float64) []int {
	median := float64(MedianPrompt(t))
	out := make([]int, len(convs))
	for i, c := range convs {
		out[i] = max(1, int(math.Round(c*median/float64(max(1, t.BlockTokens)))))
	}
	return out
}
