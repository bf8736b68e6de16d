package redistest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// Each topology serves reads and writes through the gateway's kind of
// client, and a prefix's keys on every master are gone after its test.
func TestTopologies(t *testing.T) {
	Each(t, func(t *testing.T, tp *Topology) {
		ctx := context.Background()
		var prefix string
		t.Run("write", func(t *testing.T) {
			c, p := tp.Client(t)
			prefix = p
			for i := range 50 {
				if err := c.Set(ctx, p+strconv.Itoa(i), i, time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
			}
			n := 0
			if err := ScanAll(ctx, c, p+"*", func(string) error { n++; return nil }); err != nil {
				t.Fatal(err)
			}
			if n < 50 {
				t.Errorf("ScanAll found %d keys; want 50", n)
			}
		})
		c := tp.NewClient()
		defer c.Close()
		n := 0
		if err := ScanAll(ctx, c, prefix+"*", func(string) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%d keys of the ended test left; want 0", n)
		}
	})
}

// Slot agrees with the cluster's own CLUSTER KEYSLOT.
func TestSlot(t *testing.T) {
	tp := Shared(t, Cluster)
	c := tp.NewClient()
	defer c.Close()
	for _, k := range []string{"a", "foo", "{user1000}.following", "x{}y", "{}{a}", "resp:{acme}:r1", "123456789"} {
		want, err := c.ClusterKeySlot(context.Background(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := Slot(k); got != int(want) {
			t.Errorf("Slot(%q) = %d; want %d", k, got, want)
		}
	}
}

// A private cluster and a private sentinel topology each promote a replica
// when the master holding a key is killed, and Master follows.
func TestKillMasterFailsOver(t *testing.T) {
	for _, k := range []Kind{Cluster, Sentinel} {
		t.Run(string(k), func(t *testing.T) {
			tp := StartTopology(t, k)
			ctx := context.Background()
			c := tp.NewClient()
			defer c.Close()
			if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
				t.Fatal(err)
			}
			before, err := tp.Master(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			// WAIT, on the master holding k (a cluster client would send a
			// keyless command to any node): its replica holds the write
			// before the master dies.
			var holder interface {
				Do(context.Context, ...any) *redis.Cmd
			} = c
			if cc, ok := c.(*redis.ClusterClient); ok {
				if holder, err = cc.MasterForKey(ctx, "k"); err != nil {
					t.Fatal(err)
				}
			}
			if n, err := holder.Do(ctx, "WAIT", 1, 2000).Int(); err != nil || n < 1 {
				t.Fatalf("WAIT: %d replicas hold the write, %v; want 1", n, err)
			}
			tp.Kill(t, before)
			err = wait(30*time.Second, "no new master", func(ctx context.Context) error {
				m, err := tp.Master(ctx, "k")
				if err == nil && m == before {
					return errFailover
				}
				if err == nil {
					if err = c.Get(ctx, "k").Err(); err != nil {
						err = fmt.Errorf("master %s: GET: %w", m, err)
					}
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
				t.Errorf("after failover GET k = %q, %v; want v", v, err)
			}
		})
	}
}

var errFailover = errorString("master unchanged")

type errorString string

func (e errorString) Error() string { return string(e) }
