package fairq

import (
	"math"
	"sync/atomic"
	"time"
)

// Grant is one admitted request. Its methods are safe for concurrent use;
// Done must be called exactly when the request ends (extra calls do
// nothing).
type Grant struct {
	q      *Queue
	m      *model
	c      *counter
	ten    *tenant
	class  Class
	weight float64
	cost   float64 // prompt cost charged; changed once by Settle
	waited time.Duration

	settled atomic.Bool
	done    atomic.Bool
}

// Waited is how long the request waited in the queue; 0 when it was
// admitted at once.
func (g *Grant) Waited() time.Duration { return g.waited }

// Class is the class the request was admitted in.
func (g *Grant) Class() Class { return g.class }

// Charge charges outputTokens more output tokens to the tenant's virtual
// counter (Config.OutputWeight each), as they arrive. Call it before Done;
// non-positive or non-finite counts are ignored.
func (g *Grant) Charge(outputTokens float64) {
	if !(outputTokens > 0) || math.IsInf(outputTokens, 1) {
		return
	}
	cost := outputTokens * g.q.cfg.OutputWeight
	g.m.mu.Lock()
	g.c.charge(cost / g.weight)
	g.m.mu.Unlock()
	if cost > 0 {
		g.ten.series.Load().service[g.class].Add(cost)
	}
}

// Settle replaces the predicted prompt cost charged at dispatch with the
// actual one, promptTokens − cachedTokens from the response's usage, so a
// misprediction does not bias the shares. Only the first call counts.
func (g *Grant) Settle(promptTokens, cachedTokens float64) {
	actual := promptTokens - cachedTokens
	if !(actual > 0) || math.IsInf(actual, 1) {
		actual = 0
	}
	if !g.settled.CompareAndSwap(false, true) {
		return
	}
	delta := actual - g.cost
	g.m.mu.Lock()
	g.c.charge(delta / g.weight)
	g.cost = actual
	g.m.mu.Unlock()
	if delta > 0 {
		g.ten.series.Load().service[g.class].Add(delta)
	}
}

// Done ends the request: its capacity is free and the best waiting request
// for the model may be dispatched.
func (g *Grant) Done() {
	if !g.done.CompareAndSwap(false, true) {
		return
	}
	m := g.m
	m.mu.Lock()
	m.running--
	g.c.inflight--
	if m.queued > 0 {
		g.q.dispatchLocked(m, true)
	}
	m.mu.Unlock()
}

// giveBack returns a grant whose client left as it was dispatched: the
// prompt cost is refunded and the capacity freed.
func (g *Grant) giveBack() {
	g.m.mu.Lock()
	g.c.charge(-g.cost / g.weight)
	g.m.mu.Unlock()
	g.Done()
}
