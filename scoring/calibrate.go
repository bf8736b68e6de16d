package scoring

import (
	"math"
	"sync"
)

// Calibration constants.
const (
	// calibrationMemory is the forgetting factor per observation: the fit
	// weighs about the last 1 ÷ (1 − 0.995) = 200 observations.
	calibrationMemory = 0.995
	// calibrationPrior is the prior's weight, in observations: each scale
	// starts at 1 as if four observations had confirmed it.
	calibrationPrior = 4
	// minScale and maxScale bound each fitted scale: the prior may be off
	// by a factor of 16 either way (a dilated simulator, a faster GPU).
	minScale, maxScale = 1.0 / 16, 16
	// minObserved is the least TTFT the relative weighting divides by.
	minObserved = 0.01
)

// Calibrator fits each model's cost scales (Cost.QueueScale, TokenScale and
// StepScale) and its fixed overhead (Cost.Overhead) to observed times to
// first token: every completed request contributes its estimate's parts
// and the TTFT it actually had. It solves, per model, the weighted least
// squares
//
//	minimise Σ γᵏ (y − θ·f)² ÷ max(y, 10 ms)² + κ Σⱼ w̄ⱼ (θⱼ − θ⁰ⱼ)²
//
// over θ = (QueueScale, TokenScale, StepScale, Overhead), where f =
// (QueueSeconds, OwnSeconds, StepSeconds, 1 s) of the estimate at the
// prior's constants (QueueSeconds taken as 0, and AdmitSeconds taken off
// y, when the wait was KV-bound), y the observed TTFT, γ = 0.995 a
// forgetting factor (about the last 200 requests count), w̄ⱼ the mean
// weight an observation gives part j (at least a tenth of the parts'
// mean), θ⁰ = (1, 1, 1, 0) the prior and κ = 4 its weight in
// observations: relative errors count, so short and long requests weigh
// alike, and each part stays at its prior until observations move it;
// the scales stay within [1/16, 16] and the overhead within [0, 60 s].
// The overhead is what no replica's load explains: the network, the
// engine's HTTP front end, a loaded host.
//
// It reads no clock and does no I/O. A Calibrator is safe for concurrent
// use; the zero value is not (use NewCalibrator).
type Calibrator struct {
	prior Cost

	mu   sync.Mutex // guards fits
	fits map[string]*fit
}

// parts is the number of fitted parameters.
const parts = 4

// thetaPrior is the prior of the fitted parameters.
var thetaPrior = [parts]float64{1, 1, 1, 0}

// maxOverhead bounds the fitted overhead, seconds.
const maxOverhead = 60

// fit is one model's decayed normal equations and current parameters,
// and what its conversations look like.
type fit struct {
	a        [parts][parts]float64
	b        [parts]float64
	n        float64 // decayed observation count (the sum of the decay weights)
	theta    [parts]float64
	sessions SessionStats
	demand   Demand
}

// NewCalibrator returns a calibrator whose every model starts at prior
// (the zero Cost is DefaultCost).
func NewCalibrator(prior Cost) *Calibrator {
	return &Calibrator{prior: prior.WithDefaults(), fits: map[string]*fit{}}
}

// Cost returns model's calibrated cost: the prior's constants with the
// fitted scales and overhead.
func (c *Calibrator) Cost(model string) Cost {
	out := c.prior
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.fits[model]; f != nil {
		out.QueueScale, out.TokenScale, out.StepScale, out.Overhead = f.theta[0], f.theta[1], f.theta[2], f.theta[3]
	}
	return out
}

// Observations returns how many observations (decayed) model's fit holds.
func (c *Calibrator) Observations(model string) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.fits[model]; f != nil {
		return f.n
	}
	return 0
}

// Sessions returns a copy of model's conversation statistics.
func (c *Calibrator) Sessions(model string) SessionStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.fits[model]; f != nil {
		return f.sessions
	}
	return SessionStats{}
}

// ObserveTurn records that a conversation of model reached its turn-th
// turn, gap seconds after its previous one ended (gap is ignored for a
// first turn).
func (c *Calibrator) ObserveTurn(model string, turn int, gap float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.model(model)
	f.sessions.ObserveTurn(turn)
	if turn > 1 {
		f.sessions.ObserveGap(gap)
	}
}

// ObservePrefix records that a request of model and of session (a hash of
// its session key; 0 for none), at now seconds (any fixed origin), was
// scored with the prefix named key as the longest any replica held of its
// prompt, and returns how many earlier requests of model's other
// conversations shared it over the horizon of a conversation's lifetime
// (SessionStats.Lifetime; see Demand): the demand the replication term
// weighs (Input.Sharers). It is 0 until conversations have been seen.
func (c *Calibrator) ObservePrefix(model string, key, session uint64, now float64) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.model(model)
	return f.demand.Observe(key, session, now, f.sessions.Lifetime())
}

// model returns model's fit, creating it at the prior. The caller holds
// c.mu.
func (c *Calibrator) model(model string) *fit {
	f := c.fits[model]
	if f == nil {
		f = &fit{theta: thetaPrior}
		c.fits[model] = f
	}
	return f
}

// Observe records that a request of model, estimated as e (by any
// calibration), had observed seconds to its first token. Non-finite or
// negative values are ignored.
func (c *Calibrator) Observe(model string, e Estimate, observed float64) {
	x := [parts]float64{e.QueueSeconds, e.OwnSeconds, e.StepSeconds, 1}
	if e.AdmitBound {
		// The wait was the measured admission rate's, not the queue's.
		x[0], observed = 0, max(0, observed-e.AdmitSeconds)
	}
	if !(observed >= 0) || math.IsInf(observed, 0) || !finite(x) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.model(model).observe(x, observed)
}

func finite(x [parts]float64) bool {
	for _, v := range x {
		if !(v >= 0) || math.IsInf(v, 0) {
			return false
		}
	}
	return true
}

// observe adds one observation and re-solves.
func (f *fit) observe(x [parts]float64, y float64) {
	s := max(y, minObserved)
	w := 1 / (s * s)
	for i := range parts {
		f.b[i] = calibrationMemory*f.b[i] + w*x[i]*y
		for j := range parts {
			f.a[i][j] = calibrationMemory*f.a[i][j] + w*x[i]*x[j]
		}
	}
	f.n = calibrationMemory*f.n + 1
	f.solve()
}

// solve sets theta to the regularised least-squares solution. The prior
// on each part weighs as much as κ typical observations of it (the part's
// mean weight per observation, but at least a tenth of the parts' mean),
// so it fades as observations excite the part, holds where none do, and
// keeps a part that hardly varies on its own (a step cost that moves with
// the prefill) from absorbing the others' residual.
func (f *fit) solve() {
	var m [parts][parts + 1]float64
	n := max(f.n, 1)
	var mean float64
	for i := range parts {
		mean += f.a[i][i] / parts / n
	}
	for i := range parts {
		for j := range parts {
			m[i][j] = f.a[i][j]
		}
		k := calibrationPrior * max(f.a[i][i]/n, mean/10, 1e-12)
		m[i][i] += k
		m[i][parts] = f.b[i] + k*thetaPrior[i]
	}
	theta, ok := gauss(m)
	if !ok {
		return
	}
	for i := range parts - 1 {
		f.theta[i] = min(max(theta[i], minScale), maxScale)
	}
	f.theta[parts-1] = min(max(theta[parts-1], 0), maxOverhead)
}

// gauss solves the system in m (augmented with its right-hand side) by
// Gaussian elimination with partial pivoting.
func gauss(m [parts][parts + 1]float64) ([parts]float64, bool) {
	for col := range parts {
		p := col
		for r := col + 1; r < parts; r++ {
			if math.Abs(m[r][col]) > math.Abs(m[p][col]) {
				p = r
			}
		}
		if math.Abs(m[p][col]) < 1e-15 {
			return [parts]float64{}, false
		}
		m[col], m[p] = m[p], m[col]
		for r := col + 1; r < parts; r++ {
			k := m[r][col] / m[col][col]
			for c := col; c <= parts; c++ {
				m[r][c] -= k * m[col][c]
			}
		}
	}
	var x [parts]float64
	for r := parts - 1; r >= 0; r-- {
		v := m[r][parts]
		for c := r + 1; c < parts; c++ {
			v -= m[r][c] * x[c]
		}
		x[r] = v / m[r][r]
	}
	return x, true
}
