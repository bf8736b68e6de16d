package responses

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/chatapi"
	"github.com/warmpath/warmpath/internal/periodic"
)

// sweepLoop runs the sweeper every LeaseTTL/2.
func (s *Service) sweepLoop(ctx context.Context) error {
	periodic.Every(ctx, s.opts.LeaseTTL/2, func() {
		if err := s.sweep(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("responses: sweep", "err", err)
		}
	})
	return ctx.Err()
}

// failLapsedScript fails a record whose lease has lapsed and appends the
// response.failed event and the end marker. KEYS = {record, events};
// ARGV = {now ms, error json, event json, event stream ID}.
var failLapsedScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'status', 'lease')
if v[1] ~= 'in_progress' or tonumber(v[2] or '0') > tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'status', 'failed', 'err', ARGV[2])
redis.call('HDEL', KEYS[1], 'body', 'lease')
pcall(redis.call, 'XADD', KEYS[2], ARGV[4], 't', 'response.failed', 'e', ARGV[3])
redis.call('XADD', KEYS[2], '*', 'end', '1')
return 1
`)

// sweep fails runs whose lease lapsed (their gateway died) and takes over
// jobs a vanished worker had read but not started.
func (s *Service) sweep(ctx context.Context) error {
	now := s.opts.Now()
	lapsed, err := s.opts.Redis.ZRangeByScore(ctx, s.st.leasesKey(), &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(now.UnixMilli(), 10), Count: 100}).Result()
	if err != nil {
		return fmt.Errorf("responses: list leases: %w", err)
	}
	for _, rec := range lapsed {
		if err := s.failLapsed(ctx, rec, now); err != nil {
			s.log.Warn("responses: fail lapsed run", "record", rec, "err", err)
		}
	}
	claimed, _, err := s.opts.Redis.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: s.st.jobsKey(), Group: jobGroup,
		Consumer: s.worker + "-sweeper", MinIdle: 2 * s.opts.LeaseTTL, Start: "0", Count: 10}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("responses: reclaim jobs: %w", err)
	}
	for _, m := range claimed {
		s.runJob(ctx, m)
	}
	return nil
}

func (s *Service) failLapsed(ctx context.Context, rec string, now time.Time) error {
	tenantTag, id, ok := s.splitRecKey(rec)
	if !ok {
		return s.opts.Redis.ZRem(ctx, s.st.leasesKey(), rec).Err()
	}
	evk := s.st.prefix + "ev:" + tenantTag + ":" + id
	v, err := s.opts.Redis.HGet(ctx, rec, fObj).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	resp := new(Response)
	if v != "" {
		_ = json.Unmarshal([]byte(v), resp)
	}
	last, err := s.opts.Redis.XRevRangeN(ctx, evk, "+", "-", 1).Result()
	if err != nil {
		return err
	}
	seq := 0
	if len(last) > 0 {
		if _, n, ok := strings.Cut(last[0].ID, "-"); ok && strings.HasPrefix(last[0].ID, "0-") {
			seq, _ = strconv.Atoi(n) // the next sequence number: IDs are 0-(seq+1)
		}
	}
	failure := &ResponseError{Code: "server_error", Message: "the gateway running this background response stopped before it finished (its lease lapsed)"}
	resp.Status, resp.Error, resp.Usage = StatusFailed, failure, orUsage(resp.Usage)
	errJSON, _ := chatapi.Marshal(failure)
	ev, _ := chatapi.Marshal(&event{Type: "response.failed", SequenceNumber: seq, Response: resp})
	n, err := failLapsedScript.Run(ctx, s.opts.Redis, []string{rec, evk}, now.UnixMilli(), errJSON, ev, seqID(seq)).Int()
	if err != nil {
		return err
	}
	if n == 1 {
		s.metrics.swept.Inc()
	}
	// Gone, lapsed and failed, or renewed since: a renewed one re-adds
	// itself on its next renewal.
	return s.opts.Redis.ZRem(ctx, s.st.leasesKey(), rec).Err()
}

func orUsage(u *Usage) *Usage {
	if u == nil {
		return &Usage{}
	}
	return u
}

// splitRecKey parses <prefix>resp:{tag}:<id>.
func (s *Service) splitRecKey(rec string) (tenantTag, id string, ok bool) {
	rest, ok := strings.CutPrefix(rec, s.st.prefix+"resp:")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndex(rest, "}:")
	if i < 0 {
		return "", "", false
	}
	return rest[:i+1], rest[i+2:], true
}
