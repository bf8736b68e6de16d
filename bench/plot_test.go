package bench

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
)

// walkSVG decodes svg with encoding/xml and returns the number of elements
// by local name, failing the test if it is not well-formed or its root is
// not an <svg> element.
func walkSVG(t *testing.T, svg []byte) map[string]int {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(svg))
	dec.Strict = true
	counts := map[string]int{}
	depth := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v\n%s", err, svg)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if depth == 0 && el.Name.Local != "svg" {
				t.Fatalf("root element is <%s>; want <svg>", el.Name.Local)
			}
			depth++
			counts[el.Name.Local]++
		case xml.EndElement:
			depth--
		}
	}
	if counts["svg"] != 1 {
		t.Fatalf("got %d <svg> elements; want 1", counts["svg"])
	}
	return counts
}

func TestChartSVG(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name  string
		chart Chart
		// polylines and circles are the expected counts of drawn lines and
		// markers.
		polylines, circles int
		contains           []string
	}{
		{
			name:      "empty chart",
			chart:     Chart{},
			polylines: 0, circles: 0,
			contains: []string{"no data"},
		},
		{
			name:      "empty series",
			chart:     Chart{Title: "t", Series: []Series{{Name: "none"}}},
			polylines: 0, circles: 0,
			contains: []string{"no data", ">none<"},
		},
		{
			name:      "single point",
			chart:     Chart{Series: []Series{{Name: "one", X: []float64{3}, Y: []float64{7}}}},
			polylines: 0, circles: 1,
		},
		{
			name: "two series with escaping",
			chart: Chart{
				Title: `cached <fraction> & "imbalance"`, XLabel: "cache blocks", YLabel: "fraction",
				Series: []Series{
					{Name: "a<b", X: []float64{1, 2, 3}, Y: []float64{0.1, 0.2, 0.3}},
					{Name: "c&d", X: []float64{1, 2, 3}, Y: []float64{0.3, 0.2, 0.1}},
				},
			},
			polylines: 2, circles: 6,
			contains: []string{"cached &lt;fraction&gt; &amp; &#34;imbalance&#34;", "a&lt;b", "c&amp;d", "#4e79a7", "#f28e2b"},
		},
		{
			name: "NaN breaks the line",
			chart: Chart{Series: []Series{
				{Name: "gap", X: []float64{1, 2, 3, 4, 5}, Y: []float64{1, 2, nan, 4, 5}},
			}},
			polylines: 2, circles: 4,
		},
		{
			name: "log x skips non-positive x",
			chart: Chart{LogX: true, Series: []Series{
				{Name: "sizes", X: []float64{-1, 0, 150, 300, 600, 1200, 2400}, Y: []float64{9, 9, 1, 2, 3, 4, 5}},
			}},
			polylines: 1, circles: 5,
			contains: []string{">200<", ">500<", ">1000<", ">2000<"},
		},
		{
			name: "fixed y range clips",
			chart: Chart{YMin: 0, YMax: 1, Series: []Series{
				{Name: "f", X: []float64{0, 1}, Y: []float64{0.5, 2}},
			}},
			polylines: 1, circles: 2,
			contains: []string{">1.0<", ">0.0<", "clip-path"},
		},
		{
			name:      "only NaN on log axis",
			chart:     Chart{LogX: true, Series: []Series{{Name: "x", X: []float64{nan, 0}, Y: []float64{1, 1}}}},
			polylines: 0, circles: 0,
			contains: []string{"no data"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svg := tt.chart.SVG()
			counts := walkSVG(t, svg)
			if got := counts["polyline"]; got != tt.polylines {
				t.Errorf("got %d polylines; want %d", got, tt.polylines)
			}
			if got := counts["circle"]; got != tt.circles {
				t.Errorf("got %d markers; want %d", got, tt.circles)
			}
			if got := counts["text"]; got == 0 {
				t.Errorf("no <text> elements: no tick labels")
			}
			for _, s := range tt.contains {
				if !bytes.Contains(svg, []byte(s)) {
					t.Errorf("SVG lacks %q:\n%s", s, svg)
				}
			}
			if !bytes.Equal(svg, tt.chart.SVG()) {
				t.Errorf("SVG is not deterministic")
			}
			if bytes.Contains(svg, []byte("NaN")) || bytes.Contains(svg, []byte("Inf")) {
				t.Errorf("SVG contains a NaN or Inf coordinate:\n%s", svg)
			}
		})
	}
}

func TestChartSVGSize(t *testing.T) {
	svg := string(Chart{Series: []Series{{Name: "a", X: []float64{1, 2}, Y: []float64{1, 2}}}}.SVG())
	if !strings.Contains(svg, `width="720" height="400"`) {
		t.Errorf("default size missing:\n%s", svg)
	}
	svg = string(Chart{Width: 300, Height: 200}.SVG())
	if !strings.Contains(svg, `width="300" height="200"`) {
		t.Errorf("custom size missing:\n%s", svg)
	}
}

func TestChartManySeriesDistinct(t *testing.T) {
	seen := map[[2]string]bool{}
	for i := range 2 * len(palette) {
		c, d := style(i)
		if seen[[2]string{c, d}] {
			t.Fatalf("series %d reuses colour %s with dash %q", i, c, d)
		}
		seen[[2]string{c, d}] = true
	}
}

func TestLinearAxisTicks(t *testing.T) {
	tests := []struct {
		lo, hi         float64
		wantLo, wantHi float64
		labels         []string
	}{
		{0.05, 0.34, 0.05, 0.35, []string{"0.05", "0.10", "0.15", "0.20", "0.25", "0.30", "0.35"}},
		{0, 1, 0, 1, []string{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0"}},
		{1, 7.2, 1, 8, []string{"1", "2", "3", "4", "5", "6", "7", "8"}},
		{0, 120000, 0, 120000, []string{"0", "20k", "40k", "60k", "80k", "100k", "120k"}},
		{5, 5, 4.4, 5.6, nil},
	}
	for _, tt := range tests {
		a := linearAxis(tt.lo, tt.hi, true)
		if math.Abs(a.lo-tt.wantLo) > 1e-9 || math.Abs(a.hi-tt.wantHi) > 1e-9 {
			t.Errorf("linearAxis(%v, %v) range = [%v, %v]; want [%v, %v]", tt.lo, tt.hi, a.lo, a.hi, tt.wantLo, tt.wantHi)
		}
		if tt.labels == nil {
			continue
		}
		var got []string
		for _, tk := range a.ticks {
			got = append(got, tk.label)
		}
		if strings.Join(got, " ") != strings.Join(tt.labels, " ") {
			t.Errorf("linearAxis(%v, %v) labels = %v; want %v", tt.lo, tt.hi, got, tt.labels)
		}
	}
}

func TestCDF(t *testing.T) {
	s := CDF("lat", []float64{3, 1, math.NaN(), 2, 2})
	wantX, wantY := []float64{1, 2, 3}, []float64{0.25, 0.75, 1}
	if len(s.X) != len(wantX) {
		t.Fatalf("CDF points = %v, %v; want %v, %v", s.X, s.Y, wantX, wantY)
	}
	for i := range wantX {
		if s.X[i] != wantX[i] || s.Y[i] != wantY[i] {
			t.Errorf("point %d = (%v, %v); want (%v, %v)", i, s.X[i], s.Y[i], wantX[i], wantY[i])
		}
	}
	if s.Name != "lat" {
		t.Errorf("name = %q; want lat", s.Name)
	}
	if e := CDF("e", nil); len(e.X) != 0 || len(e.Y) != 0 {
		t.Errorf("CDF of nothing has %d points; want 0", len(e.X))
	}

	many := make([]float64, 10000)
	for i := range many {
		many[i] = float64(i)
	}
	s = CDF("many", many)
	if len(s.X) > 500 || len(s.X) < 400 {
		t.Errorf("thinned CDF has %d points; want ≤ 500 and near it", len(s.X))
	}
	if s.X[0] != 0 || s.X[len(s.X)-1] != 9999 || s.Y[len(s.Y)-1] != 1 {
		t.Errorf("thinned CDF lost its ends: first (%v, %v), last (%v, %v)", s.X[0], s.Y[0], s.X[len(s.X)-1], s.Y[len(s.Y)-1])
	}
	for i := 1; i < len(s.X); i++ {
		if s.X[i] <= s.X[i-1] || s.Y[i] <= s.Y[i-1] {
			t.Fatalf("CDF not increasing at %d", i)
		}
	}
}
