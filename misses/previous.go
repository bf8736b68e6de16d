package misses

import (
	"strings"
	"sync"

	"github.com/warmpath/warmpath/internal/lru"
)

// DefaultPreviousBytes is the default budget of a Previous: 64 MiB, about
// 3,000 sessions of 100 KB prompts at the default granule.
const DefaultPreviousBytes = 64 << 20

// Previous keeps each session's last fingerprint in process memory,
// dropping the least recently used beyond a budget of bytes (counted by
// Fingerprint.Size). It suits one gateway process; processes that share
// sessions keep fingerprints in their shared store instead
// (Fingerprint.MarshalBinary). The zero value is not valid; use
// NewPrevious. A Previous is safe for concurrent use; the fingerprints
// it returns must not be modified.
type Previous struct {
	maxBytes int

	mu    sync.Mutex // guards used, byKey and order
	used  int
	byKey map[string]*Fingerprint
	order lru.Set[string]
}

// NewPrevious returns an empty Previous holding at most maxBytes of
// fingerprints (DefaultPreviousBytes when maxBytes <= 0).
func NewPrevious(maxBytes int) *Previous {
	if maxBytes <= 0 {
		maxBytes = DefaultPreviousBytes
	}
	return &Previous{maxBytes: maxBytes, byKey: map[string]*Fingerprint{}}
}

// Get returns session's last fingerprint, nil if none is kept.
func (p *Previous) Get(session string) *Fingerprint {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.byKey[session]
	if f != nil {
		p.order.MoveToFront(session)
	}
	return f
}

// Put makes f session's last fingerprint, then drops the least recently
// used sessions until the budget holds (f too, if it alone exceeds it).
func (p *Previous) Put(session string, f *Fingerprint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old := p.byKey[session]; old != nil {
		p.used -= old.Size()
	} else {
		session = strings.Clone(session) // the caller's string may alias a request body
	}
	p.byKey[session] = f
	p.used += f.Size()
	p.order.Touch(session)
	for p.used > p.maxBytes {
		k, ok := p.order.RemoveOldest()
		if !ok {
			break
		}
		p.used -= p.byKey[k].Size()
		delete(p.byKey, k)
	}
}

// Len returns how many sessions are kept and their fingerprints' bytes.
func (p *Previous) Len() (sessions, bytes int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byKey), p.used
}
