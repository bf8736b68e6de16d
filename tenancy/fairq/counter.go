package fairq

import "math"

// ops is a pending update of a virtual counter: the function
// x ↦ max(x + add, floor). A charge of c adds c to both terms; a lift to f
// raises floor to f. Such functions compose in closed form, so every charge
// and lift made between two syncs travels to Redis as one (add, floor)
// pair, and a lift stays idempotent when several gateways make it.
type ops struct {
	add   float64
	floor float64 // -Inf: no lift
}

var identity = ops{floor: math.Inf(-1)}

func (o ops) apply(x float64) float64 { return max(x+o.add, o.floor) }

// then returns o followed by p: p.apply(o.apply(x)) for every x.
func (o ops) then(p ops) ops {
	return ops{add: o.add + p.add, floor: max(o.floor+p.add, p.floor)}
}

func (o ops) isIdentity() bool { return o.add == 0 && math.IsInf(o.floor, -1) }

// counter is one tenant's virtual token counter for one model: the
// service it has received, in cost units divided by its weight. Its fields
// are guarded by the model's mutex.
type counter struct {
	tenant string
	shared bool // synced through Redis; otherwise base holds everything

	base    float64 // the value Redis last returned (or the local value)
	sent    ops     // sent to Redis, reply pending
	pending ops     // made since the last snapshot

	queued   int    // this tenant's requests waiting for the model, any class
	inflight int    // its grants for the model not Done
	uses     uint64 // dispatches and charges, for idleness detection
	seenUses uint64 // uses at the last idleness sweep
}

func newCounter(tenant string, shared bool) *counter {
	return &counter{tenant: tenant, shared: shared, sent: identity, pending: identity}
}

// value is the counter as this gateway knows it now.
func (c *counter) value() float64 { return c.pending.apply(c.sent.apply(c.base)) }

// charge adds v (cost ÷ weight; negative refunds).
func (c *counter) charge(v float64) {
	c.uses++
	if !c.shared {
		c.base += v
		return
	}
	c.pending.add += v
	c.pending.floor += v
}

// idle reports whether the tenant has nothing waiting and nothing running
// for the model at this gateway: only then is it lifted. A tenant whose
// queue empties while its requests run (a closed-loop client between
// turns, or one whose requests the other gateways hold) is still being
// served; lifting it would discard the service it is owed, and with
// several gateways its per-gateway queue empties often.
func (c *counter) idle() bool { return c.queued == 0 && c.inflight == 0 }

// lift raises the counter to at least f, so idle time is not banked.
func (c *counter) lift(f float64) {
	if c.value() >= f {
		return
	}
	if !c.shared {
		c.base = f
		return
	}
	c.pending.floor = max(c.pending.floor, f)
}

// snapshot moves the pending ops to sent and returns them.
func (c *counter) snapshot() ops {
	c.sent, c.pending = c.sent.then(c.pending), identity
	return c.sent
}

// synced records Redis's value after the sent ops were applied there. A
// counter Redis no longer has (a flushed or restarted server) is re-seeded
// with this gateway's value on the next sync.
func (c *counter) synced(remote float64, ok bool) {
	if ok {
		c.base = remote
	} else if local := c.sent.apply(c.base); local > 0 {
		c.base = 0
		c.pending = ops{floor: local}.then(c.pending)
	}
	c.sent = identity
}

// unsent puts the sent ops back in front of the pending ones after a
// failed exchange.
func (c *counter) unsent() {
	c.pending, c.sent = c.sent.then(c.pending), identity
}
