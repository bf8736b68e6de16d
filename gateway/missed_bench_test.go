package gateway

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/gateway/routing"
	"github.com/warmpath/warmpath/vllmsim"
)

// BenchmarkMissedHook times the miss attribution's hook on the response
// path (Gateway.missed, at the end of accounting) for a turn of a
// conversation with a 100 KB prompt: what the request's goroutine pays
// before it returns. The attribution's own work, when the tracker does it
// on a worker, is waited for outside the timer (the worker idle before
// each turn, as when it keeps up), so that it is not counted and the queue
// never fills.
func BenchmarkMissedHook(b *testing.B) {
	sim := startSim(b, vllmsim.Config{Replicas: 1})
	gw := startGateway(b, fleetConfig(sim), nil)
	rep := gw.fleet.Snapshot().Replicas[0]
	body := fmt.Sprintf(`{"model":%q,"max_tokens":8,"messages":[{"role":"system","content":%q},{"role":"user","content":"hello"},{"role":"assistant","content":"hi"},{"role":"user","content":"question: %s"}]}`,
		vllmsim.DefaultModel, words("handbook", 8000), words("q", 20))
	r, err := request.Parse(request.Chat, http.Header{}, []byte(body), nil)
	if err != nil {
		b.Fatal(err)
	}
	x := &exchange{ctx: context.Background(), req: &turn{R: r}, route: &routing.Route{}, replica: rep, predicted: 20000}
	u := request.Usage{PromptTokens: 25000, CachedTokens: 24000}
	// flush is the tracker's when it has a worker (since the attribution
	// moved off the response path), else nothing to wait for.
	flush := func() {}
	if f, ok := any(gw.miss).(interface{ flush(context.Context) error }); ok {
		flush = func() { _ = f.flush(b.Context()) }
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		gw.missed(x, u)
		b.StopTimer()
		flush()
		b.StartTimer()
	}
}
