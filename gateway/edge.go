package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
)

// edge is the gateway's HTTP edge: the API listener and server, the
// optional separate /metrics listener and server, and the drain (readiness
// off, then the servers' shutdown, then open streams cut).
type edge struct {
	sc         ServerConfig
	log        *slog.Logger
	ln         net.Listener
	srv        *http.Server
	metricsLn  net.Listener // nil: /metrics is served on ln
	metricsSrv *http.Server
	draining   atomic.Bool // SIGTERM arrived: /readyz answers 503
	// drainCtx ends when the drain timeout passes, cutting open streams
	// (the forwarding stage's attempts watch it).
	drainCtx   context.Context
	cutStreams context.CancelFunc
	started    time.Time
}

// newEdge returns an edge that has bound nothing yet.
func newEdge(sc ServerConfig, log *slog.Logger) *edge {
	e := &edge{sc: sc, log: log, started: time.Now()}
	e.drainCtx, e.cutStreams = context.WithCancel(context.Background())
	return e
}

// listen binds the API listener at addr (limited per client address,
// counting refusals in rejected) and, when metricsAddr is set, the
// /metrics listener serving reg.
func (e *edge) listen(addr, metricsAddr string, rejected prometheus.Counter, reg *prometheus.Registry) error {
	var err error
	if e.ln, err = net.Listen("tcp", addr); err != nil {
		return fmt.Errorf("config: listen: %w", err)
	}
	e.ln = limitClients(e.ln, e.sc.MaxConnsPerClient, rejected)
	if metricsAddr != "" {
		if e.metricsLn, err = net.Listen("tcp", metricsAddr); err != nil {
			return fmt.Errorf("config: metrics_listen: %w", err)
		}
		e.metricsSrv = &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
	}
	return nil
}

// handle builds the API server over h.
func (e *edge) handle(h http.Handler) {
	e.srv = &http.Server{
		Handler:           h,
		ReadHeaderTimeout: e.sc.HeaderTimeout,
		MaxHeaderBytes:    e.sc.MaxHeaderBytes,
		IdleTimeout:       e.sc.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(e.log.Handler(), slog.LevelWarn),
	}
}

// separateMetrics reports whether /metrics has a listener of its own.
func (e *edge) separateMetrics() bool { return e.metricsLn != nil }

// addr returns the API's address; metricsAddr that of /metrics.
func (e *edge) addr() string { return e.ln.Addr().String() }

func (e *edge) metricsAddr() string {
	if e.metricsLn != nil {
		return e.metricsLn.Addr().String()
	}
	return e.addr()
}

// close closes the /metrics listener (the API's is closed by its server).
func (e *edge) close() {
	if e.metricsLn != nil {
		e.metricsLn.Close()
	}
}

// run serves under eg until ctx ends, then drains (or, when ectx ends
// first, a component failed: closes at once), then calls stop.
func (e *edge) run(ctx, ectx context.Context, eg *errgroup.Group, stop func()) {
	servers := []*http.Server{e.srv}
	serve(eg, e.srv, e.ln)
	if e.metricsSrv != nil {
		servers = append(servers, e.metricsSrv)
		serve(eg, e.metricsSrv, e.metricsLn)
	}
	eg.Go(func() error {
		select {
		case <-ctx.Done():
			e.drain(ectx, servers)
		case <-ectx.Done(): // a component failed: stop at once
			for _, s := range servers {
				s.Close()
			}
		}
		stop()
		return nil
	})
}

// serve runs srv on ln under eg until it is shut down.
func serve(eg *errgroup.Group, srv *http.Server, ln net.Listener) {
	eg.Go(func() error {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("gateway: serve %s: %w", ln.Addr(), err)
	})
}
