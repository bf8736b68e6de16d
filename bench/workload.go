package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/warmpath/warmpath/vllmsim"
)

// Workload generates the traffic of one benchmark. Plan must be
// deterministic: the same Env gives the same sessions, so every policy of a
// run faces the same workload. Sessions whose later turns depend on earlier
// replies (agent runs) stay deterministic because the simulator's replies
// are a function of the prompt.
//
// Adding a workload is adding a file with a type that implements Workload
// and one line in registry.
type Workload interface {
	// Name is the registry name, e.g. "shared-prefix".
	Name() string
	// Plan lays the workload out for env.
	Plan(env Env) (*Plan, error)
}

// Env is what a workload is planned for. Times are simulated.
type Env struct {
	// Seed seeds every random choice of the workload.
	Seed int64
	// Scale multiplies every token count (prompts, outputs, KV capacity);
	// 1 is the workload's full size. See doc.go, "Scale and speed".
	Scale float64
	// Replicas is the number of replicas the workload runs against.
	Replicas int
	// KVTokens is one replica's KV capacity in tokens at this scale; 0 when
	// unknown (an external fleet).
	KVTokens int
	// StageScale multiplies the length of the shared-prefix ladder's
	// stages and warm-up; 1 is the full length.
	StageScale float64
	// TracePath and TimeScale configure the trace workload: arrival times
	// are multiplied by TimeScale (0.1 replays ten times denser).
	TracePath string
	TimeScale float64
	// Duration, when positive, drops sessions starting later.
	Duration time.Duration
	// Limit, when positive, keeps only the first Limit sessions (requests
	// for shared-prefix and trace, runs for agentic).
	Limit int
}

// scaled returns n tokens at the environment's scale, at least 1.
func (e Env) scaled(n int) int { return max(1, int(math.Round(float64(n)*e.Scale))) }

// Plan is a workload laid out for one run.
type Plan struct {
	// Sessions are the run's sessions in order of Start.
	Sessions []Session
	// Params describe the workload for reports, in display order.
	Params []Param
	// Tenants, when set, are created in the gateway's tenancy store
	// (API keys mode) before the run; sessions send their keys. Without
	// them the gateway runs open, as one anonymous tenant.
	Tenants []Tenant
}

// Param is one named parameter of a run or a workload, for reports.
type Param struct {
	// Name and Value are display text, e.g. "groups × users", "150 × 5".
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Session is a sequence of turns sent one after the other: one request for
// open-loop workloads, an agent run for agentic.
type Session struct {
	// Start is when the first turn is due (before its Delay), simulated,
	// from the start of the run.
	Start time.Duration
	// Class groups sessions in reports (e.g. "interactive", "background");
	// "" is the default class.
	Class string
	// Tenant tags the session's requests; "" is none.
	Tenant string
	// Header is sent with every request of the session.
	Header http.Header
	// Warmup excludes the session's requests from latency and throughput
	// figures (they still warm the caches and count in the cached
	// fraction).
	Warmup bool
	// Script yields the turns.
	Script Script
}

// Script yields a session's turns.
type Script interface {
	// Next returns the turn to send after prev, the outcome of the previous
	// turn (nil before the first); false ends the session. The driver ends
	// a session on the first failed turn without calling Next again.
	Next(prev *Outcome) (Turn, bool)
}

// Turn is one chat-completions request.
type Turn struct {
	// Delay is the simulated pause before the turn is sent, counted from
	// the end of the previous turn (from Session.Start for the first).
	Delay time.Duration
	// Messages and Tools are the request's conversation and tools.
	Messages []vllmsim.Message
	Tools    []vllmsim.Tool
	// ToolChoice is sent as tool_choice when not empty ("none", "auto").
	ToolChoice string
	// MaxTokens caps the output; IgnoreEOS makes the engine generate
	// exactly MaxTokens tokens (vLLM's ignore_eos).
	MaxTokens int
	IgnoreEOS bool
	// Header is sent with this request only, after Session.Header.
	Header http.Header
	// PromptKey, when not empty, names the prompt: turns with equal keys
	// have equal prompts, so the driver tokenizes each key once when it
	// computes the ceiling.
	PromptKey string
	// WantReply makes the driver collect the reply text into
	// Outcome.Reply.
	WantReply bool
	// Spawn are scripts (sub-agents) the driver plays concurrently once
	// this turn completes, with the session's headers; the session's
	// next turn waits until they have all ended.
	Spawn []Script
}

// Outcome is what the driver learned from a turn.
type Outcome struct {
	// Reply is the streamed reply text (only when Turn.WantReply).
	Reply string
	// OutputTokens is usage.completion_tokens.
	OutputTokens int
}

// oneTurn is the Script of a single-request session.
type oneTurn struct{ t Turn }

// Next implements Script.
func (o *oneTurn) Next(prev *Outcome) (Turn, bool) {
	if prev != nil {
		return Turn{}, false
	}
	return o.t, true
}

// registry lists the workloads in display order.
func registry() []Workload {
	return []Workload{
		&SharedPrefix{},
		&Agentic{},
		&AgenticHarness{},
		&Replay{},
		&MixedTenants{},
	}
}

// Workloads returns the names of the registered workloads.
func Workloads() []string {
	var names []string
	for _, w := range registry() {
		names = append(names, w.Name())
	}
	return names
}

// NewWorkload returns the registered workload called name, with its default
// parameters.
func NewWorkload(name string) (Workload, error) {
	for _, w := range registry() {
		if w.Name() == name {
			return w, nil
		}
	}
	return nil, fmt.Errorf("bench: unknown workload %q (want one of %s)", name, strings.Join(Workloads(), ", "))
}

// cutSessions applies env's Duration and Limit to sessions sorted by Start.
func cutSessions(env Env, sessions []Session) []Session {
	if env.Duration > 0 {
		i, _ := slices.BinarySearchFunc(sessions, env.Duration, func(s Session, d time.Duration) int {
			if s.Start <= d {
				return -1
			}
			return 1
		})
		sessions = sessions[:i]
	}
	if env.Limit > 0 && len(sessions) > env.Limit {
		sessions = sessions[:env.Limit]
	}
	return sessions
}

// workloadRand returns the workload's random source for a seed and a stream
// name, so that two workloads (or two parts of one) never share draws.
func workloadRand(seed int64, stream string) *rand.Rand {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(stream); i++ {
		h = (h ^ uint64(stream[i])) * 1099511628211
	}
	return rand.New(rand.NewPCG(uint64(seed), h))
}

// expDuration draws an exponential duration with the given mean.
func expDuration(rng *rand.Rand, mean time.Duration) time.Duration {
	return time.Duration(rng.ExpFloat64() * float64(mean))
}

// randomWords returns n random vocabulary words joined by single spaces: exactly
// n simulator tokens.
func randomWords(rng *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(n * 5)
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vllmsim.Word(vllmsim.WordBase + uint32(rng.IntN(vllmsim.NumWords))))
	}
	return b.String()
}

// uniformInt draws an integer in [lo, hi].
func uniformInt(rng *rand.Rand, lo, hi int) int {
	if hi <= lo {
		return lo
	}
	return lo + rng.IntN(hi-lo+1)
}
