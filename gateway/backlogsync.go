package gateway

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Gateways behind one load balancer share a fleet, so each one's
// admission backlog delays the others' requests: a gateway that counted
// only its own would price a miss at 1/N of its cost and see 1/N of the
// requests held for a replica. backlogSync shares them through Redis,
// batched like the queue's virtual counters: every queue.sync_interval
// each gateway writes its part (requests waiting per model, and the ones
// held for a replica with their arrival and uncached prefill) as one
// field of one hash, and reads back the others' in the same round trip.
// A gateway that stops writing drops out after backlogTTL.

// backlogHash is the hash's key, after redis.key_prefix.
const backlogHash = "backlog"

// backlogTTL is how long another gateway's part counts after it was
// written: ten exchanges, at least a second.
func backlogTTL(every time.Duration) time.Duration { return max(time.Second, 10*every) }

// sharedBacklog is one gateway's part.
type sharedBacklog struct {
	At      int64          `json:"at"`      // when written, Unix milliseconds
	Waiting map[string]int `json:"waiting"` // model → requests waiting in admission
	Held    []heldPlan     `json:"held"`    // requests held for a replica
}

// heldPlan is a request held for a replica.
type heldPlan struct {
	Replica string `json:"r"` // the replica's fleet name
	Since   int64  `json:"s"` // when it entered admission, Unix nanoseconds
	Tokens  int64  `json:"t"` // its uncached prompt there
}

// remoteBacklog is the other gateways' parts, summed.
type remoteBacklog struct {
	waiting map[string]int        // model → requests waiting
	held    map[string][]heldPlan // replica → requests held for it
	read    time.Time             // when exchanged
	peers   int                   // the other gateways whose parts count
}

// part returns this gateway's part at now.
func (b *backlog) part(now time.Time) sharedBacklog {
	s := sharedBacklog{At: now.UnixMilli(), Waiting: map[string]int{}}
	b.models.Range(func(k, v any) bool {
		if n := v.(*atomic.Int64).Load(); n > 0 {
			s.Waiting[k.(string)] = int(n)
		}
		return true
	})
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, pl := range b.plans {
		s.Held = append(s.Held, heldPlan{Replica: pl.rep.Spec.Name, Since: pl.at, Tokens: pl.tokens})
	}
	return s
}

// backlogSync exchanges the backlog with the other gateways (see above).
type backlogSync struct {
	b            *backlog
	rdb          redis.UniversalClient
	key, id      string
	every, limit time.Duration // the exchange's period and each call's timeout
	failed       func()        // counts a failed exchange
	log          *slog.Logger
	stale        []string // other gateways' fields past backlogTTL, deleted by the next exchange
}

// Run exchanges every s.every until ctx ends, then removes this
// gateway's part.
func (s *backlogSync) Run(ctx context.Context) error {
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.limit)
			defer cancel()
			s.rdb.HDel(dctx, s.key, s.id)
			return nil
		case now := <-t.C:
			if err := s.exchange(ctx, now); err != nil && ctx.Err() == nil {
				s.failed()
				s.log.Debug("backlog exchange failed", "err", err)
				if r := s.b.remote.Load(); r != nil && now.Sub(r.read) > backlogTTL(s.every) {
					s.b.remote.Store(nil) // too old to count
				}
			}
		}
	}
}

// exchange writes this gateway's part and reads the others', in one
// round trip.
func (s *backlogSync) exchange(ctx context.Context, now time.Time) error {
	mine, err := json.Marshal(s.b.part(now))
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, s.limit)
	defer cancel()
	var all *redis.MapStringStringCmd
	_, err = s.rdb.Pipelined(rctx, func(p redis.Pipeliner) error {
		if len(s.stale) > 0 {
			p.HDel(rctx, s.key, s.stale...)
		}
		p.HSet(rctx, s.key, s.id, mine)
		p.PExpire(rctx, s.key, backlogTTL(s.every))
		all = p.HGetAll(rctx, s.key)
		return nil
	})
	if err != nil {
		return err
	}
	s.b.remote.Store(s.others(all.Val(), now))
	return nil
}

// others sums the other gateways' parts of fields, noting those past
// backlogTTL as stale.
func (s *backlogSync) others(fields map[string]string, now time.Time) *remoteBacklog {
	r := &remoteBacklog{waiting: map[string]int{}, held: map[string][]heldPlan{}, read: now}
	s.stale = s.stale[:0]
	oldest := now.Add(-backlogTTL(s.every)).UnixMilli()
	for id, v := range fields {
		if id == s.id {
			continue
		}
		var part sharedBacklog
		if err := json.Unmarshal([]byte(v), &part); err != nil || part.At < oldest {
			s.stale = append(s.stale, id)
			continue
		}
		r.peers++
		for m, n := range part.Waiting {
			r.waiting[m] += max(0, n)
		}
		for _, h := range part.Held {
			r.held[h.Replica] = append(r.held[h.Replica], h)
		}
	}
	return r
}
