package gateway

import (
	"context"
	"errors"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"
)

// Run serves until ctx ends, with every goroutine the gateway needs: the
// HTTP server(s), tenancy's loops, the Redis breaker's probe, the
// Responses API's workers, the fleet's health checks and scrapes, the
// miss attribution's worker and the KV-event subscribers. When ctx ends (SIGTERM), it drains (see drain)
// before stopping the rest, so routing stays informed while requests
// finish. It returns nil after a clean shutdown, or the first component's
// error.
func (g *Gateway) Run(ctx context.Context) error {
	defer g.close()
	// The components outlive ctx until the servers have drained.
	cctx, stopComponents := context.WithCancel(context.WithoutCancel(ctx))
	defer stopComponents()
	eg, ectx := errgroup.WithContext(cctx)
	if err := g.tenants.start(ectx, eg, g.store.rdb, g.cfg.Redis.KeyPrefix, g.log); err != nil {
		return err
	}
	g.store.run(ectx, eg)
	g.fronts.run(ectx, eg)
	eg.Go(func() error { return g.router.Run(ectx) })
	g.obs.run(ectx, eg)
	eg.Go(func() error { return g.miss.Run(ectx) })
	eg.Go(func() error { return g.fleet.Run(ectx) })
	g.adm.run(ectx, eg)
	eg.Go(func() error { return g.runKVEvents(ectx) })
	g.edge.run(ctx, ectx, eg, stopComponents)
	return eg.Wait()
}

// drain shuts the servers down gracefully: /readyz answers 503 at once
// while the listener keeps serving for server.pre_stop (load balancers
// take the gateway out), then the listener closes and in-flight requests
// have server.drain_timeout to finish; streams still open then are ended
// with an error event (proxy.NewSSEFilter) and the rest closed. ctx ending (a
// failed component) cuts every wait short.
func (e *edge) drain(ctx context.Context, servers []*http.Server) {
	sc := e.sc
	e.draining.Store(true)
	e.log.Info("draining: readiness off", "pre_stop", sc.PreStop, "drain_timeout", sc.DrainTimeout)
	if sc.PreStop > 0 {
		t := time.NewTimer(sc.PreStop)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	dctx, cancel := context.WithTimeout(ctx, sc.DrainTimeout)
	defer cancel()
	err := shutdownAll(dctx, servers)
	if err == nil {
		e.log.Info("drained")
		return
	}
	e.cutStreams()
	// Give the cut streams a moment to send their error event and [DONE].
	fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer fcancel()
	if err := shutdownAll(fctx, servers); err != nil {
		for _, s := range servers {
			s.Close()
		}
	}
	e.log.Warn("drain timeout passed; open streams were ended with an error event", "err", err)
}

func shutdownAll(ctx context.Context, servers []*http.Server) error {
	var errs []error
	for _, s := range servers {
		errs = append(errs, s.Shutdown(ctx))
	}
	return errors.Join(errs...)
}
