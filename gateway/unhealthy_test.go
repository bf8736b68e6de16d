package gateway

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/testrun"
)

// Over HTTP on a simulated replica that goes down while requests wait in
// the queue and comes back: the request running there fails, but the
// waiting ones stay queued (they are not sent to the failing replica, nor
// routed once no replica is healthy) and are served once it is healthy
// again, while a request arriving meanwhile is refused at once and one
// whose client leaves meanwhile leaves the queue.
func TestQueueHoldsBacklogWhileFleetDown(t *testing.T) {
	clock := newGatedClock()
	sim := queueSim(t, clock, "")
	cfg := queueConfig(sim)
	cfg.Queue.Timeout = time.Minute
	// Passive failures reach the threshold only after a few requests
	// fail: before, each request sent to the dead replica failed and
	// freed its place for the next waiting one.
	cfg.Health.Failures = 4
	g, logs := startLoggedGateway(t, cfg)
	blocker := saturate(t, g, clock)

	const n = 4
	waiting := make([]<-chan chatResult, n)
	for i := range waiting {
		waiting[i] = asyncChat(t.Context(), g.URL, chatBody(fmt.Sprint("waiting ", i), 0, 4), nil)
		testrun.Eventually(t, 10*time.Second, func() bool { return queued(t, g, nil) == float64(i+1) }, fmt.Sprint(i+1, " queued"))
	}
	leaveCtx, leave := context.WithCancel(t.Context())
	leaver := asyncChat(leaveCtx, g.URL, chatBody("leaver", 0, 4), nil)
	testrun.Eventually(t, 10*time.Second, func() bool { return queued(t, g, nil) == n+1 }, "the leaver queued")
	rep := sim.Replicas()[0]
	if err := rep.SetDown(true); err != nil {
		t.Fatal(err)
	}
	if r := <-blocker; r.Status != http.StatusBadGateway {
		t.Errorf("request running on the replica that went down: %d %s; want 502", r.Status, r.Body)
	}
	testrun.Eventually(t, 10*time.Second, func() bool { return !g.fleet.Snapshot().Replicas[0].State().Healthy }, "the replica marked unhealthy")
	q := queued(t, g, nil)
	if q != n+1 {
		t.Errorf("%v requests queued once the replica is unhealthy; want all %d still waiting", q, n+1)
	}
	// A client that gives up meanwhile still leaves the queue at once.
	leave()
	if r := <-leaver; r.Status != -1 {
		t.Errorf("canceled request answered %d", r.Status)
	}
	testrun.Eventually(t, 10*time.Second, func() bool { return queued(t, g, nil) == q-1 }, "the leaver out of the queue")
	if r := chat(t, g.URL, chatBody("newcomer", 0, 4), nil); r.Status != http.StatusServiceUnavailable {
		t.Errorf("request arriving while no replica is healthy: %d %s; want 503", r.Status, r.Body)
	}
	if len(logs.matching("queue: no replica of the model is answering")) == 0 {
		t.Error("no log line says the queue holds its requests for want of a healthy replica")
	}

	if err := rep.SetDown(false); err != nil {
		t.Fatal(err)
	}
	clock.resume()
	for i, ch := range waiting {
		if r := <-ch; r.Status != http.StatusOK {
			t.Errorf("waiting request %d: %d %s; want 200 once the replica is back", i, r.Status, r.Body)
		}
	}
}
