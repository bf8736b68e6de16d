package migrations

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

// counting returns n steps that each count their runs in <prefix>runs:<v>.
func counting(n int) []Step {
	var steps []Step
	for v := 1; v <= n; v++ {
		steps = append(steps, Step{Version: v, Name: "count " + strconv.Itoa(v),
			Up: func(ctx context.Context, rdb redis.UniversalClient, prefix string) error {
				return rdb.Incr(ctx, prefix+"runs:"+strconv.Itoa(v)).Err()
			}})
	}
	return steps
}

// TestConcurrentApply: gateways starting together apply each step once.
func TestConcurrentApply(t *testing.T) { redistest.Each(t, testConcurrentApply) }

func testConcurrentApply(t *testing.T, tp *redistest.Topology) {
	rdb, prefix := tp.Client(t)
	steps := counting(5)
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for range 8 {
		c := tp.NewClient() // one client per "gateway"
		defer c.Close()
		wg.Go(func() {
			done, err := Apply(t.Context(), c, prefix, steps)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			total += len(done)
			mu.Unlock()
		})
	}
	wg.Wait()
	if total != 5 {
		t.Errorf("steps applied %d times in all; want 5", total)
	}
	for v := 1; v <= 5; v++ {
		if n, _ := rdb.Get(t.Context(), prefix+"runs:"+strconv.Itoa(v)).Int(); n != 1 {
			t.Errorf("step %d ran %d times", v, n)
		}
	}
	if v, _ := rdb.Get(t.Context(), prefix+"schema:version").Int(); v != 5 {
		t.Errorf("schema:version = %d; want 5", v)
	}
	if n, _ := rdb.Exists(t.Context(), prefix+"schema:lock").Result(); n != 0 {
		t.Error("lock left behind")
	}
	done, err := Apply(t.Context(), rdb, prefix, steps)
	if err != nil || len(done) != 0 {
		t.Errorf("re-run applied %v, %v; want nothing", done, err)
	}
}

func TestFailedStepStopsAndResumes(t *testing.T) { redistest.Each(t, testFailedStepStopsAndResumes) }

func testFailedStepStopsAndResumes(t *testing.T, tp *redistest.Topology) {
	rdb, prefix := tp.Client(t)
	steps := counting(3)
	boom := errors.New("boom")
	broken := append([]Step(nil), steps...)
	broken[1].Up = func(context.Context, redis.UniversalClient, string) error { return boom }
	done, err := Apply(t.Context(), rdb, prefix, broken)
	if !errors.Is(err, boom) || len(done) != 1 {
		t.Fatalf("Apply = %v, %v; want step 1 done, then boom", done, err)
	}
	st, _ := Check(t.Context(), rdb, prefix, steps)
	if st.Version != 1 || !st.Behind() {
		t.Fatalf("state after failure = %+v", st)
	}
	done, err = Apply(t.Context(), rdb, prefix, steps)
	if err != nil || len(done) != 2 || done[0].Version != 2 {
		t.Fatalf("resume = %v, %v", done, err)
	}
}

func TestCheck(t *testing.T) { redistest.Each(t, testCheck) }

func testCheck(t *testing.T, tp *redistest.Topology) {
	rdb, prefix := tp.Client(t)
	st, err := Check(t.Context(), rdb, prefix, nil)
	if err != nil || st != (State{}) || st.Behind() {
		t.Fatalf("empty keyspace, no steps: %+v %v", st, err)
	}
	rdb.Set(t.Context(), prefix+"schema:version", 3, 0)
	if _, err := Check(t.Context(), rdb, prefix, counting(2)); !errors.Is(err, ErrKeyspaceNewer) {
		t.Errorf("newer keyspace: %v", err)
	}
	if _, err := Apply(t.Context(), rdb, prefix, counting(2)); !errors.Is(err, ErrKeyspaceNewer) {
		t.Errorf("Apply on a newer keyspace: %v", err)
	}
	if st, err := Check(t.Context(), rdb, prefix, counting(4)); err != nil || !st.Behind() {
		t.Errorf("older keyspace: %+v %v", st, err)
	}
	rdb.Set(t.Context(), prefix+"schema:version", "x", 0)
	if _, err := Check(t.Context(), rdb, prefix, nil); err == nil {
		t.Error("garbage version accepted")
	}
	if _, err := Check(t.Context(), rdb, prefix, []Step{{Version: 2, Name: "skip", Up: counting(1)[0].Up}}); err == nil {
		t.Error("steps not numbered from 1 accepted")
	}
	if err := validate(Steps()); err != nil {
		t.Errorf("Steps(): %v", err)
	}
}

// TestLockHeldElsewhere: while another process holds the lock, Apply waits
// and runs nothing.
func TestLockHeldElsewhere(t *testing.T) { redistest.Each(t, testLockHeldElsewhere) }

func testLockHeldElsewhere(t *testing.T, tp *redistest.Topology) {
	rdb, prefix := tp.Client(t)
	rdb.Set(t.Context(), prefix+"schema:lock", "someone-else", time.Minute)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := Apply(ctx, rdb, prefix, counting(1)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Apply under a foreign lock = %v", err)
	}
	if n, _ := rdb.Exists(t.Context(), prefix+"runs:1").Result(); n != 0 {
		t.Fatal("a step ran without the lock")
	}
	if v, _ := rdb.Get(t.Context(), prefix+"schema:lock").Result(); v != "someone-else" {
		t.Fatal("the foreign lock was released by a waiter")
	}
}

// TestStepsEveryMaster applies warmpath's own steps to version 1 session
// bindings spread over every master of a Cluster: each one is migrated,
// not only those of the node a SCAN happens to reach.
func TestStepsEveryMaster(t *testing.T) { redistest.Each(t, testStepsEveryMaster) }

func testStepsEveryMaster(t *testing.T, tp *redistest.Topology) {
	rdb, prefix := tp.Client(t)
	const n = 30
	v1 := "1|10.0.0.7:8000|fedcba9876543210|931|15000|61000|59000|abcdef0123456789|15400|12|1789095808123"
	for i := range n {
		if err := rdb.Set(t.Context(), prefix+"sess:k"+strconv.Itoa(i), v1, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Apply(t.Context(), rdb, prefix, Steps()); err != nil {
		t.Fatal(err)
	}
	left := 0
	for i := range n {
		if v := rdb.Get(t.Context(), prefix+"sess:k"+strconv.Itoa(i)).Val(); v == v1 {
			left++
		}
	}
	if left > 0 {
		t.Errorf("%d of %d version 1 bindings left after Apply(Steps())", left, n)
	}
}
