package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/kvevents"
)

// runKVEvents owns the KV-event subscribers: in the per-replica topology one
// per KV source of every fleet member, started and stopped as membership
// changes; in the central topology one bound socket. It also keeps the
// indexes' view of each replica (model, KV capacity) current. It returns
// when ctx ends, after every socket is closed.
func (g *Gateway) runKVEvents(ctx context.Context) error {
	zctx, err := zmq.NewContext()
	if err != nil {
		return fmt.Errorf("gateway: zmq context: %w", err)
	}
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		_ = zctx.Term()
	}()

	topics := &topicNames{}
	topics.update(g.fleet.Snapshot())
	if g.cfg.KVEvents.Topology == TopologyCentral {
		c, err := kvevents.NewCentral(zctx, kvevents.CentralConfig{
			Bind:    g.cfg.KVEvents.Bind,
			Connect: g.cfg.KVEvents.Connect,
			Ranks:   g.cfg.kvRanks(),
			Resolve: topics.resolve,
			ReplayEndpoint: func(replica string) string {
				if r := g.fleet.Replica(replica); r != nil {
					return r.Spec.ReplayEndpoint
				}
				return ""
			},
			Handler: g.router.Index(),
			Metrics: g.obs.kvm,
			Logger:  g.log.With("component", "kvevents"),
		})
		if err != nil {
			return fmt.Errorf("gateway: kv_events: %w", err)
		}
		if g.cfg.KVEvents.Connect != "" {
			g.log.Info("receiving KV events", "topology", TopologyCentral, "relay", c.Endpoint())
		} else {
			g.log.Info("receiving KV events", "topology", TopologyCentral, "bind", c.Endpoints())
		}
		wg.Go(func() { g.runSubscriber(ctx, "central", c.Run) })
	}

	wg.Go(func() { g.syncReplicas(ctx) })

	subs := map[*fleet.Replica]context.CancelFunc{}
	err = g.fleet.Watch(ctx, func(s *fleet.Snapshot) {
		topics.update(s)
		live := make(map[*fleet.Replica]bool, len(s.Replicas))
		for _, rep := range s.Replicas {
			live[rep] = true
			if _, ok := subs[rep]; ok {
				continue
			}
			rctx, cancel := context.WithCancel(ctx)
			subs[rep] = cancel
			if g.cfg.KVEvents.Topology != TopologyPerReplica {
				continue
			}
			wg.Go(func() { g.subscribe(rctx, zctx, rep) })
		}
		for rep, cancel := range subs {
			if !live[rep] {
				cancel()
				delete(subs, rep)
				g.router.Index().Forget(rep.Spec.Name)
			}
		}
	})
	for _, cancel := range subs {
		cancel()
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("gateway: watch fleet: %w", err)
	}
	return nil
}

// subscribe runs the KV-event subscribers of one replica (one per
// data-parallel rank) until ctx ends. The replica's model roots its block
// keys, so it is registered first: a replica without a configured model is
// subscribed once /v1/models has named one.
func (g *Gateway) subscribe(ctx context.Context, zctx *zmq.Context, rep *fleet.Replica) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for !g.registerModel(rep) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, src := range rep.Spec.KVSources() {
		sub, err := kvevents.NewSubscriber(zctx, kvevents.SubscriberConfig{
			Replica:        rep.Spec.Name,
			Endpoint:       src.Endpoint,
			ReplayEndpoint: src.ReplayEndpoint,
			Handler:        g.router.Index(),
			Metrics:        g.obs.kvm,
			Logger:         g.log.With("component", "kvevents", "replica", rep.Spec.Name, "rank", src.Rank),
		})
		if err != nil {
			g.log.Error("cannot subscribe to KV events; routing to this replica is blind to its cache", "replica", rep.Spec.Name, "endpoint", src.Endpoint, "err", err)
			continue
		}
		wg.Go(func() { g.runSubscriber(ctx, rep.Spec.Name, sub.Run) })
	}
}

// registerModel tells the index which model roots rep's block keys: the
// configured one, or the first /v1/models named. It reports false while
// neither is known.
func (g *Gateway) registerModel(rep *fleet.Replica) bool {
	model := rep.Spec.Model
	if st := rep.State(); model == "" && len(st.Models) > 0 {
		model = st.Models[0]
	}
	if model == "" {
		return false
	}
	g.router.Index().SetModel(rep.Spec.Name, model)
	return true
}

// cpuKeys is the CPU-tier bound of a replica in the index's keys: the
// engine's num_cpu_blocks of its block size, for each data-parallel rank;
// 0 when the engine reports none.
func cpuKeys(rep *fleet.Replica, st *fleet.State, indexBlock int) int {
	if st.NumCPUBlocks <= 0 || st.BlockSize <= 0 {
		return 0
	}
	return st.NumCPUBlocks * max(rep.Spec.DataParallelSize, 1) * st.BlockSize / max(indexBlock, 1)
}

// runSubscriber runs one subscriber until ctx ends. A subscriber rebuilds
// its own sockets after errors (with a jittered backoff); its Run returns
// early only when the zmq context is terminated, which ends every
// subscriber, so there is nothing to restart: the error is logged.
func (g *Gateway) runSubscriber(ctx context.Context, name string, run func(context.Context) error) {
	if err := run(ctx); err != nil && ctx.Err() == nil {
		g.log.Error("KV-event subscriber stopped; routing to its replicas is blind to their caches", "source", name, "err", err)
	}
}

// syncReplicas keeps the indexes' per-replica facts current, once per
// metrics scrape: the model that roots a replica's block keys (configured,
// or discovered from /v1/models), the approximate index's capacity (from
// the engine's KV size), the precise index's CPU-tier bound (from the
// engine's CPU offload size), and, when a replica restarted (fleet.State's
// Restarts: its counters went back to zero), what it held: nothing. Its
// KV events would say so only once it next serves; meanwhile a sticky
// session would be predicted warm on a cold cache.
func (g *Gateway) syncReplicas(ctx context.Context) {
	t := time.NewTicker(max(g.cfg.Health.ScrapeInterval, 50*time.Millisecond))
	defer t.Stop()
	cpu := map[string]int{}              // CPU-tier bounds set, by replica
	restarts := map[*fleet.Replica]int{} // restarts seen, per member
	for {
		reps := g.fleet.Snapshot().Replicas
		next := make(map[*fleet.Replica]int, len(reps))
		for _, rep := range reps {
			g.registerModel(rep) // models discovered later (central topology)
			st := rep.State()
			g.router.Approx().SizeTo(rep.Spec.Name, st.NumGPUBlocks*st.BlockSize)
			if n := cpuKeys(rep, st, g.cfg.Routing.BlockSize); n > 0 && cpu[rep.Spec.Name] != n {
				cpu[rep.Spec.Name] = n
				_ = g.router.Index().Blocks().SetCPUCapacity(rep.Spec.Name, n) // errs only when the replica table is full
			}
			if seen, ok := restarts[rep]; ok && st.Restarts > seen {
				g.router.Index().Clear(rep.Spec.Name)
				g.obs.m.replicaRestarts.WithLabelValues(rep.Spec.Name).Inc()
			}
			next[rep] = st.Restarts
		}
		restarts = next
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// topicNames maps the replica a KV-event topic names (kvevents.ParseTopic)
// to the fleet's name for it, for the central topology: each replica's
// kv_topic, its name, and its URL's host:port, in that order of
// precedence. It is rebuilt from every fleet snapshot and read lock-free
// by the central's goroutine.
type topicNames struct {
	m atomic.Pointer[map[string]string]
}

// update rebuilds the map from a snapshot's members.
func (t *topicNames) update(s *fleet.Snapshot) {
	m := make(map[string]string, 3*len(s.Replicas))
	// Weakest claims first, so that stronger ones overwrite them.
	for _, rep := range s.Replicas {
		m[hostPort(rep.URL())] = rep.Spec.Name
	}
	for _, rep := range s.Replicas {
		m[rep.Spec.Name] = rep.Spec.Name
	}
	for _, rep := range s.Replicas {
		if rep.Spec.KVTopic != "" {
			name, _ := kvevents.ParseTopic(rep.Spec.KVTopic)
			m[name] = rep.Spec.Name
		}
	}
	t.m.Store(&m)
}

// resolve implements kvevents.CentralConfig.Resolve.
func (t *topicNames) resolve(topicReplica string) (string, bool) {
	m := t.m.Load()
	if m == nil {
		return "", false
	}
	name, ok := (*m)[topicReplica]
	return name, ok
}

// hostPort is u's host:port, with the scheme's default port when u names
// none (as fleet names replicas by default).
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}
