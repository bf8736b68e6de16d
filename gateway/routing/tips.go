package routing

import (
	"context"
	"time"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/session"
)

// A prompt routed without the tokenizer (its opening was never sent, see
// routing.skip_unseen) has no block keys: nothing is speculated on the
// replica it went to, and its session binding has no tip block, so the
// gateway could see neither where its blocks are before their events
// arrive nor the replica evicting them. A small pool of workers tokenizes
// such prompts off the request path: their blocks are speculated on the
// chosen replica (so a second request sharing the prompt, arriving while
// the first is still in prefill, follows it instead of computing it again
// elsewhere) and the binding is given its tip if it still names that
// replica. A sticky turn that finds its binding without a tip is queued
// the same way. When the pool is busy the work is dropped (and counted):
// the request pays nothing either way.

// tipJob is one routed request whose tip is wanted.
type tipJob struct {
	req     *Turn
	reps    []*fleet.Replica
	eps     []scoring.Endpoint
	replica string
	session string
	binding session.Binding // as stored at routing, should the local copy be gone
}

// tipLater queues the job, or drops it when the backlog is full. A
// session with a job already queued or running gets no second one: its
// next turn, arriving before the first job landed, would tokenize again
// for the tip the first is about to fill.
func (g *Router) tipLater(j tipJob) {
	if j.session != "" {
		if _, pending := g.tipPending.LoadOrStore(j.session, struct{}{}); pending {
			return
		}
	}
	job := func(ctx context.Context) {
		defer g.tipPending.Delete(j.session)
		g.tip(ctx, j)
	}
	if !g.tips.try(job) {
		g.tipPending.Delete(j.session)
		g.m.tips.WithLabelValues("dropped").Inc()
	}
}

// tip tokenizes the job's prompt and records what the chosen replica now
// holds of it.
func (g *Router) tip(ctx context.Context, j tipJob) {
	tctx, cancel := context.WithTimeout(ctx, g.tokenizeTimeout+time.Second)
	defer cancel()
	tokens, err := g.tokenize(tctx, j.req.R, j.reps, j.eps)
	if err != nil {
		g.m.tips.WithLabelValues("failed").Inc()
		return
	}
	keys := g.index.Keys(tokens, j.req.Model(), j.req.CacheSalt())
	if len(keys) == 0 {
		g.m.tips.WithLabelValues("stale").Inc() // shorter than a block: nothing to watch
		return
	}
	if g.cfg.SpeculativeTTL > 0 {
		g.index.Speculate(j.replica, keys, g.cfg.SpeculativeTTL)
	}
	result := "stale"
	_, err = g.sessions.Update(tctx, j.session, j.binding, func(b *session.Binding) bool {
		if b.Replica != j.replica || b.TipDepth > 0 {
			return false // moved on meanwhile, already known, or gone
		}
		b.SetTip(keys)
		b.PromptTokens = len(tokens) // the ratio later turns' estimates use
		result = "filled"
		return true
	})
	if err != nil {
		g.m.redisErrors.WithLabelValues("remember").Inc()
		result = "failed"
	}
	g.m.tips.WithLabelValues(result).Inc()
}
