package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/warmpath/warmpath/vllmsim"
)

// Classes and tenants of the mixed-tenants workload.
const (
	classInteractive = "interactive"
	classBackground  = "background"
	tenantChat       = "a" // steady interactive chat sessions
	tenantBurst      = "b" // the background burst
)

// MixedTenants is two tenants sharing a fleet. Tenant A's users hold
// steady interactive chat sessions (a shared system prompt, a few turns
// each, a think pause between them) for the whole run. Tenant B, whose
// requests are background (its tenant default), starts a burst of many
// concurrent agent runs a little after A: runs of one agent (a system
// prompt and tools all runs share, then a task of their own), about 30
// turns each, every turn appending the streamed reply and a tool result
// after a short tool pause, as Agentic's runs do. The burst is sized to
// the fleet's KV cache so that it saturates the fleet: at full scale each
// replica holds about 13 running turns of B's mean context
// (307,328 ÷ 23,700), while BurstRuns ÷ replicas = 20 runs per replica
// keep about 16 of their turns wanting to run.
//
// It is benchmarked as one run of four parts on the same fleet and seed
// (see Run): A alone (no-burst), then A with B under the gateway policies
// fifo (no gateway queue), strict and fair. Shares adds a fifth, for the
// weighted shares: two background bursts of equal size from tenants of
// weights 1 and 3.
//
// The zero value has the defaults; fields override them. Counts of runs
// and the chat rate are per 8 replicas and scale with the fleet.
type MixedTenants struct {
	// ChatRate is A's session arrivals per simulated second (Poisson);
	// default 0.5.
	ChatRate float64
	// ChatTurns is the mean turns of a chat session, drawn uniformly
	// within ±2 (at least 1); default 4.
	ChatTurns int
	// ChatSystemTokens is the system prompt A's sessions share; default
	// 1,000.
	ChatSystemTokens int
	// ChatUserMin and ChatUserMax bound a user message; default 30 and
	// 150.
	ChatUserMin, ChatUserMax int
	// ChatReplyMin and ChatReplyMax bound a reply (ignore_eos); default
	// 100 and 200.
	ChatReplyMin, ChatReplyMax int
	// ChatPause is the mean of the exponential think pause; default 5 s.
	ChatPause time.Duration
	// ChatWindow is how long A's sessions keep arriving; default
	// BurstAt + 4 minutes.
	ChatWindow time.Duration

	// BurstAt is when B's runs start arriving; default 30 s.
	BurstAt time.Duration
	// BurstSpread is the window over which they arrive, uniformly;
	// default 10 s.
	BurstSpread time.Duration
	// BurstRuns is the number of runs; default 320.
	BurstRuns int
	// AgentSharedTokens is the system prompt and tool definitions every
	// run shares; default 12,000. AgentTaskTokens is each run's own task;
	// default 3,000.
	AgentSharedTokens, AgentTaskTokens int
	// AgentTurns is the mean turns of a run, drawn uniformly within ±5;
	// default 30.
	AgentTurns int
	// AgentReplyMin and AgentReplyMax bound a reply (ignore_eos); default
	// 100 and 300. AgentToolMin and AgentToolMax bound a tool result;
	// default 200 and 600.
	AgentReplyMin, AgentReplyMax, AgentToolMin, AgentToolMax int
	// AgentPause is the mean of the exponential tool pause; default 1 s.
	AgentPause time.Duration

	// SharesRuns is each tenant's runs in the shares part; default
	// enough for both tenants to stay backlogged: 1.25 × the running
	// turns the fleet's KV cache holds ÷ 0.8 (the share of its time a run
	// wants to run). SharesTurns is their mean turns (±5); default 10.
	// Their runs share a 2,000-token prefix and bring 13,000 of their own.
	SharesRuns, SharesTurns int
}

func (m MixedTenants) withDefaults() MixedTenants {
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	if m.ChatRate == 0 {
		m.ChatRate = 0.5
	}
	def(&m.ChatTurns, 4)
	def(&m.ChatSystemTokens, 1000)
	if m.ChatUserMin == 0 && m.ChatUserMax == 0 {
		m.ChatUserMin, m.ChatUserMax = 30, 150
	}
	if m.ChatReplyMin == 0 && m.ChatReplyMax == 0 {
		m.ChatReplyMin, m.ChatReplyMax = 100, 200
	}
	if m.ChatPause == 0 {
		m.ChatPause = 5 * time.Second
	}
	if m.BurstAt == 0 {
		m.BurstAt = 30 * time.Second
	}
	if m.BurstSpread == 0 {
		m.BurstSpread = 10 * time.Second
	}
	if m.ChatWindow == 0 {
		m.ChatWindow = m.BurstAt + 4*time.Minute
	}
	def(&m.BurstRuns, 320)
	def(&m.AgentSharedTokens, 12000)
	def(&m.AgentTaskTokens, 3000)
	def(&m.AgentTurns, 30)
	if m.AgentReplyMin == 0 && m.AgentReplyMax == 0 {
		m.AgentReplyMin, m.AgentReplyMax = 100, 300
	}
	if m.AgentToolMin == 0 && m.AgentToolMax == 0 {
		m.AgentToolMin, m.AgentToolMax = 200, 600
	}
	if m.AgentPause == 0 {
		m.AgentPause = time.Second
	}
	def(&m.SharesTurns, 10)
	return m
}

// Name implements Workload.
func (*MixedTenants) Name() string { return "mixed-tenants" }

// Tenant is a tenant a workload needs: the benchmark creates it (in the
// gateway's tenancy store) with an API key of its own, which the
// workload's sessions send.
type Tenant struct {
	// ID is the tenant's id and metrics label.
	ID string
	// Weight is its fair-share weight.
	Weight int
	// DefaultClass is the class of its requests ("" interactive).
	DefaultClass string
}

// Key is the tenant's API key in a benchmark run.
func (t Tenant) Key() string { return "sk-bench-tenant-" + t.ID }

// header is what a tenant's sessions send.
func (t Tenant) header() http.Header {
	return http.Header{"Authorization": {"Bearer " + t.Key()}}
}

// mixedTenants are the tenants of the four main parts.
var mixedTenants = []Tenant{{ID: tenantChat, Weight: 1}, {ID: tenantBurst, Weight: 1, DefaultClass: classBackground}}

// Plan implements Workload: A's chat sessions and B's burst.
func (mt *MixedTenants) Plan(env Env) (*Plan, error) {
	m := mt.withDefaults()
	if env.Replicas < 1 {
		return nil, fmt.Errorf("bench: mixed-tenants: %d replicas", env.Replicas)
	}
	perFleet := float64(env.Replicas) / 8
	chat := m.chatSessions(env, perFleet)
	runs := max(1, int(math.Round(float64(m.BurstRuns)*perFleet)))
	burst := m.burstSessions(env, mixedTenants[1], runs, m.AgentTurns, "burst")
	sessions := mergeByStart(chat, burst)
	sessions = cutSessions(env, sessions)
	params := []Param{
		{"tenant a (interactive, weight 1)", fmt.Sprintf("chat sessions, Poisson %.3g/s for %v, %d±2 turns; system %d shared + user %d–%d → reply %d–%d tokens; think pause mean %v",
			m.ChatRate*perFleet, m.ChatWindow, m.ChatTurns, env.scaled(m.ChatSystemTokens), env.scaled(m.ChatUserMin), env.scaled(m.ChatUserMax),
			env.scaled(m.ChatReplyMin), env.scaled(m.ChatReplyMax), m.ChatPause)},
		{"tenant b (background default, weight 1)", fmt.Sprintf("%d agent runs starting over %v from %v, %d±5 turns; context %d shared + %d own, + reply %d–%d and tool result %d–%d per turn; pause mean %v",
			runs, m.BurstSpread, m.BurstAt, m.AgentTurns, env.scaled(m.AgentSharedTokens), env.scaled(m.AgentTaskTokens),
			env.scaled(m.AgentReplyMin), env.scaled(m.AgentReplyMax), env.scaled(m.AgentToolMin), env.scaled(m.AgentToolMax), m.AgentPause)},
		{"sessions", fmt.Sprintf("%d chat, %d runs", len(chat), runs)},
	}
	return &Plan{Sessions: sessions, Params: params, Tenants: mixedTenants}, nil
}

// sharesTenants are the tenants of the shares part.
var sharesTenants = []Tenant{{ID: "light", Weight: 1, DefaultClass: classBackground}, {ID: "heavy", Weight: 3, DefaultClass: classBackground}}

// SharesPlan is the shares part: two equal background bursts from tenants
// of weights 1 and 3, starting together, so that both are backlogged and
// only the weights tell them apart.
func (mt *MixedTenants) SharesPlan(env Env) *Plan {
	m := mt.withDefaults()
	m.BurstAt = time.Second
	m.AgentSharedTokens, m.AgentTaskTokens = 2000, 13000
	runs := m.SharesRuns
	if runs == 0 {
		kv := env.KVTokens
		if kv == 0 {
			kv = env.scaled(vllmsim.DefaultProfile().KVBlocks * vllmsim.DefaultProfile().BlockSize)
		}
		perTurn := float64(env.scaled(m.AgentReplyMin+m.AgentReplyMax)+env.scaled(m.AgentToolMin+m.AgentToolMax)) / 2
		own := float64(env.scaled(m.AgentTaskTokens)) + float64(m.SharesTurns-1)/2*perTurn
		running := float64(env.Replicas) * float64(kv-env.scaled(m.AgentSharedTokens)) / own
		runs = max(2, int(math.Ceil(1.25*running/0.8)))
	}
	light := m.burstSessions(env, sharesTenants[0], runs, m.SharesTurns, "shares/light")
	heavy := m.burstSessions(env, sharesTenants[1], runs, m.SharesTurns, "shares/heavy")
	return &Plan{Sessions: cutSessions(env, mergeByStart(light, heavy)), Tenants: sharesTenants,
		Params: []Param{{"shares", fmt.Sprintf("%d runs each from tenants of weights 1 and 3, %d±5 turns", runs, m.SharesTurns)}}}
}

// chatSessions lays out tenant A's sessions.
func (m MixedTenants) chatSessions(env Env, perFleet float64) []Session {
	text := workloadRand(env.Seed, "mixed/chat/text")
	system := randomWords(text, env.scaled(m.ChatSystemTokens))
	arrivals := workloadRand(env.Seed, "mixed/chat/arrivals")
	mean := time.Duration(float64(time.Second) / (m.ChatRate * perFleet))
	var out []Session
	for t, i := expDuration(arrivals, mean), 0; t < m.ChatWindow; t, i = t+expDuration(arrivals, mean), i+1 {
		out = append(out, Session{Start: t, Class: classInteractive, Tenant: tenantChat, Header: mixedTenants[0].header(),
			Script: &chatSession{m: m, env: env, system: system, seed: uint64(i)}})
	}
	return out
}

// burstSessions lays out runs agent runs for tenant t, starting uniformly
// over BurstSpread from BurstAt.
func (m MixedTenants) burstSessions(env Env, t Tenant, runs, turns int, stream string) []Session {
	rng := workloadRand(env.Seed, "mixed/"+stream+"/arrivals")
	starts := make([]time.Duration, runs)
	for i := range starts {
		starts[i] = m.BurstAt + time.Duration(rng.Float64()*float64(m.BurstSpread))
	}
	slices.Sort(starts)
	shared := newAgentPrefix(env, m, stream)
	out := make([]Session, runs)
	for i, s := range starts {
		out[i] = Session{Start: s, Class: classBackground, Tenant: t.ID, Header: t.header(),
			Script: &burstRun{m: m, env: env, prefix: shared, turnsMean: turns, seed: uint64(i), stream: stream}}
	}
	return out
}

// chatSession is one of A's sessions: a shared system prompt, then user
// questions and the streamed replies.
type chatSession struct {
	m      MixedTenants
	env    Env
	system string
	seed   uint64

	rng   *rand.Rand
	turns int
	turn  int
	msgs  []vllmsim.Message
}

// Next implements Script.
func (c *chatSession) Next(prev *Outcome) (Turn, bool) {
	user := func() vllmsim.Message {
		return vllmsim.Message{Role: "user", Content: randomWords(c.rng, uniformInt(c.rng, c.env.scaled(c.m.ChatUserMin), c.env.scaled(c.m.ChatUserMax)))}
	}
	var delay time.Duration
	if prev == nil {
		c.rng = workloadRand(c.env.Seed, "mixed/chat/session/"+strconv.FormatUint(c.seed, 10))
		c.turns = max(1, uniformInt(c.rng, c.m.ChatTurns-2, c.m.ChatTurns+2))
		c.msgs = []vllmsim.Message{{Role: "system", Content: c.system}, user()}
	} else {
		if c.turn >= c.turns {
			return Turn{}, false
		}
		c.msgs = append(c.msgs, vllmsim.Message{Role: "assistant", Content: prev.Reply}, user())
		delay = expDuration(c.rng, c.m.ChatPause)
	}
	c.turn++
	return Turn{Delay: delay, Messages: c.msgs[:len(c.msgs):len(c.msgs)],
		MaxTokens: uniformInt(c.rng, c.env.scaled(c.m.ChatReplyMin), c.env.scaled(c.m.ChatReplyMax)), IgnoreEOS: true, WantReply: true}, true
}

// agentPrefix is the opening every run of one agent shares: its system
// prompt and tool definitions.
type agentPrefix struct {
	system string
	tools  []vllmsim.Tool
}

// newAgentPrefix builds the shared opening, sized so that it renders to
// about AgentSharedTokens: a third system prompt, the rest tools.
func newAgentPrefix(env Env, m MixedTenants, stream string) *agentPrefix {
	rng := workloadRand(env.Seed, "mixed/"+stream+"/prefix")
	target := env.scaled(m.AgentSharedTokens)
	p := &agentPrefix{system: randomWords(rng, max(1, target/3))}
	n := min(8, max(1, target*2/3/150))
	for i := range n {
		p.tools = append(p.tools, vllmsim.Tool{Type: "function", Function: vllmsim.ToolFunction{
			Name:        "tool_" + strconv.Itoa(i),
			Description: randomWords(rng, max(1, target*2/3/n-45)),
			Parameters:  json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"query":{"type":"string"}},"required":["path"]}`),
		}})
	}
	return p
}

// burstRun is one agent run's Script: the shared opening, its own task,
// then each reply and a tool result.
type burstRun struct {
	m         MixedTenants
	env       Env
	prefix    *agentPrefix
	turnsMean int
	seed      uint64
	stream    string

	rng   *rand.Rand
	turns int
	turn  int
	msgs  []vllmsim.Message
}

// Next implements Script.
func (r *burstRun) Next(prev *Outcome) (Turn, bool) {
	var delay time.Duration
	if prev == nil {
		r.rng = workloadRand(r.env.Seed, "mixed/"+r.stream+"/run/"+strconv.FormatUint(r.seed, 10))
		r.turns = max(1, uniformInt(r.rng, r.turnsMean-5, r.turnsMean+5))
		r.msgs = []vllmsim.Message{{Role: "system", Content: r.prefix.system},
			{Role: "user", Content: randomWords(r.rng, r.env.scaled(r.m.AgentTaskTokens))}}
	} else {
		if r.turn >= r.turns {
			return Turn{}, false
		}
		r.msgs = append(r.msgs, vllmsim.Message{Role: "assistant", Content: prev.Reply},
			vllmsim.Message{Role: "user", Content: randomWords(r.rng, uniformInt(r.rng, r.env.scaled(r.m.AgentToolMin), r.env.scaled(r.m.AgentToolMax)))})
		delay = expDuration(r.rng, r.m.AgentPause)
	}
	r.turn++
	return Turn{Delay: delay, Messages: r.msgs[:len(r.msgs):len(r.msgs)], Tools: r.prefix.tools, ToolChoice: "none",
		MaxTokens: uniformInt(r.rng, r.env.scaled(r.m.AgentReplyMin), r.env.scaled(r.m.AgentReplyMax)), IgnoreEOS: true, WantReply: true}, true
}

// mergeByStart merges session lists sorted by Start.
func mergeByStart(a, b []Session) []Session {
	out := make([]Session, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if b[0].Start < a[0].Start {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return append(append(out, a...), b...)
}

var (
	_ Workload = (*MixedTenants)(nil)
	_ Script   = (*chatSession)(nil)
	_ Script   = (*burstRun)(nil)
)
