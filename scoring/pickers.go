package scoring

import (
	"math/rand/v2"
	"slices"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// RoundRobin ignores scores and rotates through the endpoints it is given.
// The zero value is ready to use; it is safe for concurrent use.
type RoundRobin struct {
	next atomic.Uint64
}

// Pick implements Picker.
func (p *RoundRobin) Pick(_ *Request, eps []Endpoint, _ []float64, _ *rand.Rand) []int {
	n := len(eps)
	start := int((p.next.Add(1) - 1) % uint64(n))
	order := make([]int, n)
	for i := range order {
		order[i] = (start + i) % n
	}
	return order
}

// Rendezvous ignores scores and orders endpoints by highest-random-weight
// hashing of the request's session key with each endpoint's ID: a session
// always maps to the same endpoint while it is present, and removing an
// endpoint moves only the sessions that were on it. Requests without a
// session key go to a random endpoint (hashing the empty key would send
// them all to one).
type Rendezvous struct{}

// Pick implements Picker.
func (Rendezvous) Pick(r *Request, eps []Endpoint, _ []float64, rng *rand.Rand) []int {
	order := make([]int, len(eps))
	if r.SessionKey == "" {
		for i := range order {
			order[i] = i
		}
		shuffle(order, rng)
		return order
	}
	weights := make([]uint64, len(eps))
	var buf []byte
	for i := range eps {
		buf = append(buf[:0], r.SessionKey...)
		buf = append(buf, 0)
		buf = append(buf, eps[i].ID...)
		weights[i] = xxhash.Sum64(buf)
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case weights[a] > weights[b]:
			return -1
		case weights[a] < weights[b]:
			return 1
		}
		return 0
	})
	return order
}

var (
	_ Picker = MaxScore{}
	_ Picker = (*RoundRobin)(nil)
	_ Picker = Rendezvous{}
)
