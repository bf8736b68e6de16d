package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// startCluster starts six cluster-enabled nodes and joins them with
// redis-cli --cluster create (three masters, one replica each), then waits
// until every node reports the cluster ok and every replica is in sync.
func startCluster(dir string) (tp *Topology, err error) {
	tp = &Topology{Kind: Cluster, procs: map[string]*Server{}}
	defer func() {
		if err != nil {
			tp.stop()
		}
	}()
	for i := range 6 {
		s, err := spawn(dir, "node"+strconv.Itoa(i), func(int) []string {
			return []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0"}
		})
		if err != nil {
			return nil, err
		}
		tp.procs[s.Addr] = s
		tp.Addrs = append(tp.Addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, tp.Addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "redis-cli", args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out.String())
	}
	return tp, wait(30*time.Second, "cluster did not settle", func(ctx context.Context) error {
		return clusterSettled(ctx, tp.Addrs)
	})
}

// clusterSettled reports nil when every node sees cluster_state:ok and
// every replica's link to its master is up.
func clusterSettled(ctx context.Context, addrs []string) error {
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, DialTimeout: 200 * time.Millisecond})
		info, err := c.ClusterInfo(ctx).Result()
		if err == nil && !strings.Contains(info, "cluster_state:ok") {
			err = fmt.Errorf("%s: cluster state not ok", a)
		}
		if err == nil {
			err = replicaInSync(ctx, c)
		}
		c.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// replicaInSync reports nil for a master, or for a replica whose link to
// its master is up.
func replicaInSync(ctx context.Context, c *redis.Client) error {
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if strings.Contains(info, "role:slave") && !strings.Contains(info, "master_link_status:up") {
		return errors.New(c.Options().Addr + ": replica not in sync")
	}
	return nil
}

// startSentinel starts a master, a replica of it and three sentinels
// monitoring it as MasterName (quorum two, down after one second), and
// waits until each sentinel knows the replica and the other two.
func startSentinel(dir string) (tp *Topology, err error) {
	tp = &Topology{Kind: Sentinel, MasterName: MasterName, procs: map[string]*Server{}}
	defer func() {
		if err != nil {
			tp.stop()
		}
	}()
	master, err := spawn(dir, "master", nil)
	if err != nil {
		return nil, err
	}
	tp.procs[master.Addr] = master
	replica, err := spawn(dir, "replica", func(int) []string {
		return []string{"--replicaof", "127.0.0.1", strconv.Itoa(master.port)}
	})
	if err != nil {
		return nil, err
	}
	tp.procs[replica.Addr] = replica
	conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2\n"+
		"sentinel down-after-milliseconds %[1]s 1000\n"+
		"sentinel failover-timeout %[1]s 5000\n"+
		"sentinel parallel-syncs %[1]s 1\n", MasterName, master.port)
	for i := range 3 {
		name := "sentinel" + strconv.Itoa(i)
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, name, "sentinel.conf"), []byte(conf), 0o644); err != nil {
			return nil, err
		}
		s, err := spawn(dir, name, func(int) []string { return []string{"--sentinel"} })
		if err != nil {
			return nil, err
		}
		tp.procs[s.Addr] = s
		tp.Addrs = append(tp.Addrs, s.Addr)
	}
	return tp, wait(30*time.Second, "sentinels did not settle", func(ctx context.Context) error {
		for _, a := range tp.Addrs {
			s := redis.NewSentinelClient(&redis.Options{Addr: a, DialTimeout: 200 * time.Millisecond})
			m, err := s.Master(ctx, MasterName).Result()
			s.Close()
			if err != nil {
				return err
			}
			if m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" {
				return fmt.Errorf("sentinel %s: %s replicas, %s other sentinels", a, m["num-slaves"], m["num-other-sentinels"])
			}
		}
		c := redis.NewClient(&redis.Options{Addr: replica.Addr})
		defer c.Close()
		return replicaInSync(ctx, c)
	})
}
