package misses

import (
	"slices"
	"strings"
	"sync"

	"github.com/warmpath/warmpath/internal/lru"
)

// Defaults of RecentConfig.
const (
	DefaultRecentBytes      = 64 << 20
	DefaultRecentCandidates = 4
)

// RecentConfig configures a Recent. The zero value is valid: every field
// has a default.
type RecentConfig struct {
	// MaxBytes bounds the fingerprints kept, over all tenants (counted by
	// Fingerprint.Size); the least recently added go first. Default
	// DefaultRecentBytes.
	MaxBytes int
	// Candidates is how many remembered prompts Find compares with the
	// turn, the newest of those it may continue; default
	// DefaultRecentCandidates.
	Candidates int
}

// Recent finds a turn's previous turn by content, for when its session
// key cannot: the gateway's session key hashes the conversation's
// opening (system messages, tools, first user message), so a client that
// changes its system prompt or tools every turn gets a new key every
// turn, and the break is never seen. Recent remembers each tenant's
// recent prompts under two anchors: the chained hash of all their
// messages after the system ones (strong: a later turn of the
// conversation starts its messages with them whatever it did to its
// system prompt or tools), and their last message with its index (weak:
// it also survives a rewritten earlier message, but a short message such
// as "continue" may stand at that index in other conversations too).
// The zero value is not valid; use NewRecent. A Recent is safe for
// concurrent use; the fingerprints it returns must not be modified.
type Recent struct {
	cfg RecentConfig

	mu       sync.Mutex // guards the fields below
	used     int
	next     uint64
	byID     map[uint64]*remembered
	byAnchor map[anchor][]uint64 // oldest first
	order    lru.Set[uint64]
}

// anchor is a key a remembered prompt is found by, scoped to its tenant:
// strong, the chain of its messages' hashes; weak, its last message's
// index and hash.
type anchor struct {
	tenant string
	strong bool
	index  int32
	hash   uint64
}

type remembered struct {
	family string
	fp     *Fingerprint
	keys   [2]anchor
}

// NewRecent returns an empty Recent.
func NewRecent(cfg RecentConfig) *Recent {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultRecentBytes
	}
	if cfg.Candidates <= 0 {
		cfg.Candidates = DefaultRecentCandidates
	}
	return &Recent{cfg: cfg, byID: map[uint64]*remembered{}, byAnchor: map[anchor][]uint64{}}
}

// chain folds a message part's hash into the chain of those before it.
func chain(h, part uint64) uint64 { return (h^part)*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019 }

// Add remembers fp, the prompt of one of tenant's turns; family is its
// client-named session (session.Key.Family), "" if none, which Find
// prefers among equally good candidates. A prompt whose last part is not
// a message (only system messages and tools) is not remembered.
func (r *Recent) Add(tenant, family string, fp *Fingerprint) {
	if len(fp.Parts) == 0 || fp.Parts[len(fp.Parts)-1].Part != PartMessage {
		return
	}
	var h uint64
	for _, p := range fp.Parts {
		if p.Part == PartMessage {
			h = chain(h, p.Hash)
		}
	}
	// Clones: the caller's strings may alias a request body.
	tenant, family = strings.Clone(tenant), strings.Clone(family)
	last := fp.Parts[len(fp.Parts)-1]
	m := &remembered{family: family, fp: fp, keys: [2]anchor{
		{tenant: tenant, strong: true, hash: h}, {tenant: tenant, index: last.Index, hash: last.Hash}}}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	r.byID[r.next] = m
	for _, k := range m.keys {
		r.byAnchor[k] = append(r.byAnchor[k], r.next)
	}
	r.order.Touch(r.next)
	r.used += fp.Size()
	for r.used > r.cfg.MaxBytes {
		id, ok := r.order.RemoveOldest()
		if !ok {
			break
		}
		r.forget(id)
	}
}

// forget drops remembered prompt id.
func (r *Recent) forget(id uint64) {
	m := r.byID[id]
	delete(r.byID, id)
	r.used -= m.fp.Size()
	for _, k := range m.keys {
		ids := slices.DeleteFunc(r.byAnchor[k], func(x uint64) bool { return x == id })
		if len(ids) == 0 {
			delete(r.byAnchor, k)
		} else {
			r.byAnchor[k] = ids
		}
	}
}

// candidate is a remembered prompt found by a strong or a weak anchor.
type candidate struct {
	*remembered
	strong bool
}

// candidates returns the remembered prompts of tenant that p may
// continue: those whose messages p's messages start with (strong), then
// those whose last message p holds at the same index (weak); newest
// first within each kind, Candidates of each at most.
func (r *Recent) candidates(tenant string, p *Prompt) []candidate {
	chains := make([]uint64, len(p.parts))
	var h uint64
	for j, s := range p.parts {
		if s.part == PartMessage {
			h = chain(h, s.hash)
		}
		chains[j] = h
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []candidate
	seen := map[uint64]bool{}
	for _, strong := range []bool{true, false} {
		n := 0
		for j := len(p.parts) - 1; j >= 0 && n < r.cfg.Candidates; j-- {
			s := p.parts[j]
			if s.part != PartMessage {
				continue
			}
			k := anchor{tenant: tenant, strong: true, hash: chains[j]}
			if !strong {
				k = anchor{tenant: tenant, index: int32(s.index), hash: s.hash}
			}
			ids := r.byAnchor[k]
			for i := len(ids) - 1; i >= 0 && n < r.cfg.Candidates; i-- {
				if !seen[ids[i]] {
					seen[ids[i]] = true
					out = append(out, candidate{r.byID[ids[i]], strong})
					n++
				}
			}
		}
	}
	return out
}

// Find returns the remembered prompt of tenant that p most likely
// continues, and where p departs from it; nil and a KindFirst Diff when
// none qualifies. Of the candidates it picks, in this order of
// preference, one that p extends, one found by the strong anchor, the
// longest match, and one of family.
func (r *Recent) Find(tenant, family string, p *Prompt, opt Options) (*Fingerprint, Diff) {
	var (
		best     *Fingerprint
		bestDiff = Diff{Kind: KindFirst, Index: -1}
		bestRank [4]int
	)
	for _, c := range r.candidates(tenant, p) {
		d := Locate(c.fp, p, opt)
		rank := [4]int{0, 0, d.Matched, 0}
		if !d.Broke() {
			rank[0] = 1
		}
		if c.strong {
			rank[1] = 1
		}
		if family != "" && c.family == family {
			rank[3] = 1
		}
		if best == nil || slices.Compare(rank[:], bestRank[:]) > 0 {
			best, bestDiff, bestRank = c.fp, d, rank
		}
	}
	return best, bestDiff
}
