package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// Snapshot is an immutable view of the fleet's membership. Do not modify
// it or its Replicas slice. The replicas' own state changes independently;
// read it through [Replica.State].
type Snapshot struct {
	// Replicas are the members, sorted by Spec.Name.
	Replicas []*Replica
	// Version increases by one with every membership change.
	Version uint64

	byName  map[string]*Replica
	changed chan struct{} // closed when a newer snapshot replaces this one
}

// newSnapshot returns a snapshot of rs, sorting rs in place.
func newSnapshot(rs []*Replica, version uint64) *Snapshot {
	slices.SortFunc(rs, func(a, b *Replica) int { return cmp.Compare(a.Spec.Name, b.Spec.Name) })
	s := &Snapshot{
		Replicas: rs,
		Version:  version,
		byName:   make(map[string]*Replica, len(rs)),
		changed:  make(chan struct{}),
	}
	for _, r := range rs {
		s.byName[r.Spec.Name] = r
	}
	return s
}

// Lookup returns the member named name, or nil.
func (s *Snapshot) Lookup(name string) *Replica { return s.byName[name] }

// Changed returns a channel that is closed when a newer snapshot replaces
// s. Waiting on the channel of the snapshot one has just processed cannot
// miss a change:
//
//	for s := f.Snapshot(); ; s = f.Snapshot() {
//		reconcile(s)
//		select {
//		case <-s.Changed():
//		case <-ctx.Done():
//			return
//		}
//	}
func (s *Snapshot) Changed() <-chan struct{} { return s.changed }

// Diff returns the members of s that are not in prev (added) and the
// members of prev that are not in s (removed), by pointer identity, each
// sorted by name. A nil prev counts as empty. A replica whose address comes
// back after leaving is a new member: it shows up as added.
func (s *Snapshot) Diff(prev *Snapshot) (added, removed []*Replica) {
	if prev == nil {
		return slices.Clone(s.Replicas), nil
	}
	for _, r := range s.Replicas {
		if prev.byName[r.Spec.Name] != r {
			added = append(added, r)
		}
	}
	for _, r := range prev.Replicas {
		if s.byName[r.Spec.Name] != r {
			removed = append(removed, r)
		}
	}
	return added, removed
}

// Fleet tracks the upstream replicas: membership (static and DNS), health,
// engine metrics and served models. Create it with [New] and start its
// goroutines with [Fleet.Run]. Its methods are safe for concurrent use;
// readers never block on writers.
type Fleet struct {
	cfg        Config // normalized; read-only after New
	log        *slog.Logger
	ownsClient bool // cfg.Client was created by New; Run closes its idle connections
	dns        []*dnsWatcher

	snap atomic.Pointer[Snapshot] // never nil

	mu      sync.Mutex      // guards the fields below and serializes publishing
	dnsSets [][]ReplicaSpec // per DNS spec: the last successful resolution
	running bool            // Run is active
	runCtx  context.Context // Run's context while running
	loops   *sync.WaitGroup // replica goroutines of the active Run
}

// dnsWatcher is one DNS spec with its resolution counters.
type dnsWatcher struct {
	idx      int
	spec     DNSSpec
	ok, fail atomic.Uint64
}

// New validates cfg and returns a fleet whose first snapshot holds the
// static replicas, all pending (unhealthy until their first successful
// health check). DNS replicas appear once Run has resolved their names. New
// registers the fleet's metrics on cfg.Registerer and starts no goroutines.
func New(cfg Config) (*Fleet, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	f := &Fleet{cfg: cfg, dnsSets: make([][]ReplicaSpec, len(cfg.Discovery))}
	if f.cfg.Logger == nil {
		f.cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f.log = f.cfg.Logger
	if f.cfg.Client == nil {
		f.cfg.Client = defaultClient()
		f.ownsClient = true
	}
	if f.cfg.Resolver == nil {
		f.cfg.Resolver = net.DefaultResolver
	}
	if f.cfg.Now == nil {
		f.cfg.Now = time.Now
	}
	for i, d := range cfg.Discovery {
		f.dns = append(f.dns, &dnsWatcher{idx: i, spec: d})
	}
	rs := make([]*Replica, 0, len(cfg.Replicas))
	for _, s := range cfg.Replicas {
		rs = append(rs, newReplica(s, &f.cfg, f.log))
	}
	f.snap.Store(newSnapshot(rs, 1))
	if f.cfg.Registerer != nil {
		if err := f.cfg.Registerer.Register(&collector{f: f}); err != nil {
			return nil, fmt.Errorf("fleet: register metrics: %w", err)
		}
	}
	return f, nil
}

// defaultClient returns the client used when Config.Client is nil: bounded
// dial and header waits, a few idle connections per replica, no proxy from
// the environment (replicas are addressed directly).
func defaultClient() *http.Client {
	t := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 5 * time.Second,
		ForceAttemptHTTP2:     false,
	}
	return &http.Client{Transport: t, Timeout: 30 * time.Second}
}

// Run monitors the fleet until ctx is done: for each replica one goroutine
// checks health (and discovers models) and one scrapes metrics; for each
// DNS spec one goroutine re-resolves the name. Replica goroutines start and
// stop with membership. Run returns nil once ctx is done and every goroutine
// it started has exited. Run must not be called again until it returns.
func (f *Fleet) Run(ctx context.Context) error {
	f.mu.Lock()
	if f.running {
		f.mu.Unlock()
		return errors.New("fleet: run: already running")
	}
	var loops sync.WaitGroup
	f.running, f.runCtx, f.loops = true, ctx, &loops
	for _, r := range f.snap.Load().Replicas {
		f.startLocked(r)
	}
	f.mu.Unlock()

	g, gctx := errgroup.WithContext(ctx)
	for _, w := range f.dns {
		g.Go(func() error {
			f.watchDNS(gctx, w)
			return nil
		})
	}
	<-ctx.Done()
	_ = g.Wait() // the DNS goroutines return nil; after this nothing publishes

	f.mu.Lock()
	for _, r := range f.snap.Load().Replicas {
		if r.cancel != nil {
			r.cancel()
			r.cancel = nil
		}
	}
	f.running, f.runCtx, f.loops = false, nil, nil
	f.mu.Unlock()
	loops.Wait()
	if f.ownsClient {
		f.cfg.Client.CloseIdleConnections()
	}
	return nil
}

// startLocked starts r's goroutines under the active Run. The caller holds
// f.mu.
func (f *Fleet) startLocked(r *Replica) {
	if !f.running || r.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(f.runCtx)
	r.cancel = cancel
	p := &prober{r: r, client: f.cfg.Client, header: f.cfg.Header, now: f.cfg.Now}
	f.loops.Go(func() { p.healthLoop(ctx) })
	f.loops.Go(func() { p.scrapeLoop(ctx) })
}

// Snapshot returns the current membership. It never returns nil and never
// blocks.
func (f *Fleet) Snapshot() *Snapshot { return f.snap.Load() }

// Replica returns the current member named name, or nil.
func (f *Fleet) Replica(name string) *Replica { return f.snap.Load().Lookup(name) }

// Watch calls fn with the current snapshot and then with each newer one
// until ctx is done, and returns nil. Changes that happen while fn runs are
// coalesced: fn sees the latest snapshot, and can find what changed with
// [Snapshot.Diff]. fn runs on Watch's goroutine.
func (f *Fleet) Watch(ctx context.Context, fn func(*Snapshot)) error {
	for s := f.Snapshot(); ; s = f.Snapshot() {
		fn(s)
		select {
		case <-s.Changed():
		case <-ctx.Done():
			return nil
		}
	}
}

// Models returns the sorted union of the models served by healthy
// replicas, nil when none is healthy.
func (f *Fleet) Models() []string {
	var out []string
	for _, r := range f.snap.Load().Replicas {
		if s := r.State(); s.Healthy {
			out = append(out, s.Models...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// setDNS records the resolution of DNS spec idx and publishes the new
// membership if it changed.
func (f *Fleet) setDNS(idx int, specs []ReplicaSpec) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dnsSets[idx] != nil && slices.Equal(f.dnsSets[idx], specs) {
		return
	}
	f.dnsSets[idx] = specs
	f.publishLocked()
}

// publishLocked merges the static and DNS specs into a membership, keeping
// the *Replica of every member whose spec is unchanged, and publishes a new
// snapshot if the membership changed: it closes the old snapshot's Changed
// channel, stops and closes the removed replicas and starts the added ones.
// The caller holds f.mu.
func (f *Fleet) publishLocked() {
	old := f.snap.Load()
	want := make([]ReplicaSpec, 0, len(old.Replicas))
	seen := make(map[string]bool, len(old.Replicas))
	want = append(want, f.cfg.Replicas...)
	for _, s := range f.cfg.Replicas {
		seen[s.Name] = true
	}
	for i, set := range f.dnsSets {
		for _, s := range set {
			if seen[s.Name] {
				f.log.Debug("fleet: dns replica shadowed by an earlier one", "dns", f.cfg.Discovery[i].Name, "replica", s.Name)
				continue
			}
			seen[s.Name] = true
			want = append(want, s)
		}
	}

	next := make([]*Replica, 0, len(want))
	var added []*Replica
	for _, s := range want {
		if r := old.byName[s.Name]; r != nil && r.Spec == s {
			next = append(next, r)
			continue
		}
		r := newReplica(s, &f.cfg, f.log)
		next = append(next, r)
		added = append(added, r)
	}
	snap := newSnapshot(next, old.Version+1)
	var removed []*Replica
	for _, r := range old.Replicas {
		if snap.byName[r.Spec.Name] != r {
			removed = append(removed, r)
		}
	}
	if len(added) == 0 && len(removed) == 0 {
		return
	}
	f.snap.Store(snap)
	close(old.changed)
	for _, r := range removed {
		if r.cancel != nil {
			r.cancel()
			r.cancel = nil
		}
		close(r.removed)
		if e := r.up.Swap(nil); e != nil {
			e.cancel() // a member no more: its requests are released too
		}
	}
	for _, r := range added {
		f.startLocked(r)
	}
	f.log.Info("fleet: membership changed", "version", snap.Version,
		"replicas", len(snap.Replicas), "added", names(added), "removed", names(removed))
}

// names returns the replicas' names.
func names(rs []*Replica) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Spec.Name
	}
	return out
}
