package gateway

import (
	"context"
	"time"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/session"
)

// A prompt routed without the tokenizer (its opening was never sent, see
// routing.tokenize_unseen) leaves a session binding without a tip block,
// and with no tip the gateway cannot see the replica evict or lose the
// session's prefix. Most such prompts are one-shot and never need one; a
// session that comes back (a sticky turn on a binding without a tip) gets
// its tip off the request path: the turn's prompt is tokenized by a small
// pool of workers, its blocks speculated on the session's replica, and the
// binding given its tip if it still names that replica. When the pool is
// busy the work is dropped (and counted): the session then trusts its
// replica until a later turn finds the pool free.

// tipJob is one routed request whose tip is wanted.
type tipJob struct {
	req     *Request
	reps    []*fleet.Replica
	eps     []scoring.Endpoint
	replica string
	session string
	binding session.Binding // as stored at routing, should the local copy be gone
}

const (
	tipWorkers = 2
	tipBacklog = 256
)

// tipLater queues the job, or drops it when the backlog is full.
func (g *Gateway) tipLater(j tipJob) {
	if !g.tips.try(func(ctx context.Context) { g.tip(ctx, j) }) {
		g.m.tips.WithLabelValues("dropped").Inc()
	}
}

// tip tokenizes the job's prompt and records what the chosen replica now
// holds of it.
func (g *Gateway) tip(ctx context.Context, j tipJob) {
	tctx, cancel := context.WithTimeout(ctx, g.cfg.Upstream.TokenizeTimeout+time.Second)
	defer cancel()
	tokens, err := g.tokenize(tctx, j.req, j.reps, j.eps)
	if err != nil {
		g.m.tips.WithLabelValues("failed").Inc()
		return
	}
	keys := g.index.keys(tokens, j.req.model, j.req.cacheSalt)
	if len(keys) == 0 {
		g.m.tips.WithLabelValues("stale").Inc() // shorter than a block: nothing to watch
		return
	}
	if g.cfg.Routing.SpeculativeTTL > 0 {
		g.index.speculate(j.replica, keys, g.cfg.Routing.SpeculativeTTL)
	}
	result := "stale"
	_, err = g.sessions.Update(tctx, j.session, j.binding, func(b *session.Binding) bool {
		if b.Replica != j.replica || b.TipDepth > 0 {
			return false // moved on meanwhile, already known, or gone
		}
		b.TipKey, b.TipDepth = keys[len(keys)-1], len(keys)
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
