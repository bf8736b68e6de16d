// Package migrations owns the version of warmpath's Redis keyspace and the
// steps that move it from one version to the next.
//
// A Step is a Go function over the keyspace, numbered by Version (1, 2, …,
// never renumbered) and idempotent: it may run again after a crash between
// its work and the version write. Apply runs the pending steps in order
// under a lock, so gateways starting together apply each step once; Check
// is for `warmpath serve`, which refuses a keyspace newer than it knows and
// warns about an older one, and leaves applying to `warmpath migrate` (or
// its own start-up call to Apply).
//
// # Redis keys
//
// With the key prefix P: P schema:version holds the applied version (absent
// means 0); P schema:lock is the lock (a random token with a 30s TTL,
// refreshed while steps run). Each Step's doc names the prefixes it
// touches.
//
// # Goroutines
//
// Apply refreshes its lock from one goroutine that it starts and joins
// before it returns; nothing outlives a call.
package migrations

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/session"
)

// Step is one keyspace migration.
type Step struct {
	// Version is the keyspace version after the step; strictly increasing
	// from 1, never renumbered.
	Version int
	// Name says what the step does, for logs and --dry-run.
	Name string
	// Up migrates the keys under prefix. It must be idempotent.
	Up func(ctx context.Context, rdb redis.UniversalClient, prefix string) error
}

// Steps returns warmpath's migrations, oldest first.
//
//  1. session bindings (P sess:*) from the pipe-separated version 1 record
//     to the versioned JSON record (session.MigrateBindings); TTLs kept.
func Steps() []Step {
	return []Step{
		{Version: 1, Name: "session bindings as versioned JSON records", Up: func(ctx context.Context, rdb redis.UniversalClient, prefix string) error {
			_, err := session.MigrateBindings(ctx, rdb, prefix)
			return err
		}},
	}
}

// ErrKeyspaceNewer is Check's and Apply's error when the keyspace was
// migrated by a newer warmpath than this one.
var ErrKeyspaceNewer = errors.New("migrations: the keyspace is newer than this warmpath knows")

// lockTTL is the lock's lifetime; a crashed holder's lock frees after it.
const lockTTL = 30 * time.Second

// State is the keyspace version and the newest version the steps know.
type State struct {
	Version, Latest int
}

// Behind reports whether steps are pending.
func (s State) Behind() bool { return s.Version < s.Latest }

func versionKey(prefix string) string { return prefix + "schema:version" }
func lockKey(prefix string) string    { return prefix + "schema:lock" }

// validate checks that steps are numbered 1, 2, … with names and functions.
func validate(steps []Step) error {
	for i, s := range steps {
		if s.Version != i+1 || s.Name == "" || s.Up == nil {
			return fmt.Errorf("migrations: step %d (%q): versions must run 1, 2, … and every step needs a name and Up", i, s.Name)
		}
	}
	return nil
}

func latest(steps []Step) int {
	if len(steps) == 0 {
		return 0
	}
	return steps[len(steps)-1].Version
}

// Check reads the keyspace version. It returns ErrKeyspaceNewer (with the
// state) when the keyspace is ahead of steps; State.Behind tells the caller
// to warn.
func Check(ctx context.Context, rdb redis.UniversalClient, prefix string, steps []Step) (State, error) {
	if err := validate(steps); err != nil {
		return State{}, err
	}
	v, err := readVersion(ctx, rdb, prefix)
	if err != nil {
		return State{}, err
	}
	st := State{Version: v, Latest: latest(steps)}
	if st.Version > st.Latest {
		return st, fmt.Errorf("%w: keyspace version %d, newest known %d", ErrKeyspaceNewer, st.Version, st.Latest)
	}
	return st, nil
}

func readVersion(ctx context.Context, rdb redis.UniversalClient, prefix string) (int, error) {
	s, err := rdb.Get(ctx, versionKey(prefix)).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("migrations: read version: %w", err)
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("migrations: %s holds %q, not a version", versionKey(prefix), s)
	}
	return v, nil
}

// Pending returns the steps Apply would run now.
func Pending(ctx context.Context, rdb redis.UniversalClient, prefix string, steps []Step) ([]Step, error) {
	st, err := Check(ctx, rdb, prefix, steps)
	if err != nil {
		return nil, err
	}
	return steps[st.Version:], nil
}

// Apply runs the pending steps in order under the keyspace lock, recording
// the version after each, and returns the steps it ran. Concurrent calls
// (several gateways starting) wait for the lock, then find nothing left to
// do. A failed step stops the run; the version stays at the last step that
// succeeded.
func Apply(ctx context.Context, rdb redis.UniversalClient, prefix string, steps []Step) ([]Step, error) {
	if err := validate(steps); err != nil {
		return nil, err
	}
	l, err := acquire(ctx, rdb, lockKey(prefix))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { l.hold(ctx, cancel) })
	defer func() {
		cancel(nil)
		wg.Wait()
		l.release()
	}()
	pending, err := Pending(ctx, rdb, prefix, steps)
	if err != nil {
		return nil, err
	}
	var done []Step
	for _, s := range pending {
		if err := s.Up(ctx, rdb, prefix); err != nil {
			return done, fmt.Errorf("migrations: step %d (%s): %w", s.Version, s.Name, errors.Join(err, context.Cause(ctx)))
		}
		if err := l.setVersion(ctx, versionKey(prefix), s.Version); err != nil {
			return done, err
		}
		done = append(done, s)
	}
	return done, nil
}

// lock is a held keyspace lock.
type lock struct {
	rdb   redis.UniversalClient
	key   string
	token string
}

var (
	// refresh extends the lock only while it is still ours.
	refresh = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("PEXPIRE", KEYS[1], ARGV[2]) end return 0`)
	// unlock deletes the lock only while it is still ours.
	unlock = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)
)

// acquire takes the lock, waiting (polling every 100ms) while another
// process holds it, until ctx ends.
func acquire(ctx context.Context, rdb redis.UniversalClient, key string) (*lock, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	l := &lock{rdb: rdb, key: key, token: hex.EncodeToString(b[:])}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		ok, err := rdb.SetNX(ctx, key, l.token, lockTTL).Result()
		if err != nil {
			return nil, fmt.Errorf("migrations: take lock %s: %w", key, err)
		}
		if ok {
			return l, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("migrations: wait for lock %s: %w", key, ctx.Err())
		case <-t.C:
		}
	}
}

// hold refreshes the lock every lockTTL/3 until ctx ends, and cancels the
// run if the lock is lost.
func (l *lock) hold(ctx context.Context, cancel context.CancelCauseFunc) {
	t := time.NewTicker(lockTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n, err := refresh.Run(ctx, l.rdb, []string{l.key}, l.token, lockTTL.Milliseconds()).Int()
			if err == nil && n == 0 {
				cancel(errors.New("migrations: lost the lock"))
				return
			}
		}
	}
}

// setVersion records v if the lock is still ours. The check and the write
// are two commands, not one script, because in a Cluster the lock and the
// version hash to different slots; the lock cannot expire in between
// (it is refreshed every lockTTL/3 and the gap is one round trip).
func (l *lock) setVersion(ctx context.Context, key string, v int) error {
	owner, err := l.rdb.Get(ctx, l.key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("migrations: check lock: %w", err)
	}
	if owner != l.token {
		return fmt.Errorf("migrations: lost the lock before recording version %d", v)
	}
	if err := l.rdb.Set(ctx, key, v, 0).Err(); err != nil {
		return fmt.Errorf("migrations: record version %d: %w", v, err)
	}
	return nil
}

func (l *lock) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = unlock.Run(ctx, l.rdb, []string{l.key}, l.token).Err()
}
