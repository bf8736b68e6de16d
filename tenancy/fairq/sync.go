package fairq

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// syncScript applies one gateway's pending counter updates to a model's
// hash and returns the whole hash. KEYS[1] is the hash; ARGV[1] its TTL in
// milliseconds; then one quadruple per counter: field, add, floor ("" for
// none) and seed, meaning value ← max(value + add, floor), and, if the hash
// had been lost (no "#" marker: a restarted or flushed server), also
// value ← max(value, seed), the gateway's own value. Values are written
// with 17 significant digits, so they round-trip exactly.
var syncScript = redis.NewScript(`
local key = KEYS[1]
local fresh = redis.call('HSETNX', key, '#', '1') == 1
for i = 2, #ARGV, 4 do
  local v = tonumber(redis.call('HGET', key, ARGV[i]) or '0') + tonumber(ARGV[i + 1])
  if ARGV[i + 2] ~= '' then
    local f = tonumber(ARGV[i + 2])
    if f > v then v = f end
  end
  if fresh then
    local s = tonumber(ARGV[i + 3])
    if s > v then v = s end
  end
  redis.call('HSET', key, ARGV[i], string.format('%.17g', v))
end
redis.call('PEXPIRE', key, ARGV[1])
return redis.call('HGETALL', key)
`)

// fieldPrefix starts every tenant's field in a counter hash, keeping them
// apart from the "#" marker.
const fieldPrefix = "t:"

// syncBatch is one model's part of an exchange.
type syncBatch struct {
	m    *model
	args []any
	cmd  *redis.Cmd
}

// sync exchanges counter updates with Redis: one pipelined script call per
// model, one round trip in all. On failure the updates stay pending and the
// counters keep their local values; the failure is logged once until an
// exchange succeeds again.
func (q *Queue) sync(ctx context.Context) error {
	q.syncMu.Lock()
	defer q.syncMu.Unlock()
	batches := q.snapshot()
	if len(batches) == 0 {
		return nil
	}
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, q.cfg.RedisTimeout)
	defer cancel()
	q.exchange(rctx, batches, false)
	var retry []*syncBatch
	for _, b := range batches {
		if redis.HasErrorPrefix(b.cmd.Err(), "NOSCRIPT") {
			retry = append(retry, b)
		}
	}
	if len(retry) > 0 {
		q.exchange(rctx, retry, true)
	}
	q.met.syncSeconds.Observe(time.Since(start).Seconds())
	var err error
	for _, b := range batches {
		if e := q.apply(b); e != nil && err == nil {
			err = e
		}
	}
	q.noteRedis(ctx, err)
	return err
}

// exchange sends the batches in one pipeline, by script SHA or, with eval,
// by script text (which also loads it). Errors land in each batch's cmd.
func (q *Queue) exchange(ctx context.Context, batches []*syncBatch, eval bool) {
	_, _ = q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, b := range batches {
			keys := []string{b.m.key}
			if eval {
				b.cmd = syncScript.Eval(ctx, p, keys, b.args...)
			} else {
				b.cmd = syncScript.EvalSha(ctx, p, keys, b.args...)
			}
		}
		return nil
	})
}

// snapshot moves every counter's pending updates to sent and builds one
// batch per model that has counters (a model without updates is still
// read, to learn other gateways' charges).
func (q *Queue) snapshot() []*syncBatch {
	var out []*syncBatch
	ttl := q.cfg.KeyTTL.Milliseconds()
	for _, m := range q.models.snapshot() {
		if b := q.snapshotModel(m, ttl); b != nil {
			out = append(out, b)
		}
	}
	return out
}

// snapshotModel is snapshot's part for one model, nil if it has no
// counters.
func (q *Queue) snapshotModel(m *model, ttl int64) *syncBatch {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.counters) == 0 {
		return nil
	}
	b := &syncBatch{m: m, args: []any{ttl}}
	for _, c := range m.counters {
		o := c.snapshot()
		if o.isIdentity() {
			continue
		}
		floor := ""
		if !math.IsInf(o.floor, -1) {
			floor = strconv.FormatFloat(o.floor, 'g', -1, 64)
		}
		b.args = append(b.args, fieldPrefix+c.tenant, strconv.FormatFloat(o.add, 'g', -1, 64), floor,
			strconv.FormatFloat(o.apply(c.base), 'g', -1, 64))
	}
	return b
}

// apply records one batch's reply in its model's counters.
func (q *Queue) apply(b *syncBatch) error {
	vals, err := b.cmd.StringSlice()
	remote := make(map[string]float64, len(vals)/2)
	for i := 0; err == nil && i+1 < len(vals); i += 2 {
		tenant, ok := strings.CutPrefix(vals[i], fieldPrefix)
		if !ok {
			continue // the marker
		}
		v, perr := strconv.ParseFloat(vals[i+1], 64)
		if perr != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			err = fmt.Errorf("fairq: counter %q of %s is %q", vals[i], b.m.key, vals[i+1])
			break
		}
		remote[tenant] = v
	}
	m := b.m
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.counters {
		if err != nil {
			c.unsent()
			continue
		}
		v, ok := remote[c.tenant]
		c.synced(v, ok)
	}
	if err != nil {
		return fmt.Errorf("fairq: sync %s: %w", m.key, err)
	}
	return nil
}

// noteRedis logs the first failure of a run of failed exchanges, and the
// recovery. The caller holds syncMu.
func (q *Queue) noteRedis(ctx context.Context, err error) {
	if err != nil {
		q.met.syncErrors.Inc()
		if !q.redisDown && ctx.Err() == nil {
			q.redisDown = true
			q.log.Warn("fairq: redis unavailable; virtual counters stay local until it recovers", "err", err)
		}
		return
	}
	if q.redisDown {
		q.redisDown = false
		q.log.Info("fairq: redis recovered; virtual counters are shared again")
	}
}
