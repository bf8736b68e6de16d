package bench

import (
	"bytes"
	"cmp"
	"encoding/xml"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Series is one line of a chart.
type Series struct {
	// Name labels the line in the legend.
	Name string
	// X and Y are the points' coordinates, aligned; points beyond the
	// shorter of the two are ignored, and a point with a NaN or infinite
	// coordinate (or, on a logarithmic axis, a non-positive x) is skipped,
	// breaking the line there.
	X, Y []float64
}

// Chart is a line chart rendered as a self-contained SVG element.
type Chart struct {
	// Title is drawn above the plot; XLabel and YLabel name the axes.
	Title, XLabel, YLabel string
	// LogX makes the x axis logarithmic (cache sizes, latencies).
	LogX bool
	// YMin and YMax fix the y range; both zero fits the data.
	YMin, YMax float64
	// Width and Height are the size in pixels; zero means 720×400.
	Width, Height int
	// Series are the lines, drawn in order with distinct colours.
	Series []Series
}

// Default chart size, in pixels.
const (
	defaultChartWidth  = 720
	defaultChartHeight = 400
)

// palette holds the series colours (Tableau 10); series beyond it reuse a
// colour with a dash pattern, so no two lines look alike.
var palette = [...]string{
	"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
	"#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
}

// dashes are the dash patterns of the second and later rounds of palette.
var dashes = [...]string{"", "6 3", "2 3", "8 3 2 3"}

// maxMarkers is the number of points up to which a series also gets a
// marker at each point.
const maxMarkers = 40

// SVG renders the chart as one <svg> element with axes, tick labels, a
// legend and one coloured line per series. It needs no external assets and
// is deterministic: the same chart gives the same bytes.
func (c Chart) SVG() []byte {
	w, h := c.Width, c.Height
	if w <= 0 {
		w = defaultChartWidth
	}
	if h <= 0 {
		h = defaultChartHeight
	}
	lines := c.segments()

	// Layout: title on top, legend on the right, tick labels and axis
	// labels left and below.
	legendW := 0
	for _, s := range c.Series {
		legendW = max(legendW, textWidth(s.Name))
	}
	if len(c.Series) > 0 {
		legendW = min(legendW+44, w/3)
	}
	left, right, top, bottom := 72.0, float64(legendW+16), 36.0, 52.0
	if c.Title == "" {
		top = 16
	}
	pw, ph := max(float64(w)-left-right, 10), max(float64(h)-top-bottom, 10)

	xs, ys := c.axes(lines)
	px := func(x float64) float64 { return left + xs.frac(x)*pw }
	py := func(y float64) float64 { return top + (1-ys.frac(y))*ph }

	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	if c.Title != "" {
		fmt.Fprintf(&b, "<title>%s</title>\n", esc(c.Title))
	}
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", w, h)
	clip := c.clipID()
	fmt.Fprintf(&b, `<defs><clipPath id="%s"><rect x="%s" y="%s" width="%s" height="%s"/></clipPath></defs>`+"\n", clip, num(left), num(top), num(pw), num(ph))
	if c.Title != "" {
		fmt.Fprintf(&b, `<text x="%s" y="22" text-anchor="middle" font-size="15" font-weight="bold">%s</text>`+"\n", num(left+pw/2), esc(c.Title))
	}

	// Grid and ticks.
	b.WriteString(`<g stroke="#e0e0e0" stroke-width="1">` + "\n")
	for _, t := range xs.ticks {
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", num(px(t.v)), num(top), num(px(t.v)), num(top+ph))
	}
	for _, t := range ys.ticks {
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", num(left), num(py(t.v)), num(left+pw), num(py(t.v)))
	}
	b.WriteString("</g>\n")
	fmt.Fprintf(&b, `<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#333333"/>`+"\n", num(left), num(top), num(pw), num(ph))
	b.WriteString(`<g fill="#333333">` + "\n")
	for _, t := range xs.ticks {
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", num(px(t.v)), num(top+ph+16), esc(t.label))
	}
	for _, t := range ys.ticks {
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="end">%s</text>`+"\n", num(left-6), num(py(t.v)+4), esc(t.label))
	}
	if c.XLabel != "" {
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", num(left+pw/2), num(top+ph+38), esc(c.XLabel))
	}
	if c.YLabel != "" {
		fmt.Fprintf(&b, `<text transform="translate(16 %s) rotate(-90)" text-anchor="middle">%s</text>`+"\n", num(top+ph/2), esc(c.YLabel))
	}
	b.WriteString("</g>\n")
	if len(lines) == 0 || !slices.ContainsFunc(lines, func(l []segment) bool { return len(l) > 0 }) {
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle" fill="#888888">no data</text>`+"\n", num(left+pw/2), num(top+ph/2))
	}

	// Lines, clipped to the plot area.
	fmt.Fprintf(&b, `<g clip-path="url(#%s)" fill="none" stroke-width="2" stroke-linejoin="round">`+"\n", clip)
	for i, segs := range lines {
		color, dash := style(i)
		dashAttr := ""
		if dash != "" {
			dashAttr = fmt.Sprintf(` stroke-dasharray="%s"`, dash)
		}
		points := 0
		for _, seg := range segs {
			points += len(seg)
			if len(seg) < 2 {
				continue
			}
			b.WriteString(`<polyline points="`)
			for j, p := range seg {
				if j > 0 {
					b.WriteByte(' ')
				}
				b.WriteString(num(px(p.x)) + "," + num(py(p.y)))
			}
			fmt.Fprintf(&b, `" stroke="%s"%s/>`+"\n", color, dashAttr)
		}
		if points <= maxMarkers {
			for _, seg := range segs {
				for _, p := range seg {
					fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s" stroke="none"/>`+"\n", num(px(p.x)), num(py(p.y)), color)
				}
			}
		}
	}
	b.WriteString("</g>\n")

	// Legend.
	if len(c.Series) > 0 {
		lx := left + pw + 16
		b.WriteString(`<g font-size="12">` + "\n")
		for i, s := range c.Series {
			color, dash := style(i)
			y := top + 8 + float64(i)*18
			dashAttr := ""
			if dash != "" {
				dashAttr = fmt.Sprintf(` stroke-dasharray="%s"`, dash)
			}
			fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"%s/>`+"\n", num(lx), num(y), num(lx+22), num(y), color, dashAttr)
			fmt.Fprintf(&b, `<text x="%s" y="%s" fill="#333333">%s</text>`+"\n", num(lx+28), num(y+4), esc(s.Name))
		}
		b.WriteString("</g>\n")
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// point is one drawable point.
type point struct{ x, y float64 }

// segment is a run of drawable points between skipped ones.
type segment []point

// segments returns, per series, its drawable points cut into runs at the
// skipped ones.
func (c Chart) segments() [][]segment {
	out := make([][]segment, len(c.Series))
	for i, s := range c.Series {
		var cur segment
		for j := range min(len(s.X), len(s.Y)) {
			x, y := s.X[j], s.Y[j]
			if !finite(x) || !finite(y) || (c.LogX && x <= 0) {
				if len(cur) > 0 {
					out[i] = append(out[i], cur)
					cur = nil
				}
				continue
			}
			cur = append(cur, point{x, y})
		}
		if len(cur) > 0 {
			out[i] = append(out[i], cur)
		}
	}
	return out
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// tick is one labelled axis position.
type tick struct {
	v     float64
	label string
}

// axis maps data values to [0,1] along one axis.
type axis struct {
	lo, hi float64
	log    bool
	ticks  []tick
}

// frac returns v's position along the axis, 0 at lo and 1 at hi.
func (a axis) frac(v float64) float64 {
	if a.log {
		return (math.Log10(v) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	}
	return (v - a.lo) / (a.hi - a.lo)
}

// axes fits both axes to the drawable points (or to YMin and YMax).
func (c Chart) axes(lines [][]segment) (axis, axis) {
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, segs := range lines {
		for _, seg := range segs {
			for _, p := range seg {
				xlo, xhi = min(xlo, p.x), max(xhi, p.x)
				ylo, yhi = min(ylo, p.y), max(yhi, p.y)
			}
		}
	}
	var xs axis
	if c.LogX {
		if xlo > xhi {
			xlo, xhi = 1, 10
		}
		xs = logAxis(xlo, xhi)
	} else {
		if xlo > xhi {
			xlo, xhi = 0, 1
		}
		xs = linearAxis(xlo, xhi, true)
	}
	var ys axis
	switch {
	case c.YMin != 0 || c.YMax != 0:
		lo, hi := c.YMin, c.YMax
		if !(hi > lo) || !finite(lo) || !finite(hi) {
			lo, hi = min(lo, hi), max(lo, hi)+1
			if !finite(lo) || !finite(hi) {
				lo, hi = 0, 1
			}
		}
		ys = linearAxis(lo, hi, false)
	case ylo > yhi:
		ys = linearAxis(0, 1, false)
	default:
		ys = linearAxis(ylo, yhi, true)
	}
	return xs, ys
}

// linearAxis returns an axis over [lo, hi] with about five ticks at round
// values; when extend is set the range grows to the enclosing ticks.
func linearAxis(lo, hi float64, extend bool) axis {
	if hi == lo {
		pad := math.Abs(lo) * 0.1
		if pad == 0 {
			pad = 1
		}
		lo, hi = lo-pad, hi+pad
	}
	step := niceStep((hi - lo) / 5)
	if extend {
		lo, hi = math.Floor(lo/step)*step, math.Ceil(hi/step)*step
	}
	a := axis{lo: lo, hi: hi}
	decimals := max(0, int(-math.Floor(math.Log10(step)+1e-9)))
	for i := math.Ceil(lo/step - 1e-9); i*step <= hi+step*1e-9; i++ {
		v := i * step
		if math.Abs(v) < step*1e-9 {
			v = 0
		}
		a.ticks = append(a.ticks, tick{v, formatTick(v, decimals)})
		if len(a.ticks) > 50 {
			break // a degenerate range; enough labels
		}
	}
	return a
}

// niceStep returns the value of the form 1, 2 or 5 times a power of ten
// nearest to raw on a logarithmic scale.
func niceStep(raw float64) float64 {
	if !(raw > 0) || !finite(raw) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	best := p
	for _, m := range []float64{2, 5, 10} {
		if math.Abs(math.Log(m*p/raw)) < math.Abs(math.Log(best/raw)) {
			best = m * p
		}
	}
	return best
}

// logAxis returns a logarithmic axis over [lo, hi] (both positive), padded
// a little, with ticks at 1, 2 and 5 times powers of ten, or at powers of
// ten only when that would be too many.
func logAxis(lo, hi float64) axis {
	if hi == lo {
		lo, hi = lo/2, hi*2
	}
	pad := (math.Log10(hi) - math.Log10(lo)) * 0.04
	lo, hi = math.Pow(10, math.Log10(lo)-pad), math.Pow(10, math.Log10(hi)+pad)
	a := axis{lo: lo, hi: hi, log: true}
	first, last := int(math.Floor(math.Log10(lo))), int(math.Ceil(math.Log10(hi)))
	mults := []float64{1, 2, 5}
	if last-first > 4 {
		mults = []float64{1}
	}
	for e := first; e <= last && len(a.ticks) <= 50; e++ {
		for _, m := range mults {
			v := m * math.Pow(10, float64(e))
			if v >= lo*(1-1e-9) && v <= hi*(1+1e-9) {
				a.ticks = append(a.ticks, tick{v, formatTick(v, max(0, -e))})
			}
		}
	}
	return a
}

// formatTick renders a tick value compactly: 1.5M, 20k, 0.25, 600.
func formatTick(v float64, decimals int) string {
	av := math.Abs(v)
	switch {
	case av >= 1e9:
		return strconv.FormatFloat(v/1e9, 'g', 4, 64) + "G"
	case av >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 4, 64) + "M"
	case av >= 1e4:
		return strconv.FormatFloat(v/1e3, 'g', 4, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', decimals, 64)
}

// style returns series i's colour and dash pattern.
func style(i int) (color, dash string) {
	return palette[i%len(palette)], dashes[(i/len(palette))%len(dashes)]
}

// clipID names the chart's clip path after a hash of its content, so that
// several charts inlined in one HTML page do not share an id.
func (c Chart) clipID() string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%q|%q|%q|%v|%v|%v|%d|%d", c.Title, c.XLabel, c.YLabel, c.LogX, c.YMin, c.YMax, c.Width, c.Height)
	for _, s := range c.Series {
		fmt.Fprintf(h, "|%q|%v|%v", s.Name, s.X, s.Y)
	}
	return fmt.Sprintf("wp-clip-%016x", h.Sum64())
}

// textWidth estimates the rendered width of s in pixels at 12px sans-serif
// (7.5 pixels a character, generous for proportional fonts).
func textWidth(s string) int { return 15 * len([]rune(s)) / 2 }

// num formats a coordinate with one decimal.
func num(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// esc escapes s for XML text and attribute values.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// maxCDFPoints bounds the points CDF returns.
const maxCDFPoints = 500

// CDF returns the empirical distribution of values as a series: the sorted
// distinct values against the fraction of values at or below each, thinned
// to at most 500 points (the first and last kept). NaNs are dropped; no
// values give a series with no points.
func CDF(name string, values []float64) Series {
	vs := slices.DeleteFunc(slices.Clone(values), math.IsNaN)
	s := Series{Name: name}
	if len(vs) == 0 {
		return s
	}
	slices.SortFunc(vs, cmp.Compare[float64])
	n := float64(len(vs))
	for i, v := range vs {
		if i+1 < len(vs) && vs[i+1] == v {
			continue // the last of equal values carries their fraction
		}
		s.X = append(s.X, v)
		s.Y = append(s.Y, float64(i+1)/n)
	}
	if len(s.X) > maxCDFPoints {
		x, y := make([]float64, maxCDFPoints), make([]float64, maxCDFPoints)
		last := len(s.X) - 1
		for i := range maxCDFPoints {
			j := int(math.Round(float64(i) * float64(last) / float64(maxCDFPoints-1)))
			x[i], y[i] = s.X[j], s.Y[j]
		}
		s.X, s.Y = x, y
	}
	return s
}
