package gateway

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/record"
)

// newRecorder builds the recorder of cfg, nil when recording is off.
// Gateway.Run runs it.
func newRecorder(cfg record.Config, key string, log *slog.Logger, reg prometheus.Registerer) (*record.Recorder, error) {
	if cfg.Dir == "" {
		return nil, nil
	}
	cfg.Log = log.With("component", "record")
	if key != "" {
		cfg.Key = []byte(key)
	}
	rec, err := record.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("config: record: %w", err)
	}
	for result, f := range map[string]func() uint64{"written": rec.Written, "dropped": rec.Dropped, "failed": rec.Failed} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "warmpath_record_entries_total",
			Help:        "Routed requests given to the recorder (record.dir), by result: written, dropped (the writer's queue was full), failed (a disk error).",
			ConstLabels: prometheus.Labels{"result": result},
		}, func() float64 { return float64(f()) }))
	}
	return rec, nil
}

// recordExchange hands an answered exchange to the recorder, if on; u is
// the usage its replica reported.
func (g *Gateway) recordExchange(x *exchange, u request.Usage) {
	if g.obs.rec == nil {
		return
	}
	r := x.req
	if x.route.Keys == nil {
		x.route.Keys = g.router.LocalKeys(r.R)
	}
	tenant := ""
	if p := r.Principal(); p != nil {
		tenant = p.TenantID
	}
	g.obs.rec.Record(record.Entry{
		Time: x.routed, Tenant: tenant, Session: r.Session().Value,
		Blocks: x.route.Keys, BlockTokens: g.cfg.Routing.BlockSize,
		PromptTokens: u.PromptTokens, OutputTokens: u.CompletionTokens,
		Replica: x.replica.Spec.Name, CachedTokens: u.CachedTokens,
	})
}
