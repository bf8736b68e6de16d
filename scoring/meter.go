package scoring

import "math"

// MeterWindow is the time constant of a [Meter], in seconds: rates weigh
// the last ten seconds most, and events a minute old hardly at all.
const MeterWindow = 10.0

// Meter is an exponentially weighted moving rate of requests and of tokens
// (a replica's arrivals and their uncached prompt tokens): each event adds
// 1 ÷ MeterWindow to the rate, and the rate decays by e^(−dt ÷ MeterWindow)
// as time passes, so a steady stream of r events per second converges to
// r. It reads no clock: the caller says how much time passed. The zero
// value is an idle meter; a Meter is not safe for concurrent use.
type Meter struct {
	// Requests and Tokens are the current rates, per second.
	Requests, Tokens float64
}

// Advance decays the rates by dt seconds of time passed (non-positive dt
// changes nothing).
func (m *Meter) Advance(dt float64) {
	if !(dt > 0) {
		return
	}
	f := math.Exp(-dt / MeterWindow)
	m.Requests *= f
	m.Tokens *= f
}

// Add counts requests arrivals carrying tokens tokens (negative counts,
// counter resets, are ignored).
func (m *Meter) Add(requests, tokens float64) {
	if requests > 0 {
		m.Requests += requests / MeterWindow
	}
	if tokens > 0 {
		m.Tokens += tokens / MeterWindow
	}
}

// PerRequest returns the mean tokens per request over the window, 0 when
// no request was seen.
func (m *Meter) PerRequest() float64 {
	if m.Requests <= 1e-9 {
		return 0
	}
	return m.Tokens / m.Requests
}
