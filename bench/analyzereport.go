package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/warmpath/warmpath/scoring"
)

// MarshalJSON encodes the report as
//
//	{"ceiling": f, "requests": n, "prompt_tokens": n, "results": [{"policy": s,
//	 "cache_blocks": n, "cached_fraction": f, "imbalance": f, …}], …}
//
// with the ceiling as a fraction of prompt tokens, plus further fields
// describing the ceiling and the simulated fleet.
func (r *AnalyzeReport) MarshalJSON() ([]byte, error) {
	type out struct {
		Ceiling             float64           `json:"ceiling"`
		Requests            int               `json:"requests"`
		PromptTokens        int64             `json:"prompt_tokens"`
		Results             []AnalyzeResult   `json:"results"`
		PooledLRU           []PooledLRUResult `json:"pooled_lru"`
		Format              string            `json:"format"`
		BlockTokens         int               `json:"block_tokens"`
		WindowSeconds       float64           `json:"window_s"`
		CeilingDetail       CeilingResult     `json:"ceiling_detail"`
		CeilingUnlimited    CeilingResult     `json:"ceiling_unlimited"`
		Replicas            int               `json:"replicas"`
		PrefillTokensPerSec float64           `json:"prefill_tokens_per_s"`
		TimeScale           float64           `json:"time_scale"`
		CPUBlocks           int               `json:"cpu_blocks,omitempty"`
		Recorded            *RecordedResult   `json:"recorded,omitempty"`
	}
	results := r.Results
	if results == nil {
		results = []AnalyzeResult{}
	}
	return json.Marshal(out{
		Ceiling:             r.Ceiling.Fraction,
		Requests:            r.Requests,
		PromptTokens:        r.PromptTokens,
		Results:             results,
		PooledLRU:           r.PooledLRU,
		Format:              r.Format,
		BlockTokens:         r.BlockTokens,
		WindowSeconds:       r.Window.Seconds(),
		CeilingDetail:       r.Ceiling,
		CeilingUnlimited:    r.CeilingUnlimited,
		Replicas:            r.Replicas,
		PrefillTokensPerSec: r.PrefillTokensPerSec,
		TimeScale:           r.TimeScale,
		CPUBlocks:           r.CPUBlocks,
		Recorded:            r.Recorded,
	})
}

// policies returns the report's policies in result order.
func (r *AnalyzeReport) policies() []string {
	var out []string
	for _, res := range r.Results {
		if !slices.Contains(out, res.Policy) {
			out = append(out, res.Policy)
		}
	}
	return out
}

// cacheSizes returns the report's cache sizes, ascending.
func (r *AnalyzeReport) cacheSizes() []int {
	var out []int
	for _, res := range r.Results {
		out = append(out, res.CacheBlocks)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// result returns the result for policy at cache size cb.
func (r *AnalyzeReport) result(policy string, cb int) (AnalyzeResult, bool) {
	i := slices.IndexFunc(r.Results, func(res AnalyzeResult) bool { return res.Policy == policy && res.CacheBlocks == cb })
	if i < 0 {
		return AnalyzeResult{}, false
	}
	return r.Results[i], true
}

// windowString renders the ceiling's window.
func (r *AnalyzeReport) windowString() string {
	if r.Window == 0 {
		return "unlimited"
	}
	return shortDuration(r.Window)
}

// shortDuration renders d without zero trailing units: 10m, 1h30m, 90s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// WriteTable writes the report as text tables: the trace and the ceiling,
// then one row per cache size with, per policy, the cached fraction, its
// share of the ceiling and the imbalance; then the prefill queueing and,
// for sticky policies, the sticky share and rebinds.
func (r *AnalyzeReport) WriteTable(w io.Writer) error {
	ew := &errWriter{w: w}
	r.writeHeader(ew)
	pols, sizes := r.policies(), r.cacheSizes()

	table := func(title string, withPooled bool, cell func(AnalyzeResult) string) {
		ew.printf("%s\n", title)
		tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
		var hdr strings.Builder
		hdr.WriteString("cache blocks\t")
		if withPooled {
			hdr.WriteString("pooled LRU\t")
		}
		for _, p := range pols {
			hdr.WriteString(p + "\t")
		}
		fmt.Fprintln(tw, hdr.String())
		for _, cb := range sizes {
			var row strings.Builder
			row.WriteString(strconv.Itoa(cb) + "\t")
			if withPooled {
				i := slices.IndexFunc(r.PooledLRU, func(p PooledLRUResult) bool { return p.CacheBlocks == cb })
				if i >= 0 {
					row.WriteString(fmt.Sprintf("%.1f%% (%3.0f%%)", 100*r.PooledLRU[i].CachedFraction, 100*ratioF(r.PooledLRU[i].CachedFraction, r.Ceiling.Fraction)))
				}
				row.WriteString("\t")
			}
			for _, p := range pols {
				if res, ok := r.result(p, cb); ok {
					row.WriteString(cell(res))
				}
				row.WriteString("\t")
			}
			fmt.Fprintln(tw, row.String())
		}
		if err := tw.Flush(); err != nil && ew.err == nil {
			ew.err = err
		}
		ew.printf("\n")
	}
	if r.CPUBlocks > 0 {
		ew.printf("CPU offload tier: %d blocks per replica behind its cache (cached fractions include its hits, loaded at %.0f%% of a prefill's cost)\n\n",
			r.CPUBlocks, 100*scoring.CPUHitCost)
		table("cached fraction (share of ceiling) ×imbalance, of which from CPU; pooled LRU = one LRU of replicas × (cache + CPU) blocks", true, func(res AnalyzeResult) string {
			return fmt.Sprintf("%.1f%% (%3.0f%%) ×%.2f cpu %.1f%%", 100*res.CachedFraction, 100*res.CeilingShare, res.Imbalance, 100*res.CPUFraction)
		})
	} else {
		table("cached fraction (share of ceiling) ×imbalance; pooled LRU = one LRU of replicas × cache blocks", true, func(res AnalyzeResult) string {
			return fmt.Sprintf("%.1f%% (%3.0f%%) ×%.2f", 100*res.CachedFraction, 100*res.CeilingShare, res.Imbalance)
		})
	}
	table("prefill queue wait, mean / p99 (s)", false, func(res AnalyzeResult) string {
		return fmt.Sprintf("%.2f / %.2f", res.MeanQueueSeconds, res.P99QueueSeconds)
	})
	table("TTFT p50 / p90 / p99 (s): wait + own uncached prefill", false, func(res AnalyzeResult) string {
		return fmt.Sprintf("%.2f / %.2f / %.2f", res.TTFTP50Seconds, res.TTFTP90Seconds, res.TTFTP99Seconds)
	})
	if slices.ContainsFunc(r.Results, func(res AnalyzeResult) bool { return res.Estimated > 0 }) {
		table("TTFT estimate error |estimated − simulated| ÷ simulated, p50 / p90 (policies that estimate)", false, func(res AnalyzeResult) string {
			if res.Estimated == 0 {
				return "-"
			}
			return fmt.Sprintf("%.1f%% / %.1f%%", 100*res.EstimateErrorP50, 100*res.EstimateErrorP90)
		})
		r.writePredictions(ew, sizes)
	}
	if slices.ContainsFunc(r.Results, func(res AnalyzeResult) bool { return res.StickyShare > 0 || len(res.Rebinds) > 0 }) {
		table("sticky share, rebinds evicted/saturated/rescored (sticky policies); sat = share of requests routed to a saturated replica", false, func(res AnalyzeResult) string {
			if res.StickyShare == 0 && len(res.Rebinds) == 0 {
				return fmt.Sprintf("sat %.0f%%", 100*res.SaturatedShare)
			}
			return fmt.Sprintf("%.0f%% %d/%d/%d sat %.0f%%", 100*res.StickyShare,
				res.Rebinds[scoring.RebindEvicted], res.Rebinds[scoring.RebindSaturated], res.Rebinds["rescored"], 100*res.SaturatedShare)
		})
	}
	return ew.err
}

// writePredictions prints warmpath's sampled decisions, predicted against
// simulated TTFT, at the median cache size.
func (r *AnalyzeReport) writePredictions(ew *errWriter, sizes []int) {
	res, ok := r.result(scoring.PolicyWarmpath, sizes[len(sizes)/2])
	if !ok || len(res.Predictions) == 0 {
		return
	}
	ew.printf("warmpath at %d cache blocks, sampled decisions: estimated vs simulated TTFT\n", res.CacheBlocks)
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "request\treplica\treason\tqueued tok\tuncached tok\tcached tok\testimated s\tsimulated s\t")
	for _, p := range res.Predictions {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%d\t%.3f\t%.3f\t\n", p.Request, p.Replica, p.Reason,
			p.QueuedTokens, p.UncachedTokens, p.CachedTokens, p.EstimatedSeconds, p.SimulatedSeconds)
	}
	if err := tw.Flush(); err != nil && ew.err == nil {
		ew.err = err
	}
	ew.printf("\n")
}

// errWriter remembers the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) { fmt.Fprintf(e, format, args...) }

// Plot returns the chart of cached fraction against cache size, one line
// per policy, with the ceiling (within the window, and unlimited) as flat
// lines.
func (r *AnalyzeReport) Plot() Chart {
	c := Chart{
		Title:  fmt.Sprintf("Cached fraction of prompt tokens, %d replicas", r.Replicas),
		XLabel: fmt.Sprintf("cache per replica (blocks of %d tokens)", r.BlockTokens),
		YLabel: "cached fraction",
		LogX:   true,
	}
	sizes := r.cacheSizes()
	for _, p := range r.policies() {
		c.Series = append(c.Series, r.series(p, func(res AnalyzeResult) float64 { return res.CachedFraction }))
	}
	if len(sizes) > 0 {
		lo, hi := float64(sizes[0]), float64(sizes[len(sizes)-1])
		c.Series = append(c.Series,
			Series{Name: "ceiling (" + r.windowString() + ")", X: []float64{lo, hi}, Y: []float64{r.Ceiling.Fraction, r.Ceiling.Fraction}},
		)
		if r.Window != 0 {
			c.Series = append(c.Series,
				Series{Name: "ceiling (unlimited)", X: []float64{lo, hi}, Y: []float64{r.CeilingUnlimited.Fraction, r.CeilingUnlimited.Fraction}})
		}
	}
	if len(r.PooledLRU) > 0 {
		s := Series{Name: "pooled LRU"}
		for _, p := range r.PooledLRU {
			s.X = append(s.X, float64(p.CacheBlocks))
			s.Y = append(s.Y, p.CachedFraction)
		}
		c.Series = append(c.Series, s)
	}
	return c
}

// ImbalancePlot returns the chart of imbalance (max ÷ mean prefill tokens
// per replica) against cache size, one line per policy.
func (r *AnalyzeReport) ImbalancePlot() Chart {
	c := Chart{
		Title:  fmt.Sprintf("Prefill imbalance (max ÷ mean per replica), %d replicas", r.Replicas),
		XLabel: fmt.Sprintf("cache per replica (blocks of %d tokens)", r.BlockTokens),
		YLabel: "imbalance",
		LogX:   true,
	}
	for _, p := range r.policies() {
		c.Series = append(c.Series, r.series(p, func(res AnalyzeResult) float64 { return res.Imbalance }))
	}
	return c
}

// series returns policy p's values of v against cache size.
func (r *AnalyzeReport) series(p string, v func(AnalyzeResult) float64) Series {
	var rs []AnalyzeResult
	for _, res := range r.Results {
		if res.Policy == p {
			rs = append(rs, res)
		}
	}
	slices.SortFunc(rs, func(a, b AnalyzeResult) int { return cmp.Compare(a.CacheBlocks, b.CacheBlocks) })
	s := Series{Name: p}
	for _, res := range rs {
		s.X = append(s.X, float64(res.CacheBlocks))
		s.Y = append(s.Y, v(res))
	}
	return s
}

// writeHeader writes the trace, the ceiling and, for a recording, what
// the fleet got on it.
func (r *AnalyzeReport) writeHeader(ew *errWriter) {
	ew.printf("trace: %s, %d requests, %d prompt tokens, %d-token blocks; %d replicas at %.0f prefill tokens/s each, time scale %g\n",
		r.Format, r.Requests, r.PromptTokens, r.BlockTokens, r.Replicas, r.PrefillTokensPerSec, r.TimeScale)
	ew.printf("ceiling (window %s): %.1f%% of prompt tokens (%.1f%% of blocks); unlimited window: %.1f%% (%.1f%% of blocks)\n\n",
		r.windowString(), 100*r.Ceiling.Fraction, 100*r.Ceiling.BlockFraction, 100*r.CeilingUnlimited.Fraction, 100*r.CeilingUnlimited.BlockFraction)
	r.writeRecorded(ew)
}

// writeRecorded writes, for a recording, what the fleet actually got on
// it, to read the replayed policies against.
func (r *AnalyzeReport) writeRecorded(ew *errWriter) {
	rec := r.Recorded
	if rec == nil {
		return
	}
	ew.printf("recorded: the fleet cached %.1f%% of prompt tokens on %d replicas (×%.2f imbalance)\n",
		100*rec.CachedFraction, rec.Replicas, rec.Imbalance)
	if rec.Unkeyed > 0 {
		ew.printf("recorded without block keys: %d requests, %.1f%% of prompt tokens, uncached in every replayed figure (configure routing.tokenizer)\n",
			rec.Unkeyed, 100*ratioF(float64(rec.UnkeyedPromptTokens), float64(rec.PromptTokens)))
	}
	if rec.Skipped > 0 {
		ew.printf("skipped: %d entries without prompt tokens\n", rec.Skipped)
	}
	ew.printf("miss causes are not recorded: see warmpath_uncached_tokens_total by tenant and cause\n\n")
}
