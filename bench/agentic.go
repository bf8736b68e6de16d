package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/warmpath/warmpath/vllmsim"
)

// Agentic is a fleet of coding-agent runs. Each run opens with its own
// context (system prompt, tool definitions and task; distinct per run),
// then takes about Turns turns; each turn streams a reply, and the next
// turn appends that reply (the text actually streamed) and a tool result
// of a few hundred tokens, after a think/tool pause. Runs arrive as a
// Poisson process.
//
// Concurrency is sized so that the fleet's cache holds the active runs only
// if each run's turns stay on one replica. A run's context grows from
// ContextTokens by a reply and a tool result per turn, so over a run it
// averages
//
//	mean context = ContextTokens + (Turns − 1)/2 × (mean reply + mean tool result)
//	             = 15,000 + 14.5 × (200 + 400) = 23,700 tokens at full scale,
//
// and the number of runs active at once is
//
//	active = Fill × replicas × KV tokens per replica ÷ mean context
//	       = 0.75 × 8 × 307,328 ÷ 23,700 ≈ 78 on the default fleet.
//
// Kept on one replica each, they fill 75 % of the fleet's KV cache. A
// cache-blind policy spreads each run's turns over all replicas, so each
// replica would need every active run's context, 8 × 0.75 = 6 times its
// capacity: its LRU thrashes and a turn finds its prefix only when it lands
// where the run's previous turn ran (one time in 8 under round-robin) and
// the blocks survived meanwhile.
//
// Runs arrive at rate active ÷ nominal run length, where the nominal run
// length is Turns × (Pause + 0.1 s + mean reply × decode step), the decode
// step taken from the default profile with active/replicas sequences of
// mean context (≈ 17 ms, so ≈ 6.6 s a turn and ≈ 200 s a run), for Window
// (default 1.5 nominal run lengths; Env.Duration cuts it).
//
// The zero value has the defaults; fields override them.
type Agentic struct {
	// ContextTokens is the opening context at full scale: system prompt,
	// tool definitions and task; default 15,000.
	ContextTokens int
	// Turns is the mean number of turns; each run draws uniformly from
	// [Turns−10, Turns+10] (at least 1); default 30.
	Turns int
	// ReplyMin and ReplyMax bound each reply's length (ignore_eos, full
	// scale, drawn uniformly); default 100 and 300.
	ReplyMin, ReplyMax int
	// ToolMin and ToolMax bound each tool result's length (full scale,
	// drawn uniformly); default 200 and 600.
	ToolMin, ToolMax int
	// Pause is the mean of the exponential think/tool pause between turns,
	// simulated; default 3 s.
	Pause time.Duration
	// Fill is the fraction of the fleet's KV cache the active runs'
	// contexts fill when each stays on one replica; default 0.75.
	Fill float64
	// Window is how long runs keep arriving; default 1.5 nominal run
	// lengths.
	Window time.Duration
}

func (a Agentic) withDefaults() Agentic {
	if a.ContextTokens == 0 {
		a.ContextTokens = 15000
	}
	if a.Turns == 0 {
		a.Turns = 30
	}
	if a.ReplyMin == 0 && a.ReplyMax == 0 {
		a.ReplyMin, a.ReplyMax = 100, 300
	}
	if a.ToolMin == 0 && a.ToolMax == 0 {
		a.ToolMin, a.ToolMax = 200, 600
	}
	if a.Pause == 0 {
		a.Pause = 3 * time.Second
	}
	if a.Fill == 0 {
		a.Fill = 0.75
	}
	return a
}

// Name implements Workload.
func (*Agentic) Name() string { return "agentic" }

// agentSizing is the arithmetic of the doc comment, at full scale.
type agentSizing struct {
	meanContext float64       // tokens
	active      int           // runs at once
	step        time.Duration // nominal decode step
	runLength   time.Duration // nominal
	rate        float64       // runs per simulated second
}

func (a Agentic) sizing(replicas, kvTokensFull int) agentSizing {
	meanReply := float64(a.ReplyMin+a.ReplyMax) / 2
	meanTool := float64(a.ToolMin+a.ToolMax) / 2
	var s agentSizing
	s.meanContext = float64(a.ContextTokens) + float64(a.Turns-1)/2*(meanReply+meanTool)
	s.active = max(1, int(math.Round(a.Fill*float64(replicas)*float64(kvTokensFull)/s.meanContext)))
	p := vllmsim.DefaultProfile()
	seqs := float64(s.active) / float64(replicas)
	s.step = p.StepBase + time.Duration(seqs*float64(p.DecodePerSeq)) +
		time.Duration(seqs*s.meanContext*float64(p.DecodePerContextToken))
	turn := a.Pause + 100*time.Millisecond + time.Duration(meanReply*float64(s.step))
	s.runLength = time.Duration(a.Turns) * turn
	s.rate = float64(s.active) / s.runLength.Seconds()
	return s
}

// Plan implements Workload.
func (ag *Agentic) Plan(env Env) (*Plan, error) {
	a := ag.withDefaults()
	if env.Replicas < 1 {
		return nil, fmt.Errorf("bench: agentic: %d replicas", env.Replicas)
	}
	sz := a.sizing(env.Replicas, env.fullKVTokens())
	window := a.Window
	if window == 0 {
		window = sz.runLength * 3 / 2
	}

	arrivals := workloadRand(env.Seed, "agentic/arrivals")
	mean := time.Duration(float64(time.Second) / sz.rate)
	var sessions []Session
	for t, i := expDuration(arrivals, mean), 0; t < window; t, i = t+expDuration(arrivals, mean), i+1 {
		sessions = append(sessions, Session{Start: t, Script: &agentRun{a: a, env: env, seed: uint64(i)}})
	}
	sessions = cutSessions(env, sessions)

	params := []Param{
		{"opening context", fmt.Sprintf("%d tokens (system + tools + task, distinct per run)", env.scaled(a.ContextTokens))},
		{"turns per run", fmt.Sprintf("uniform %d–%d", max(1, a.Turns-10), a.Turns+10)},
		{"reply / tool result", fmt.Sprintf("%d–%d / %d–%d tokens", env.scaled(a.ReplyMin), env.scaled(a.ReplyMax), env.scaled(a.ToolMin), env.scaled(a.ToolMax))},
		{"pause", fmt.Sprintf("exponential, mean %v", a.Pause)},
		{"active runs (target)", fmt.Sprintf("%d (mean context %.0f tokens full-scale fills %.0f %% of fleet KV)", sz.active, sz.meanContext, 100*a.Fill)},
		{"run arrivals", fmt.Sprintf("Poisson %.3g/s for %v (nominal run %v)", sz.rate, window.Round(time.Second), sz.runLength.Round(time.Second))},
		{"runs", strconv.Itoa(len(sessions))},
	}
	return &Plan{Sessions: sessions, Params: params}, nil
}

// agentRun is one run's Script. It builds its opening lazily, on the first
// turn, from a random source of its own, so it is deterministic whatever
// order runs are played in.
type agentRun struct {
	a    Agentic
	env  Env
	seed uint64

	rng   *rand.Rand
	turns int
	turn  int
	msgs  []vllmsim.Message
	tools []vllmsim.Tool
}

// Next implements Script.
func (r *agentRun) Next(prev *Outcome) (Turn, bool) {
	if prev == nil {
		r.open()
	} else {
		if r.turn >= r.turns {
			return Turn{}, false
		}
		r.msgs = append(r.msgs,
			vllmsim.Message{Role: "assistant", Content: prev.Reply},
			vllmsim.Message{Role: "user", Content: randomWords(r.rng, uniformInt(r.rng, r.env.scaled(r.a.ToolMin), r.env.scaled(r.a.ToolMax)))})
	}
	t := Turn{
		Messages:   r.msgs[:len(r.msgs):len(r.msgs)],
		Tools:      r.tools,
		ToolChoice: "none",
		MaxTokens:  uniformInt(r.rng, r.env.scaled(r.a.ReplyMin), r.env.scaled(r.a.ReplyMax)),
		IgnoreEOS:  true,
		WantReply:  true,
	}
	if r.turn > 0 {
		t.Delay = expDuration(r.rng, r.a.Pause)
	}
	r.turn++
	return t, true
}

// open builds the run's opening: a system prompt (a sixth of the context),
// tool definitions (up to eight, about 40 % of it) and the task, sized so
// that the rendered opening is exactly the scaled ContextTokens when it can
// be.
func (r *agentRun) open() {
	r.rng = rand.New(rand.NewPCG(uint64(r.env.Seed), 0x6167656e74<<16|r.seed))
	r.turns = max(1, uniformInt(r.rng, r.a.Turns-10, r.a.Turns+10))
	target := r.env.scaled(r.a.ContextTokens)
	system := randomWords(r.rng, max(1, target/6))
	toolBudget := target * 2 / 5
	n := min(8, max(1, toolBudget/150))
	r.tools = make([]vllmsim.Tool, n)
	for i := range r.tools {
		r.tools[i] = vllmsim.Tool{Type: "function", Function: vllmsim.ToolFunction{
			Name:        "tool_" + strconv.FormatUint(r.seed, 36) + "_" + strconv.Itoa(i),
			Description: randomWords(r.rng, max(1, toolBudget/n-45)),
			Parameters:  json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"query":{"type":"string"}},"required":["path"]}`),
		}}
	}
	head := []vllmsim.Message{{Role: "system", Content: system}, {Role: "user", Content: ""}}
	used := len(vllmsim.TokenizeChat(head, r.tools, true))
	r.msgs = []vllmsim.Message{head[0], {Role: "user", Content: randomWords(r.rng, max(1, target-used))}}
}

var (
	_ Workload = (*Agentic)(nil)
	_ Script   = (*agentRun)(nil)
)
