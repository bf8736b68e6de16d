package bench

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// HarnessTraceConfig shapes a synthetic Mooncake-format request log of
// AgenticHarness's shape (see WriteHarnessTrace). The zero value has the
// defaults.
type HarnessTraceConfig struct {
	// Harness is the workload's shape at full scale; zero fields take
	// AgenticHarness's defaults.
	Harness AgenticHarness
	// Runs is how many agent runs the log holds; default 120.
	Runs int
	// Active is how many runs are active at once, on average; default 60.
	Active int
	// Seed seeds every draw; default 1.
	Seed int64
	// Epoch is the first timestamp, in milliseconds: a real log carries
	// epoch milliseconds; default 1,750,000,000,000 (June 2025).
	Epoch float64
	// Sizes, when not nil, draws the first messages, replies and tool
	// results from its distributions instead of Harness's uniform ranges
	// (see RealSizeHarnessTrace).
	Sizes *HarnessSizes
}

// harnessRecord is one line of the log.
type harnessRecord struct {
	at     float64 // seconds from the start
	input  int
	output int
	ids    []int64
	conv   uint64  // the conversation's id
	pause  float64 // seconds since the conversation's previous turn ended, 0 on its first
}

// WriteHarnessTrace writes a synthetic Mooncake-format trace of coding-
// agent runs: every run opens with the same multi-block harness, takes
// turns that append a reply and a tool result after a Claude Code pause,
// and fans out sub-agents that share the harness and get briefs of their
// own, as AgenticHarness plays them live. Hash ids follow Mooncake's
// rules: a full 512-token block keeps its id as the conversation grows, a
// partial last block gets a new one each turn, and blocks wholly inside
// the harness are shared by every run. Timestamps are epoch milliseconds.
// Runs arrive as a Poisson process sized for Active runs at once; a turn
// takes 15 ms per output token after a second of prefill and queueing.
func WriteHarnessTrace(w io.Writer, cfg HarnessTraceConfig) error {
	recs := harnessRecords(cfg)
	bw := bufio.NewWriter(w)
	for _, r := range recs {
		line, err := json.Marshal(struct {
			Timestamp    float64 `json:"timestamp"`
			InputLength  int     `json:"input_length"`
			OutputLength int     `json:"output_length"`
			HashIDs      []int64 `json:"hash_ids"`
		}{math.Round(cfg.epoch() + 1000*r.at), r.input, r.output, r.ids})
		if err != nil {
			return fmt.Errorf("bench: harness trace: %w", err)
		}
		bw.Write(line)
		bw.WriteByte('\n')
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("bench: harness trace: %w", err)
	}
	return nil
}

func (cfg HarnessTraceConfig) epoch() float64 {
	if cfg.Epoch == 0 {
		return 1_750_000_000_000
	}
	return cfg.Epoch
}

// harnessRecords generates the log's records in time order.
func harnessRecords(cfg HarnessTraceConfig) []harnessRecord {
	if cfg.Runs == 0 {
		cfg.Runs = 120
	}
	if cfg.Active == 0 {
		cfg.Active = 60
	}
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	a := cfg.Harness.withDefaults()
	env := Env{Seed: cfg.Seed, Scale: 1}
	runLength := a.sizing(8, 307328).runLength.Seconds()
	if cfg.Sizes != nil {
		runLength = cfg.Sizes.runLength(a)
	}
	mean := runLength / float64(cfg.Active)
	arrivals := workloadRand(cfg.Seed, "harness-trace/arrivals")
	var recs []harnessRecord
	t := 0.0
	for i := range cfg.Runs {
		t += arrivals.ExpFloat64() * mean
		g := &convGen{a: a, sizes: cfg.Sizes, env: env, id: uint64(i) + 1, recs: &recs}
		g.run(t, uint64(i))
	}
	slices.SortStableFunc(recs, func(x, y harnessRecord) int { return cmp.Compare(x.at, y.at) })
	return recs
}

// convGen generates one run's records (and its sub-agents').
type convGen struct {
	a     AgenticHarness
	sizes *HarnessSizes // nil: a's uniform ranges
	env   Env
	id    uint64 // conversation ids: runs 1…, sub-agents above 1<<32
	subs  uint64
	recs  *[]harnessRecord
}

// run plays a main agent starting at t; it returns when its last turn
// ends.
func (g *convGen) run(t float64, seed uint64) float64 {
	rng := workloadRand(int64(seed)+g.env.Seed<<20, "harness-trace/run")
	return g.play(t, g.id, rng, g.a.Turns, g.a.TaskTokens, true)
}

// sub plays a sub-agent conversation id starting at t and returns when it
// ends.
func (g *convGen) sub(t float64, id uint64) float64 {
	rng := workloadRand(int64(id), "harness-trace/sub")
	return g.play(t, id, rng, g.a.SubTurns, g.a.BriefTokens, false)
}

// play emits conversation id's turns from t: about meanTurns of them (half
// to one and a half times) over the harness and a first message of first
// tokens, each after a tool result and a pause; with fanOut, a turn may
// spawn sub-agents, which the conversation waits for. It returns when the
// last turn ends.
func (g *convGen) play(t float64, id uint64, rng *rand.Rand, meanTurns, first int, fanOut bool) float64 {
	turns := uniformInt(rng, max(1, meanTurns/2), meanTurns*3/2)
	length := g.a.HarnessTokens + g.first(rng, first, fanOut)
	pause := 0.0
	for turn := range turns {
		if turn > 0 {
			length += g.tool(rng)
			pause = ClaudePause(rng).Seconds()
			t += pause
		}
		out := g.reply(rng)
		g.emit(id, t, length, out, pause)
		t += 1 + 0.015*float64(out)
		length += out
		if fanOut && turn+1 < turns && rng.Float64() < g.a.FanOutProb {
			end := t
			for range uniformInt(rng, 1, g.a.FanOut) {
				g.subs++
				end = max(end, g.sub(t, g.id<<32|g.subs))
			}
			t = end
		}
	}
	return t
}

// emit records a request of conversation conv at t, pause seconds after
// its previous turn ended, with an input of length tokens: harness blocks keep shared ids, the conversation's full
// blocks ids of their own, and a partial last block an id for this length.
func (g *convGen) emit(conv uint64, t float64, length, out int, pause float64) {
	n := (length + MooncakeBlockTokens - 1) / MooncakeBlockTokens
	ids := make([]int64, n)
	for j := range ids {
		end := (j + 1) * MooncakeBlockTokens
		switch {
		case end <= g.a.HarnessTokens:
			ids[j] = int64(j)
		case end <= length:
			ids[j] = blockID(conv, j, 0)
		default:
			ids[j] = blockID(conv, j, length)
		}
	}
	*g.recs = append(*g.recs, harnessRecord{at: t, input: length, output: out, ids: ids, conv: conv, pause: pause})
}

// blockID names block j of conversation conv (and, for a partial block,
// the prompt length it ends at): a positive id that never collides with
// the harness's small ones.
func blockID(conv uint64, j, length int) int64 {
	var buf [24]byte
	binary.LittleEndian.PutUint64(buf[:8], conv)
	binary.LittleEndian.PutUint64(buf[8:16], uint64(j))
	binary.LittleEndian.PutUint64(buf[16:], uint64(length))
	return int64(xxhash.Sum64(buf[:])>>2) + 1<<20
}
