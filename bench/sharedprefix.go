package bench

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/warmpath/warmpath/vllmsim"
)

// SharedPrefix is the shape of llm-d's "KV-Cache Wins You Can See"
// benchmark (shared/reference/peers.md §2.1): groups of users ("customers")
// share a long context; each user asks its own question; requests pick a
// (group, user) prompt uniformly at random and arrive as a Poisson process
// whose rate climbs a ladder of stages after a warm-up. Every request
// streams a fixed number of output tokens (ignore_eos).
//
// At full scale on 8 replicas of the default profile the prompts' resident
// set is 150 × 6,000 + 750 × 1,200 = 1.8 M tokens, 73 % of the fleet's
// 8 × 307,328 KV tokens: it fits only if each prompt is kept on about one
// replica, so a cache-blind policy recomputes most of every prompt while a
// cache-aware one prefills little more than the questions.
//
// Groups and rates are per 8 replicas: with R replicas the workload has
// round(Groups × R/8) groups and every rate is multiplied by R/8, so the
// cache demand and the load per replica stay those of the 8-pod benchmark.
//
// The zero value is the benchmark's shape; fields override it.
type SharedPrefix struct {
	// Groups and UsersPerGroup: default 150 and 5 (per 8 replicas).
	Groups, UsersPerGroup int
	// ContextTokens, QuestionTokens and OutputTokens are full-scale token
	// counts: default 6,000, 1,200 and 1,000. Env.Scale multiplies them.
	ContextTokens, QuestionTokens, OutputTokens int
	// Rates is the ladder in requests per simulated second (per 8
	// replicas); default 3, 10, 15, 20, 22, 25, 30, 35, 40, 43, 46, 49,
	// 52, 55, 57, 60, as llm-d's.
	Rates []float64
	// Stage is each rung's length at StageScale 1; default 30 s (llm-d's
	// stages ran 20–38 s).
	Stage time.Duration
	// WarmupRate and Warmup are the warm-up stage before the ladder:
	// default 15 requests/s for 50 s, as llm-d's. Warm-up requests count
	// in the cached fraction but not in latency or throughput.
	WarmupRate float64
	Warmup     time.Duration
}

func (w SharedPrefix) withDefaults() SharedPrefix {
	if w.Groups == 0 {
		w.Groups = 150
	}
	if w.UsersPerGroup == 0 {
		w.UsersPerGroup = 5
	}
	if w.ContextTokens == 0 {
		w.ContextTokens = 6000
	}
	if w.QuestionTokens == 0 {
		w.QuestionTokens = 1200
	}
	if w.OutputTokens == 0 {
		w.OutputTokens = 1000
	}
	if len(w.Rates) == 0 {
		w.Rates = []float64{3, 10, 15, 20, 22, 25, 30, 35, 40, 43, 46, 49, 52, 55, 57, 60}
	}
	if w.Stage == 0 {
		w.Stage = 30 * time.Second
	}
	if w.WarmupRate == 0 {
		w.WarmupRate = 15
	}
	if w.Warmup == 0 {
		w.Warmup = 50 * time.Second
	}
	return w
}

// Name implements Workload.
func (*SharedPrefix) Name() string { return "shared-prefix" }

// Plan implements Workload.
func (sp *SharedPrefix) Plan(env Env) (*Plan, error) {
	w := sp.withDefaults()
	if env.Replicas < 1 {
		return nil, fmt.Errorf("bench: shared-prefix: %d replicas", env.Replicas)
	}
	perFleet := float64(env.Replicas) / 8
	groups := max(1, int(math.Round(float64(w.Groups)*perFleet)))
	ctxTokens, qTokens, outTokens := env.scaled(w.ContextTokens), env.scaled(w.QuestionTokens), env.scaled(w.OutputTokens)
	stageScale := env.StageScale
	if stageScale <= 0 {
		stageScale = 1
	}
	stage := time.Duration(float64(w.Stage) * stageScale)
	warmup := time.Duration(float64(w.Warmup) * stageScale)

	// Prompts: one context per group, one question per user.
	text := workloadRand(env.Seed, "shared-prefix/text")
	contexts := make([]string, groups)
	questions := make([][]string, groups)
	for g := range groups {
		contexts[g] = randomWords(text, ctxTokens)
		questions[g] = make([]string, w.UsersPerGroup)
		for u := range w.UsersPerGroup {
			questions[g][u] = randomWords(text, qTokens)
		}
	}

	// Arrivals: a Poisson process whose rate steps through the warm-up and
	// the ladder. The process is memoryless, so at a stage boundary the
	// next arrival is drawn afresh at the new rate.
	type stageSpec struct {
		rate   float64
		length time.Duration
		warm   bool
	}
	stages := []stageSpec{{w.WarmupRate * perFleet, warmup, true}}
	for _, r := range w.Rates {
		stages = append(stages, stageSpec{r * perFleet, stage, false})
	}
	arrivals := workloadRand(env.Seed, "shared-prefix/arrivals")
	pick := workloadRand(env.Seed, "shared-prefix/pick")
	var sessions []Session
	var begin time.Duration
	for _, st := range stages {
		end := begin + st.length
		if st.rate > 0 {
			mean := time.Duration(float64(time.Second) / st.rate)
			for t := begin + expDuration(arrivals, mean); t < end; t += expDuration(arrivals, mean) {
				g, u := pick.IntN(groups), pick.IntN(w.UsersPerGroup)
				sessions = append(sessions, Session{Start: t, Warmup: st.warm, Script: &oneTurn{Turn{
					Messages: []vllmsim.Message{
						{Role: "system", Content: contexts[g]},
						{Role: "user", Content: questions[g][u]},
					},
					MaxTokens: outTokens,
					IgnoreEOS: true,
					PromptKey: "g" + strconv.Itoa(g) + "/u" + strconv.Itoa(u),
				}}})
			}
		}
		begin = end
	}
	sessions = cutSessions(env, sessions)

	rates := make([]string, len(w.Rates))
	for i, r := range w.Rates {
		rates[i] = strconv.FormatFloat(r*perFleet, 'g', 4, 64)
	}
	demand := groups*ctxTokens + groups*w.UsersPerGroup*qTokens
	params := []Param{
		{"groups × users", fmt.Sprintf("%d × %d", groups, w.UsersPerGroup)},
		{"tokens: context + question → output", fmt.Sprintf("%d + %d → %d (ignore_eos)", ctxTokens, qTokens, outTokens)},
		{"warm-up", fmt.Sprintf("%.4g req/s for %v", w.WarmupRate*perFleet, warmup)},
		{"ladder (req/s)", strings.Join(rates, ", ")},
		{"stage length", stage.String()},
		{"requests", strconv.Itoa(len(sessions))},
	}
	if env.KVTokens > 0 {
		params = append(params, Param{"prompt resident set", fmt.Sprintf("%d tokens = %.0f %% of fleet KV (%d × %d)",
			demand, 100*float64(demand)/float64(env.Replicas*env.KVTokens), env.Replicas, env.KVTokens)})
	}
	return &Plan{Sessions: sessions, Params: params}, nil
}

var _ Workload = (*SharedPrefix)(nil)
