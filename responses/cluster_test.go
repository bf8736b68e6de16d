package responses

import (
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/redistest"
	"github.com/warmpath/warmpath/vllmsim"
)

// Every key a script or transaction touches together is one tenant's and
// must hash to one cluster slot, whatever the tenant's name: a key family
// without the tenant's hash tag fails each of them with CROSSSLOT on a
// Cluster.
func TestTenantKeysShareSlot(t *testing.T) {
	st := &store{prefix: "wp:"}
	tenants := []string{"", "acme", "a}b{c", "{acme}", strings.Repeat("x", 200), "ünïcode"}
	for _, tn := range tenants {
		keys := map[string]string{
			"resp": st.recKey(tn, "resp_1"), "item": st.itemKey(tn, "msg_1"), "conv": st.convKey(tn, "conv_1"),
			"convitems": st.convItemsKey(tn, "conv_1"), "convlock": st.lockKey(tn, "conv_1"), "ev": st.eventsKey(tn, "resp_1"),
			"chain ancestor": st.respPrefix(tn) + "resp_0", "conversation item": st.itemPrefix(tn) + "msg_2",
		}
		want := redistest.Slot(keys["resp"])
		for name, k := range keys {
			if got := redistest.Slot(k); got != want {
				t.Errorf("tenant %q: %s key %q is in slot %d; the record is in %d", tn, name, k, got, want)
			}
		}
		svc := &Service{st: st}
		tag, id, ok := svc.splitRecKey(keys["resp"])
		if !ok || st.prefix+"ev:"+tag+":"+id != keys["ev"] {
			t.Errorf("tenant %q: the sweeper derives events key %q from %q; want %q", tn, st.prefix+"ev:"+tag+":"+id, keys["resp"], keys["ev"])
		}
	}
}

// A cancel asked through gateway B reaches the run on gateway A, each with
// its own Redis client, over the cancel channel: on a Cluster the publish
// and the subscription may go through different nodes. A's lease is long,
// so its renewal (which would also notice the cancel) cannot stop the run
// in time: only the message can.
func TestBackgroundCancelAcrossGateways(t *testing.T) {
	redistest.Each(t, testBackgroundCancelAcrossGateways)
}

func testBackgroundCancelAcrossGateways(t *testing.T, tp *redistest.Topology) {
	_, prefix := tp.Client(t)
	f := startSim(t, vllmsim.Config{})
	g := newGate(newSimChat(f))
	t.Cleanup(func() { close(g.release) })
	aRedis := tp.NewClient()
	t.Cleanup(func() { aRedis.Close() })
	a := &env{rdb: aRedis, prefix: prefix}
	a.start(t, g, func(o *Options) { o.LeaseTTL = time.Minute })
	r := a.create(t, "", map[string]any{"input": "long job", "background": true})
	<-g.entered // A's worker runs it
	bRedis := tp.NewClient()
	t.Cleanup(func() { bRedis.Close() })
	b := &env{rdb: bRedis, prefix: prefix}
	b.start(t, newSimChat(f), func(o *Options) { o.BackgroundWorkers = 1 })
	if code, body := b.do(t, "POST", "/v1/responses/"+r.ID+"/cancel", "", nil); code != 200 {
		t.Fatalf("cancel through B: %d %s", code, body)
	}
	waitIdle(t, a.svc, 5*time.Second)
	if got := b.get(t, r.ID); got.Status != StatusCancelled {
		t.Fatalf("status = %q; want cancelled", got.Status)
	}
}

// Redis can lose the job stream's consumer group: a failover to a replica
// the XGROUP CREATE had not reached, or a restart without persistence.
// Workers then read NOGROUP; they must recreate the group, and jobs
// queued afterwards run.
func TestJobGroupRecreated(t *testing.T) { redistest.Each(t, testJobGroupRecreated) }

func testJobGroupRecreated(t *testing.T, tp *redistest.Topology) {
	e := newEnv(t, tp, vllmsim.Config{}, func(o *Options) { o.BackgroundWorkers = 1 })
	ctx := context.Background()
	if err := e.rdb.Del(ctx, e.svc.st.jobsKey()).Err(); err != nil {
		t.Fatal(err)
	}
	r := e.create(t, "", map[string]any{"input": "after the loss", "background": true})
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := e.get(t, r.ID)
		if got.Status == StatusCompleted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a job queued after the group was lost is %q after 10s; want completed", got.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	groups, err := e.rdb.XInfoGroups(ctx, e.svc.st.jobsKey()).Result()
	if err != nil || len(groups) != 1 || groups[0].Name != jobGroup {
		t.Fatalf("groups after recovery = %+v, %v; want %q", groups, err, jobGroup)
	}
}

// A Cluster failover of the master holding the job stream and the cancel
// channel: the workers' reads and the cancel subscription fail until a
// replica takes over the slots, then a background job runs again (the
// group came over with the replica, or is recreated) and its cancel
// reaches it over pub/sub (the lease is too long for renewal to notice).
func TestBackgroundAfterFailover(t *testing.T) {
	tp := redistest.StartTopology(t, redistest.Cluster)
	rdb := tp.NewClient()
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	prefix, dead := sameMaster(t, tp, "resp:jobs", "resp:cancel")
	g := newGate(newSimChat(startSim(t, vllmsim.Config{})))
	t.Cleanup(func() { close(g.release) })
	e := &env{rdb: rdb, prefix: prefix}
	e.start(t, g, func(o *Options) { o.LeaseTTL = time.Minute })
	for rdb.Exists(ctx, prefix+"resp:jobs").Val() == 0 { // Run has created the group
		time.Sleep(20 * time.Millisecond)
	}

	tp.Kill(t, dead)
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, err := tp.Master(ctx, prefix+"resp:jobs")
		if err == nil && m != dead {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no replica took over from %s: %v", dead, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var id string
	for id == "" {
		code, b := e.do(t, "POST", "/v1/responses", "", map[string]any{"model": vllmsim.DefaultModel, "input": "after", "background": true})
		switch {
		case code == 200:
			id = decodeID(t, b)
		case time.Now().After(deadline):
			t.Fatalf("create after the failover: %d %s", code, b)
		default:
			time.Sleep(100 * time.Millisecond)
		}
	}
	select {
	case <-g.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("no worker ran the job queued after the failover")
	}
	if code, b := e.do(t, "POST", "/v1/responses/"+id+"/cancel", "", nil); code != 200 {
		t.Fatalf("cancel: %d %s", code, b)
	}
	waitIdle(t, e.svc, 5*time.Second)
	waitStatus(t, e, id, StatusCancelled, time.Second)
}

// sameMaster returns a key prefix under which every name of names (keys
// or channels) is served by one master, and that master.
func sameMaster(t *testing.T, tp *redistest.Topology, names ...string) (prefix, master string) {
	t.Helper()
	for i := range 200 {
		prefix = "fo" + strconv.Itoa(i) + ":"
		masters := map[string]bool{}
		for _, n := range names {
			m, err := tp.Master(context.Background(), prefix+n)
			if err != nil {
				t.Fatal(err)
			}
			masters[m], master = true, m
		}
		if len(masters) == 1 {
			return prefix, master
		}
	}
	t.Fatalf("no prefix puts %v on one master", names)
	return "", ""
}

// waitIdle waits until the Service runs no background response, failing
// after d.
func waitIdle(t *testing.T, svc *Service, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		svc.mu.Lock()
		n := len(svc.running)
		svc.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d background runs still going after %v", n, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A gateway starting while Redis is unreachable (an outage, a failover)
// keeps its Responses workers: Run does not fail, and once Redis is back
// a background job runs.
func TestRunStartsWithRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond, DialerRetries: 1})
	t.Cleanup(func() { rdb.Close() })
	failed := make(dialFailures, 1)
	rdb.AddHook(failed)
	srv.Stop()
	e := &env{rdb: rdb}
	e.start(t, newSimChat(startSim(t, vllmsim.Config{})))
	select { // Run has met the outage: only it uses Redis before the POST below
	case <-failed:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not try Redis within 10s")
	}
	srv.Restart(t)
	deadline := time.Now().Add(10 * time.Second)
	var id string
	for id == "" {
		code, b := e.do(t, "POST", "/v1/responses", "", map[string]any{"model": vllmsim.DefaultModel, "input": "after", "background": true})
		switch {
		case code == 200:
			id = decodeID(t, b)
		case time.Now().After(deadline):
			t.Fatalf("create after the outage: %d %s", code, b)
		default:
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitStatus(t, e, id, StatusCompleted, 10*time.Second)
}

// dialFailures is a go-redis hook that signals, without blocking, each
// failed dial of its client.
type dialFailures chan struct{}

func (f dialFailures) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			select {
			case f <- struct{}{}:
			default:
			}
		}
		return c, err
	}
}

func (dialFailures) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (dialFailures) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// waitStatus polls a response until it has status, failing after d.
func waitStatus(t *testing.T, e *env, id, status string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		code, b := e.do(t, "GET", "/v1/responses/"+id, "", nil)
		if code == 200 && strings.Contains(string(b), `"status":"`+status+`"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("response %s after %v: %d %s; want status %s", id, d, code, b, status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func decodeID(t *testing.T, b []byte) string {
	t.Helper()
	var r Response
	if err := json.Unmarshal(b, &r); err != nil || r.ID == "" {
		t.Fatalf("decode response: %v: %s", err, b)
	}
	return r.ID
}
