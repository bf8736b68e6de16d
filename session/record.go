package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/scoring"
)

// recordVersion is the version of the binding record written to Redis.
// Version 1 was a pipe-separated string ("1|replica|tip|…"); version 2 is
// this JSON object. decode reads both, and MigrateBindings rewrites version
// 1 records in place.
const recordVersion = 2

// record is a binding as stored in Redis. Field names are short: one
// record is written per session, and rewritten often.
type record struct {
	V            int    `json:"v"`
	Replica      string `json:"r"`
	TipKey       string `json:"tk,omitempty"` // hex, so no JSON number loses bits
	TipDepth     int    `json:"td,omitempty"`
	PromptTokens int    `json:"pt,omitempty"`
	PromptBytes  int    `json:"pb,omitempty"`
	TextLen      int    `json:"tl,omitempty"`
	TextHash     string `json:"th,omitempty"` // hex
	CachedTokens int    `json:"ct,omitempty"`
	Generated    int    `json:"gt,omitempty"`
	Turns        int    `json:"n,omitempty"`
	UpdatedMs    int64  `json:"u"`
}

func (b Binding) encode() string {
	r := record{
		V: recordVersion, Replica: b.Replica, TipDepth: b.TipDepth,
		PromptTokens: b.PromptTokens, PromptBytes: b.PromptBytes, TextLen: b.TextLen,
		CachedTokens: b.CachedTokens, Generated: b.GeneratedTokens, Turns: b.Turns, UpdatedMs: b.Updated.UnixMilli(),
	}
	if b.TipKey != 0 {
		r.TipKey = strconv.FormatUint(b.TipKey, 16)
	}
	if b.TextHash != 0 {
		r.TextHash = strconv.FormatUint(b.TextHash, 16)
	}
	out, _ := json.Marshal(r) // a struct of strings and ints cannot fail
	return string(out)
}

// decode reads a stored binding of any version.
func decode(s string) (Binding, error) {
	if strings.HasPrefix(s, "1|") {
		return decodeV1(s)
	}
	var r record
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return Binding{}, fmt.Errorf("session: malformed binding: %w", err)
	}
	if r.V != recordVersion || r.Replica == "" {
		return Binding{}, fmt.Errorf("session: binding version %d (replica %q): want %d", r.V, r.Replica, recordVersion)
	}
	b := Binding{Binding: scoring.Binding{
		Replica: r.Replica, TipDepth: r.TipDepth, PromptTokens: r.PromptTokens, PromptBytes: r.PromptBytes,
		CachedTokens: r.CachedTokens, GeneratedTokens: r.Generated, Turns: r.Turns, Updated: time.UnixMilli(r.UpdatedMs),
	}, TextLen: r.TextLen}
	var err error
	if b.TipKey, err = parseHex(r.TipKey); err != nil {
		return Binding{}, fmt.Errorf("session: binding tip key: %w", err)
	}
	if b.TextHash, err = parseHex(r.TextHash); err != nil {
		return Binding{}, fmt.Errorf("session: binding text hash: %w", err)
	}
	return b, nil
}

func parseHex(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	return strconv.ParseUint(s, 16, 64)
}

// decodeV1 reads the version 1 record: eleven pipe-separated fields,
// replica|tip key (hex)|tip depth|prompt tokens|prompt bytes|text length|
// text hash (hex)|cached tokens|turns|updated (Unix ms) after the "1".
func decodeV1(s string) (Binding, error) {
	f := strings.Split(s, "|")
	if len(f) != 11 || f[0] != "1" {
		return Binding{}, fmt.Errorf("session: malformed version 1 binding %q", s)
	}
	var b Binding
	var err error
	b.Replica = f[1]
	if b.TipKey, err = strconv.ParseUint(f[2], 16, 64); err != nil {
		return Binding{}, fmt.Errorf("session: binding tip key: %w", err)
	}
	ints := map[int]*int{3: &b.TipDepth, 4: &b.PromptTokens, 5: &b.PromptBytes, 6: &b.TextLen, 8: &b.CachedTokens, 9: &b.Turns}
	for i, p := range ints {
		if *p, err = strconv.Atoi(f[i]); err != nil {
			return Binding{}, fmt.Errorf("session: binding field %d: %w", i, err)
		}
	}
	if b.TextHash, err = strconv.ParseUint(f[7], 16, 64); err != nil {
		return Binding{}, fmt.Errorf("session: binding text hash: %w", err)
	}
	ms, err := strconv.ParseInt(f[10], 10, 64)
	if err != nil {
		return Binding{}, fmt.Errorf("session: binding time: %w", err)
	}
	b.Updated = time.UnixMilli(ms)
	return b, nil
}

// migrateScript rewrites one key from version 1 to version 2 unless it
// changed since it was read: KEYS[1] the key, ARGV[1] the version 1 value
// read, ARGV[2] the version 2 value. The key's TTL is kept.
var migrateScript = redis.NewScript(`
if redis.call("GET", KEYS[1]) ~= ARGV[1] then return 0 end
local ttl = redis.call("PTTL", KEYS[1])
if ttl > 0 then
  redis.call("SET", KEYS[1], ARGV[2], "PX", ttl)
else
  redis.call("SET", KEYS[1], ARGV[2])
end
return 1`)

// MigrateBindings rewrites every version 1 binding under prefix+"sess:"
// (on every master of a Cluster) as a version 2 record, keeping its TTL; records already at version 2
// are left alone, so it is idempotent and safe to re-run after a crash.
// A record a gateway rewrote meanwhile is skipped (it is version 2 by
// then). It returns how many records it rewrote. Unreadable records are
// counted in the error and left in place.
func MigrateBindings(ctx context.Context, rdb redis.UniversalClient, prefix string) (int, error) {
	var migrated int
	var bad []error
	err := scanKeys(ctx, rdb, prefix+"sess:*", func(key string) error {
		v, err := rdb.Get(ctx, key).Result()
		if errors.Is(err, redis.Nil) || (err == nil && !strings.HasPrefix(v, "1|")) {
			return nil // expired meanwhile, or already current
		}
		if err != nil {
			return fmt.Errorf("session: migrate %s: %w", key, err)
		}
		b, err := decodeV1(v)
		if err != nil {
			bad = append(bad, fmt.Errorf("%s: %w", key, err))
			return nil
		}
		n, err := migrateScript.Run(ctx, rdb, []string{key}, v, b.encode()).Int()
		if err != nil {
			return fmt.Errorf("session: migrate %s: %w", key, err)
		}
		migrated += n
		return nil
	})
	if err != nil {
		return migrated, err
	}
	if len(bad) > 0 {
		return migrated, fmt.Errorf("session: migrate: %d unreadable bindings left in place: %w", len(bad), errors.Join(bad...))
	}
	return migrated, nil
}

// scanKeys calls fn for every key matching pattern: on each master of a
// Cluster (a SCAN through a ClusterClient reaches one node only), on the
// one server otherwise. A key may be reported more than once (SCAN's
// guarantee). The masters are scanned at once, but fn is called for one
// key at a time.
func scanKeys(ctx context.Context, rdb redis.UniversalClient, pattern string, fn func(key string) error) error {
	var mu sync.Mutex
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			err := fn(iter.Val())
			mu.Unlock()
			if err != nil {
				return err
			}
		}
		if err := iter.Err(); err != nil {
			return fmt.Errorf("session: scan %s: %w", pattern, err)
		}
		return nil
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	}
	return scan(ctx, rdb)
}
