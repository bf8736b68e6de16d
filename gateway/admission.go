package gateway

import "context"

// Admitter decides when a parsed request may be routed: the seam between
// parsing and routing where a fair queue makes requests wait. Routing
// happens only after Admit returns (late binding: a queued turn still goes
// to whichever replica holds its prefix when it leaves the queue).
type Admitter interface {
	// Admit blocks until r may proceed, or returns an error (an
	// *apierror.Error such as a 429, or ctx's error). On success the
	// gateway calls release exactly once, when the request has ended,
	// with what the replica reported (zero when it reported nothing).
	Admit(ctx context.Context, r *Request) (release func(Usage), err error)
}

// admitAll is the pass-through admission: every request at once.
type admitAll struct{}

func (admitAll) Admit(context.Context, *Request) (func(Usage), error) { return releaseNothing, nil }

func releaseNothing(Usage) {}
