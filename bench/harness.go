package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/warmpath/warmpath/vllmsim"
)

// AgenticHarness is the agentic workload shaped as coding agents run: every
// run opens with the same harness (a system prompt and tool schemas of
// HarnessTokens, several cache blocks long, identical for all runs), then
// its own task; the turns append each streamed reply and a tool result
// after a pause drawn as published for Claude Code sessions (the gap
// between turns has median 2 s, 90th percentile 24 s, 99th 11 minutes;
// see ClaudePause); and a turn of the main agent fans out, with
// probability FanOutProb, up to FanOut sub-agents, played concurrently,
// each a conversation of its own that opens with the same harness and a
// brief of its own. The main agent resumes when they are done, with a tool
// result.
//
// Every request names its run as Claude Code does, with
// X-Claude-Code-Session-Id; sub-agents add X-Claude-Code-Agent-Id. The run
// and its sub-agents thus share one session id while each is a
// conversation of its own, the shape in which a router that keys
// affinity on the session id alone pins them all together, and one that
// keys on the first blocks of the prompt finds only the harness.
//
// Concurrency is sized as Agentic's, on each run's own context (the
// harness is cached once per replica): the active runs fill Fill of the
// fleet's KV cache besides one harness copy per replica.
//
// The zero value has the defaults; fields override them.
type AgenticHarness struct {
	// HarnessTokens is the shared system prompt and tool schemas at full
	// scale; default 12,000.
	HarnessTokens int
	// TaskTokens is each run's own first message at full scale; default
	// 1,000. BriefTokens is each sub-agent's; default 600.
	TaskTokens, BriefTokens int
	// Turns is the mean number of turns of a run, drawn uniformly from
	// [Turns/2, 3·Turns/2]; default 16. SubTurns is a sub-agent's; default
	// 6.
	Turns, SubTurns int
	// ReplyMin and ReplyMax bound each reply (ignore_eos, full scale);
	// default 100 and 300. ToolMin and ToolMax bound each tool result;
	// default 200 and 600.
	ReplyMin, ReplyMax, ToolMin, ToolMax int
	// FanOutProb is the chance that a main-agent turn fans out; default
	// 0.12. FanOut bounds the sub-agents per fan-out (drawn uniformly from
	// 1 to FanOut); default 3.
	FanOutProb float64
	FanOut     int
	// Fill is the fraction of the fleet's KV cache (less one harness per
	// replica) the active runs' own contexts fill; default 0.75.
	Fill float64
	// Window is how long runs keep arriving; default 1.5 nominal run
	// lengths.
	Window time.Duration
}

func (a AgenticHarness) withDefaults() AgenticHarness {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&a.HarnessTokens, 12000)
	def(&a.TaskTokens, 1000)
	def(&a.BriefTokens, 600)
	def(&a.Turns, 16)
	def(&a.SubTurns, 6)
	if a.ReplyMin == 0 && a.ReplyMax == 0 {
		a.ReplyMin, a.ReplyMax = 100, 300
	}
	if a.ToolMin == 0 && a.ToolMax == 0 {
		a.ToolMin, a.ToolMax = 200, 600
	}
	if a.FanOutProb == 0 {
		a.FanOutProb = 0.12
	}
	def(&a.FanOut, 3)
	if a.Fill == 0 {
		a.Fill = 0.75
	}
	return a
}

// Name implements Workload.
func (*AgenticHarness) Name() string { return "agentic-harness" }

// claudePauseKnots are quantiles of the gap between a coding agent's turns
// (llm-d's agentic guides, on a Weka trace of 219 Claude Code sessions:
// median 2 s, 99th percentile 11.4 minutes; the 90th percentile,
// 24 s), with a floor of half a second and a 30-minute cap.
var claudePauseKnots = []struct{ q, seconds float64 }{
	{0, 0.5}, {0.5, 2}, {0.9, 24}, {0.99, 684}, {1, 1800},
}

// ClaudePause draws a pause between turns from claudePauseKnots,
// interpolating the quantile function linearly in log time.
func ClaudePause(rng *rand.Rand) time.Duration {
	u := rng.Float64()
	k := claudePauseKnots
	for i := 1; i < len(k); i++ {
		if u <= k[i].q {
			f := (u - k[i-1].q) / (k[i].q - k[i-1].q)
			s := math.Exp(math.Log(k[i-1].seconds) + f*(math.Log(k[i].seconds)-math.Log(k[i-1].seconds)))
			return time.Duration(s * float64(time.Second))
		}
	}
	return time.Duration(k[len(k)-1].seconds * float64(time.Second))
}

// meanClaudePause is ClaudePause's mean, in seconds (the integral of the
// log-linear quantile function).
func meanClaudePause() float64 {
	k := claudePauseKnots
	var m float64
	for i := 1; i < len(k); i++ {
		a, b := k[i-1].seconds, k[i].seconds
		m += (k[i].q - k[i-1].q) * (b - a) / math.Log(b/a)
	}
	return m
}

// harnessSizing is the arithmetic of the doc comment, at full scale.
type harnessSizing struct {
	ownContext float64       // a run's own mean context, tokens
	active     int           // runs at once
	runLength  time.Duration // nominal
	rate       float64       // runs per simulated second
}

func (a AgenticHarness) sizing(replicas, kvTokensFull int) harnessSizing {
	meanReply := float64(a.ReplyMin+a.ReplyMax) / 2
	meanTool := float64(a.ToolMin+a.ToolMax) / 2
	var s harnessSizing
	s.ownContext = float64(a.TaskTokens) + float64(a.Turns-1)/2*(meanReply+meanTool)
	free := max(0, float64(kvTokensFull)-float64(a.HarnessTokens))
	s.active = max(1, int(math.Round(a.Fill*float64(replicas)*free/s.ownContext)))
	turn := meanClaudePause() + 0.1 + meanReply*0.017
	// A fan-out adds its sub-agents' turns, played concurrently.
	turns := float64(a.Turns) * (1 + a.FanOutProb*float64(a.SubTurns))
	s.runLength = time.Duration(turns * turn * float64(time.Second))
	s.rate = float64(s.active) / s.runLength.Seconds()
	return s
}

// Plan implements Workload.
func (ah *AgenticHarness) Plan(env Env) (*Plan, error) {
	a := ah.withDefaults()
	if env.Replicas < 1 {
		return nil, fmt.Errorf("bench: agentic-harness: %d replicas", env.Replicas)
	}
	sz := a.sizing(env.Replicas, env.fullKVTokens())
	window := a.Window
	if window == 0 {
		window = sz.runLength * 3 / 2
	}
	h := newHarness(a, env)
	arrivals := workloadRand(env.Seed, "agentic-harness/arrivals")
	mean := time.Duration(float64(time.Second) / sz.rate)
	var sessions []Session
	for t, i := expDuration(arrivals, mean), 0; t < window; t, i = t+expDuration(arrivals, mean), i+1 {
		id := "run-" + strconv.Itoa(i)
		sessions = append(sessions, Session{Start: t, Header: http.Header{"X-Claude-Code-Session-Id": {id}},
			Script: &harnessRun{harnessConv: harnessConv{a: a, env: env, h: h, id: id, seed: uint64(i)}}})
	}
	sessions = cutSessions(env, sessions)
	params := []Param{
		{"harness", fmt.Sprintf("%d tokens (system + %d tools), shared by every run", env.scaled(a.HarnessTokens), len(h.tools))},
		{"task / brief", fmt.Sprintf("%d / %d tokens", env.scaled(a.TaskTokens), env.scaled(a.BriefTokens))},
		{"turns per run / sub-agent", fmt.Sprintf("uniform %d–%d / %d–%d", max(1, a.Turns/2), a.Turns*3/2, max(1, a.SubTurns/2), a.SubTurns*3/2)},
		{"fan-out", fmt.Sprintf("p %.2f per turn, 1–%d sub-agents at once", a.FanOutProb, a.FanOut)},
		{"pause", fmt.Sprintf("Claude Code gaps: p50 2 s, p90 24 s, p99 11.4 min (mean %.0f s)", meanClaudePause())},
		{"active runs (target)", fmt.Sprintf("%d (own context %.0f tokens full-scale fills %.0f %% of fleet KV)", sz.active, sz.ownContext, 100*a.Fill)},
		{"run arrivals", fmt.Sprintf("Poisson %.3g/s for %v (nominal run %v)", sz.rate, window.Round(time.Second), sz.runLength.Round(time.Second))},
		{"runs", strconv.Itoa(len(sessions))},
	}
	return &Plan{Sessions: sessions, Params: params}, nil
}

// harness is the opening every run shares.
type harness struct {
	system string
	tools  []vllmsim.Tool
}

// newHarness builds the shared harness from the environment's seed: a
// system prompt (40 % of HarnessTokens) and tool schemas (the rest, up to
// twelve tools).
func newHarness(a AgenticHarness, env Env) *harness {
	rng := workloadRand(env.Seed, "agentic-harness/harness")
	target := env.scaled(a.HarnessTokens)
	h := &harness{system: randomWords(rng, max(1, target*2/5))}
	toolBudget := target - target*2/5
	n := min(12, max(1, toolBudget/200))
	h.tools = make([]vllmsim.Tool, n)
	for i := range h.tools {
		h.tools[i] = vllmsim.Tool{Type: "function", Function: vllmsim.ToolFunction{
			Name:        "tool_" + strconv.Itoa(i),
			Description: randomWords(rng, max(1, toolBudget/n-45)),
			Parameters:  json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"query":{"type":"string"}},"required":["path"]}`),
		}}
	}
	return h
}

// harnessRun is one run's main agent. Like agentRun it builds its state
// lazily from a random source of its own.
type harnessRun struct {
	harnessConv
	subs int // sub-agents spawned so far
}

// harnessConv is the part a run and a sub-agent share: a conversation
// that opens with the harness and a first message, then appends each
// reply and a tool result until its turns are done.
type harnessConv struct {
	a    AgenticHarness
	env  Env
	h    *harness
	id   string
	seed uint64

	rng   *rand.Rand
	turns int
	turn  int
	msgs  []vllmsim.Message
}

// open starts the conversation: about meanTurns turns (half to one and a
// half times), the harness, and a first message of first tokens.
func (c *harnessConv) open(rng *rand.Rand, meanTurns, first int) {
	c.rng = rng
	c.turns = uniformInt(rng, max(1, meanTurns/2), meanTurns*3/2)
	c.msgs = []vllmsim.Message{{Role: "system", Content: c.h.system},
		{Role: "user", Content: randomWords(rng, c.env.scaled(first))}}
}

// reply appends prev's reply and a tool result; false once the
// conversation has had its turns.
func (c *harnessConv) reply(prev *Outcome) bool {
	if c.turn >= c.turns {
		return false
	}
	c.msgs = append(c.msgs,
		vllmsim.Message{Role: "assistant", Content: prev.Reply},
		vllmsim.Message{Role: "user", Content: randomWords(c.rng, uniformInt(c.rng, c.env.scaled(c.a.ToolMin), c.env.scaled(c.a.ToolMax)))})
	return true
}

// Next implements Script.
func (r *harnessRun) Next(prev *Outcome) (Turn, bool) {
	if prev == nil {
		r.open(rand.New(rand.NewPCG(uint64(r.env.Seed), 0x68617273<<16|r.seed)), r.a.Turns, r.a.TaskTokens)
	} else if !r.reply(prev) {
		return Turn{}, false
	}
	t := r.a.turn(r.rng, r.env, r.h, r.msgs)
	if r.turn > 0 {
		t.Delay = ClaudePause(r.rng)
	}
	if r.turn+1 < r.turns && r.rng.Float64() < r.a.FanOutProb {
		for range uniformInt(r.rng, 1, r.a.FanOut) {
			t.Spawn = append(t.Spawn, &subAgent{harnessConv{a: r.a, env: r.env, h: r.h,
				id: r.id + "-sub-" + strconv.Itoa(r.subs), seed: r.seed<<16 | uint64(r.subs)}})
			r.subs++
		}
	}
	r.turn++
	return t, true
}

// turn is one request of a harness conversation over msgs.
func (a AgenticHarness) turn(rng *rand.Rand, env Env, h *harness, msgs []vllmsim.Message) Turn {
	return Turn{
		Messages:   msgs[:len(msgs):len(msgs)],
		Tools:      h.tools,
		ToolChoice: "none",
		MaxTokens:  uniformInt(rng, env.scaled(a.ReplyMin), env.scaled(a.ReplyMax)),
		IgnoreEOS:  true,
		WantReply:  true,
	}
}

// subAgent is one sub-agent's conversation: the harness, a brief, and
// SubTurns-ish turns, each naming the sub-agent.
type subAgent struct{ harnessConv }

// Next implements Script.
func (s *subAgent) Next(prev *Outcome) (Turn, bool) {
	if prev == nil {
		s.open(rand.New(rand.NewPCG(uint64(s.env.Seed), 0x737562<<32|s.seed)), s.a.SubTurns, s.a.BriefTokens)
	} else if !s.reply(prev) {
		return Turn{}, false
	}
	t := s.a.turn(s.rng, s.env, s.h, s.msgs)
	t.Header = http.Header{"X-Claude-Code-Agent-Id": {s.id}}
	if s.turn > 0 {
		t.Delay = ClaudePause(s.rng)
	}
	s.turn++
	return t, true
}

var (
	_ Workload = (*AgenticHarness)(nil)
	_ Script   = (*harnessRun)(nil)
	_ Script   = (*subAgent)(nil)
)
