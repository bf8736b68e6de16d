package gateway

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Prefix claims tell gateways behind one load balancer where the others
// have just sent a long prefill. A gateway records what its own routed
// requests are about to store (speculative index entries) but sees the
// other gateways' only when the engine's KV events arrive, after the
// prefill: a context's first requests through two gateways then start on
// two replicas and the context is prefilled, and cached, twice. So a
// gateway that sends a replica at least routing.claim_min_tokens of
// uncached prompt writes, off the request path, a claim per checkpoint
// of the prompt's block keys (depths 1, 2, 3, 4, 6, 8, … and the whole prompt:
// block key → replica, expiring after routing.speculative_ttl), and a
// gateway about to route a prompt with at least that much uncached reads
// the claims deeper than what it already matched (one pipelined round
// trip), speculates each claimed prefix on its replica, and matches
// again, so the decision weighs the other gateway's prefill as its own.
// Only while other gateways are seen (the queue's backlog exchange): a
// single gateway neither reads nor writes. Claim depths are powers of two
// and one and a half times them, so a peer's prefix counts for at least
// two thirds of its length.

// claimPrefix prefixes a claim's key, after redis.key_prefix.
const claimPrefix = "claim:"

// prefixClaims reads and writes claims (see above).
type prefixClaims struct {
	rdb     redis.UniversalClient
	prefix  string        // redis.key_prefix + claimPrefix
	ttl     time.Duration // a claim's life: routing.speculative_ttl
	timeout time.Duration // each read's bound: redis.timeout
	min     int           // routing.claim_min_tokens
	peers   func() int    // how many other gateways are seen
}

// claimDepths lists the checkpoint depths, in block keys, of an n-key
// prompt deeper than from: 1, 2, 3, 4, 6, 8, 12, … (powers of two and
// one and a half times them) below n, then n.
func claimDepths(n, from int) []int {
	var ds []int
	add := func(d int) {
		if d > from && d < n {
			ds = append(ds, d)
		}
	}
	for d := 1; d < n; d *= 2 {
		add(d)
		if d > 1 {
			add(d + d/2)
		}
	}
	if n > from && n > 0 {
		ds = append(ds, n)
	}
	return ds
}

func (c *prefixClaims) key(k uint64) string {
	return c.prefix + strconv.FormatUint(k, 16)
}

// active reports whether a prompt with uncached tokens not yet held
// should read or write claims.
func (c *prefixClaims) active(uncached int) bool {
	return c != nil && uncached >= c.min && c.peers() > 0
}

// read returns, per replica, the deepest claimed depth of keys beyond
// from (in keys).
func (c *prefixClaims) read(ctx context.Context, keys []uint64, from int) (map[string]int, error) {
	ds := claimDepths(len(keys), from)
	if len(ds) == 0 {
		return nil, nil
	}
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	cmds := make([]*redis.StringCmd, len(ds))
	_, err := c.rdb.Pipelined(rctx, func(p redis.Pipeliner) error {
		for i, d := range ds {
			cmds[i] = p.Get(rctx, c.key(keys[d-1]))
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return nil, err
	}
	var got map[string]int
	for i, cmd := range cmds {
		if rep, err := cmd.Result(); err == nil && rep != "" {
			if got == nil {
				got = map[string]int{}
			}
			got[rep] = max(got[rep], ds[i])
		}
	}
	return got, nil
}

// write claims every checkpoint of keys for replica.
func (c *prefixClaims) write(ctx context.Context, replica string, keys []uint64) error {
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, d := range claimDepths(len(keys), 0) {
			p.Set(ctx, c.key(keys[d-1]), replica, c.ttl)
		}
		return nil
	})
	return err
}

// adoptClaims reads the claims on a prompt of n tokens whose keys matched
// matched (tokens per replica in names) when enough of it is uncached,
// and speculates each prefix another gateway claimed on its replica. It
// reports whether it speculated any (the caller then matches again).
func (g *Gateway) adoptClaims(ctx context.Context, keys []uint64, names []string, matched []int, n int) bool {
	best := 0
	for _, m := range matched {
		best = max(best, m)
	}
	if !g.claims.active(n-best) || len(keys) == 0 {
		return false
	}
	g.m.claims.WithLabelValues("read").Inc()
	got, err := g.claims.read(ctx, keys, best/g.index.blockSize)
	if err != nil {
		g.m.redisErrors.WithLabelValues("claims").Inc()
		g.log.DebugContext(ctx, "prefix claims degraded", "err", err)
		return false
	}
	adopted := false
	for rep, d := range got {
		for i, name := range names {
			if name == rep && matched[i] < d*g.index.blockSize {
				g.index.speculate(rep, keys[:d], g.claims.ttl)
				adopted = true
			}
		}
	}
	if adopted {
		g.m.claims.WithLabelValues("adopted").Inc()
	}
	return adopted
}

// claim writes, through the write pool, that replica was sent keys.
func (g *Gateway) claim(replica string, keys []uint64) {
	ok := g.writes.try(func(ctx context.Context) {
		if err := g.claims.write(ctx, replica, keys); err != nil {
			g.m.redisErrors.WithLabelValues("claims").Inc()
			return
		}
		g.m.claims.WithLabelValues("written").Inc()
	})
	if !ok {
		g.m.claims.WithLabelValues("dropped").Inc()
	}
}
