package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime/debug"
	"slices"
	"time"
)

// maxModelsBody bounds the GET /v1/models response the fleet reads.
const maxModelsBody = 1 << 20

// scrapeQuery asks prometheus_client-based exporters (vLLM's) to send only
// the samples the parser reads; exporters that ignore it send everything.
var scrapeQuery = func() string {
	q := url.Values{}
	for _, n := range metricNames[1:] {
		q.Add("name[]", n)
	}
	return "?" + q.Encode()
}()

// prober runs one replica's health and scrape loops. Its fields are set
// before the loops start and read-only afterwards.
type prober struct {
	r      *Replica
	client *http.Client
	header http.Header
	now    func() time.Time
}

// get sends GET base+path with the configured headers under a timeout.
func (p *prober) get(ctx context.Context, path string, timeout time.Duration, accept string) (*http.Response, context.CancelFunc, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.r.Spec.URL+path, nil)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	for k, vs := range p.header {
		req.Header[k] = vs
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return resp, cancel, nil
}

// drain reads a little of the body and closes it so the connection can be
// reused.
func drain(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 64<<10))
	_ = body.Close()
}

// checkHealth runs one GET /health. A nil error means healthy.
func (p *prober) checkHealth(ctx context.Context) error {
	resp, cancel, err := p.get(ctx, "/health", p.r.cfg.Health.Timeout, "")
	if err != nil {
		return fmt.Errorf("GET /health: %w", err)
	}
	defer cancel()
	defer drain(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /health: status %d", resp.StatusCode)
	}
	return nil
}

// discoverModels runs one GET /v1/models.
func (p *prober) discoverModels(ctx context.Context) ([]string, error) {
	resp, cancel, err := p.get(ctx, "/v1/models", p.r.cfg.Health.Timeout, "application/json")
	if err != nil {
		return nil, fmt.Errorf("GET /v1/models: %w", err)
	}
	defer cancel()
	defer drain(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/models: status %d", resp.StatusCode)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxModelsBody)).Decode(&list); err != nil {
		return nil, fmt.Errorf("GET /v1/models: decode: %w", err)
	}
	models := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		if m.ID != "" {
			models = append(models, m.ID)
		}
	}
	if len(models) == 0 {
		return nil, fmt.Errorf("GET /v1/models: no models listed")
	}
	return models, nil
}

// verifyModel checks, once each time the replica becomes healthy, that it
// serves the model its spec pins, and warns when it does not: vLLM serves a
// model under its --served-model-name (default: the --model path, such as
// Qwen/Qwen3-32B), and a request or /tokenize call naming another model gets
// 404 from the engine. A replica whose /v1/models cannot be read is logged
// and trusted.
func (p *prober) verifyModel(ctx context.Context) {
	want := p.r.Spec.Model
	models, err := p.discoverModels(ctx)
	switch {
	case ctx.Err() != nil:
	case err != nil:
		p.r.log.Info("fleet: cannot check that the replica serves the configured model", "model", want, "err", err)
	case !slices.Contains(models, want):
		p.r.log.Warn("fleet: replica does not serve the configured model; requests for it will fail with 404 until vLLM's --served-model-name or the configured model is changed",
			"model", want, "served", models)
	}
}

// statusError is an unexpected HTTP status.
type statusError int

func (e statusError) Error() string { return fmt.Sprintf("status %d", int(e)) }

// scraper holds one replica's scrape-loop state; only the scrape goroutine
// uses it.
type scraper struct {
	br         *bufio.Reader // reused line buffer
	unfiltered bool          // the exporter ignored or rejected the name[] filter
}

// scrape runs one GET /metrics and parses it. The first attempt asks for
// only the needed samples; if the replica answers it with an error status or
// without vLLM's queue gauges but an unfiltered scrape works, the replica is
// scraped unfiltered from then on.
func (p *prober) scrape(ctx context.Context, sc *scraper) (engineMetrics, error) {
	if !sc.unfiltered {
		m, err := p.scrapeOnce(ctx, sc, scrapeQuery)
		var se statusError
		if err == nil || ctx.Err() != nil || !(errors.Is(err, errNoEngineMetrics) || errors.As(err, &se)) {
			return m, err // success, or the replica did not answer at all
		}
		m, err2 := p.scrapeOnce(ctx, sc, "")
		if err2 != nil {
			return m, err // report the first error; both failed
		}
		sc.unfiltered = true
		p.r.log.Debug("fleet: metrics filter unsupported; scraping unfiltered", "err", err)
		return m, nil
	}
	return p.scrapeOnce(ctx, sc, "")
}

// scrapeOnce runs one GET /metrics with the given query string.
func (p *prober) scrapeOnce(ctx context.Context, sc *scraper, query string) (engineMetrics, error) {
	resp, cancel, err := p.get(ctx, "/metrics"+query, p.r.cfg.ScrapeTimeout, "text/plain;version=0.0.4")
	if err != nil {
		return engineMetrics{}, fmt.Errorf("GET /metrics: %w", err)
	}
	defer cancel()
	defer drain(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return engineMetrics{}, fmt.Errorf("GET /metrics: %w", statusError(resp.StatusCode))
	}
	m, err := parseEngineMetrics(resp.Body, sc.br)
	if err != nil {
		return m, fmt.Errorf("GET /metrics: %w", err)
	}
	return m, nil
}

// healthLoop checks health every Health.Interval until ctx is done, and
// discovers models when the spec names none: on becoming healthy and then
// every ModelsInterval (counted in health ticks) while healthy. When the
// spec names one, it checks on becoming healthy that the replica serves it
// (verifyModel).
func (p *prober) healthLoop(ctx context.Context) {
	cfg := p.r.cfg
	t := time.NewTicker(cfg.Health.Interval)
	defer t.Stop()
	modelsEvery := max(1, int(cfg.ModelsInterval/cfg.Health.Interval))
	ticks := 0 // healthy ticks since the last successful model discovery
	needModels := p.r.Spec.Model == ""
	modelsFailing := false // for log de-duplication
	for {
		p.protect("health", func() {
			err := p.checkHealth(ctx)
			if ctx.Err() != nil {
				return // shutting down or removed: not the replica's fault
			}
			recovered := p.r.activeResult(p.now(), err)
			if recovered {
				p.updated()
			}
			if recovered && !needModels {
				p.verifyModel(ctx)
			}
			if !needModels || !p.r.State().Healthy {
				return
			}
			if recovered || ticks == 0 || ticks >= modelsEvery {
				models, err := p.discoverModels(ctx)
				switch {
				case ctx.Err() != nil:
				case err != nil:
					if !modelsFailing {
						p.r.log.Warn("fleet: model discovery failed", "err", err)
					}
					modelsFailing = true
					ticks = 0 // retry on the next tick
				default:
					p.r.setModels(models)
					modelsFailing = false
					ticks = 1
				}
				return
			}
			ticks++
		})
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scrapeLoop scrapes metrics every Health.ScrapeInterval until ctx is done.
func (p *prober) scrapeLoop(ctx context.Context) {
	t := time.NewTicker(p.r.cfg.Health.ScrapeInterval)
	defer t.Stop()
	sc := &scraper{br: bufio.NewReaderSize(nil, metricsBufSize)}
	for {
		p.protect("scrape", func() {
			m, err := p.scrape(ctx, sc)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				p.r.setScrapeErr(err)
				if !p.r.scrapeFailing.Swap(true) {
					p.r.log.Warn("fleet: scrape failed", "err", err)
				}
				return
			}
			if p.r.scrapeFailing.Swap(false) {
				p.r.log.Info("fleet: scrape recovered")
			}
			p.r.setMetrics(p.now(), m)
			p.updated()
		})
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// updated calls Config.OnUpdate, if set, after the replica's state
// changed in a way that may give it room.
func (p *prober) updated() {
	if f := p.r.cfg.OnUpdate; f != nil {
		f(p.r)
	}
}

// protect runs fn, turning a panic into a logged error so that one bad
// response cannot kill the replica's loop (or the process).
func (p *prober) protect(what string, fn func()) {
	defer func() {
		if v := recover(); v != nil {
			p.r.log.Error("fleet: panic in "+what+" loop", "panic", v, "stack", string(debug.Stack()))
		}
	}()
	fn()
}
