package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/warmpath/warmpath/gateway"
	"github.com/warmpath/warmpath/migrations"
)

// runMigrate applies the pending Redis keyspace migrations.
func runMigrate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	url := fs.String("redis-url", envOr("WARMPATH_REDIS_URL", ""), "Redis URL of one server (env WARMPATH_REDIS_URL; default redis://127.0.0.1:6379 when no addrs are given)")
	addrs := fs.String("redis-addrs", envOr("WARMPATH_REDIS_ADDRS", ""), "comma-separated sentinel (with --redis-master) or cluster node addresses (env WARMPATH_REDIS_ADDRS)")
	master := fs.String("redis-master", envOr("WARMPATH_REDIS_MASTER_NAME", envOr("WARMPATH_REDIS_MASTER", "")),
		"Sentinel master name (env WARMPATH_REDIS_MASTER_NAME, or its alias WARMPATH_REDIS_MASTER)")
	cluster := fs.Bool("redis-cluster", os.Getenv("WARMPATH_REDIS_CLUSTER") == "true", "Cluster mode with one address (env WARMPATH_REDIS_CLUSTER)")
	prefix := fs.String("key-prefix", envOr("WARMPATH_REDIS_KEY_PREFIX", "wp:"), "key prefix of the keyspace (env WARMPATH_REDIS_KEY_PREFIX)")
	dry := fs.Bool("dry-run", false, "list the pending migrations without applying them")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rc := gateway.RedisConfig{URL: *url, MasterName: *master, Cluster: *cluster}
	if *addrs != "" {
		rc.Addrs = strings.Split(*addrs, ",")
	}
	switch {
	case rc.URL != "" && len(rc.Addrs) > 0:
		return fmt.Errorf("migrate: give --redis-url or --redis-addrs, not both")
	case rc.URL == "" && len(rc.Addrs) == 0:
		rc.URL = "redis://127.0.0.1:6379"
	}
	rdb, err := rc.Client()
	if err != nil {
		return err
	}
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
