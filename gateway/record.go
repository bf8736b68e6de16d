package gateway

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/record"
)

// RecordConfig turns on the recording of routed requests for offline
// replay (warmpath analyze): one JSON line per answered request with its
// time, keyed hashes of its tenant and session, its prompt's block keys at
// routing.block_size, its prompt, output and cached tokens and the
// replica that answered; never any text (package record). A turn routed
// without tokenizing gets its block keys from the in-process tokenizer
// (routing.tokenizer), or has none without one. Off unless Dir
// is set. Tenant and session ids are hashed with HMAC-SHA-256 under
// auth.salt_secret when one is configured.
type RecordConfig struct {
	// Dir is the folder the files are written to (created if missing);
	// empty turns recording off.
	Dir string `yaml:"dir"`
	// MaxFileBytes caps a file's size before the next one starts; default
	// 64 MiB.
	MaxFileBytes int64 `yaml:"max_file_bytes"`
	// Keep is how many files are kept, the current one included; older
	// ones are deleted. Default 8.
	Keep int `yaml:"keep"`
}

// newRecorder builds the recorder of cfg, nil when recording is off.
// Gateway.Run runs it.
func newRecorder(cfg RecordConfig, key string, log *slog.Logger, reg prometheus.Registerer) (*record.Recorder, error) {
	if cfg.Dir == "" {
		return nil, nil
	}
	if cfg.MaxFileBytes < 0 || cfg.Keep < 0 {
		return nil, fmt.Errorf("config: record: max_file_bytes and keep may not be negative")
	}
	rc := record.Config{Dir: cfg.Dir, MaxFileBytes: cfg.MaxFileBytes, Keep: cfg.Keep, Log: log.With("component", "record")}
	if key != "" {
		rc.Key = []byte(key)
	}
	rec, err := record.New(rc)
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
	if g.rec == nil {
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
	g.rec.Record(record.Entry{
		Time: x.routed, Tenant: tenant, Session: r.Session().Value,
		Blocks: x.route.Keys, BlockTokens: g.cfg.Routing.BlockSize,
		PromptTokens: u.PromptTokens, OutputTokens: u.CompletionTokens,
		Replica: x.replica.Spec.Name, CachedTokens: u.CachedTokens,
	})
}
