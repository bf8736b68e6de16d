package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/migrations"
)

// runMigrate applies the pending Redis keyspace migrations.
func runMigrate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	url := fs.String("redis-url", envOr("WARMPATH_REDIS_URL", "redis://127.0.0.1:6379"), "Redis URL (env WARMPATH_REDIS_URL)")
	prefix := fs.String("key-prefix", envOr("WARMPATH_REDIS_KEY_PREFIX", "wp:"), "key prefix of the keyspace (env WARMPATH_REDIS_KEY_PREFIX)")
	dry := fs.Bool("dry-run", false, "list the pending migrations without applying them")
	if err := fs.Parse(args); err != nil {
		return err
	}
	opt, err := redis.ParseURL(*url)
	if err != nil {
		return fmt.Errorf("--redis-url: %w", err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	steps := migrations.Steps()
	if *dry {
		st, err := migrations.Check(ctx, rdb, *prefix, steps)
		if err != nil {
			return err
		}
		fmt.Printf("keyspace %q at version %d; newest known %d\n", *prefix, st.Version, st.Latest)
		for _, s := range steps[st.Version:] {
			fmt.Printf("pending: %d %s\n", s.Version, s.Name)
		}
		return nil
	}
	done, err := migrations.Apply(ctx, rdb, *prefix, steps)
	for _, s := range done {
		fmt.Printf("applied: %d %s\n", s.Version, s.Name)
	}
	if err != nil {
		return err
	}
	fmt.Printf("keyspace %q is at version %d\n", *prefix, len(steps))
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
