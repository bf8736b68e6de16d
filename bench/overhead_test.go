package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// A tiny overhead run: every target answers every request, the report
// names each, and the table prints.
func TestOverheadSmoke(t *testing.T) {
	rep, err := Overhead(t.Context(), OverheadConfig{
		Shapes: map[string][]float64{ShapeShort: {50}, ShapeSticky: {50}}, Window: 400 * time.Millisecond, Rounds: 1,
		MaxRates: []float64{100}, Policies: []string{"warmpath"},
	})
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, r := range rep.Results {
		targets[r.Target] = true
		if r.Requests == 0 || r.Errors != 0 {
			t.Errorf("%s %s: %d requests, %d errors", r.Shape, r.Target, r.Requests, r.Errors)
		}
	}
	for _, want := range []string{"direct", "proxy", "warmpath:warmpath"} {
		if !targets[want] {
			t.Errorf("no results for %s", want)
		}
	}
	var b bytes.Buffer
	if err := rep.WriteTable(&b); err != nil || !strings.Contains(b.String(), "highest short-prompt rate") {
		t.Errorf("table: %v\n%s", err, b.String())
	}
}
