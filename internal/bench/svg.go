package bench

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
)

// WriteSVG draws a sweep as a line chart: deliveries per second (log scale)
// over concurrency (log scale), one line per dialect and form, and dashed in
// the same colour the raw commit rate its runs measured (over as many
// connections as each run used).
func WriteSVG(w io.Writer, title string, results []Result) error {
	const (
		width, height = 930, 500
		left, right   = 80, 300
		top, bottom   = 50, 60
	)
	plotW, plotH := float64(width-left-right), float64(height-top-bottom)
	type series struct {
		name   string
		dashed bool
		color  int
		pts    [][2]float64 // concurrency, per second
	}
	byName := map[string]*series{}
	var order []string
	colorOf := map[string]int{} // dialect and form: colour index
	add := func(name, group string, dashed bool, x, y float64) {
		if y <= 0 || x <= 0 {
			return
		}
		s := byName[name]
		if s == nil {
			if _, ok := colorOf[group]; !ok {
				colorOf[group] = len(colorOf)
			}
			s = &series{name: name, dashed: dashed, color: colorOf[group]}
			byName[name] = s
			order = append(order, name)
		}
		s.pts = append(s.pts, [2]float64{x, y})
	}
	minX, maxX, minY, maxY := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, r := range results {
		x := float64(r.Concurrency)
		group := r.Dialect + " " + r.Form
		add(group, group, false, x, r.PerSecond)
		add(group+": raw commits/s", group, true, x, r.CommitsPerSec)
		for _, y := range []float64{r.PerSecond, r.CommitsPerSec} {
			if y > 0 {
				minY, maxY = math.Min(minY, y), math.Max(maxY, y)
			}
		}
		minX, maxX = math.Min(minX, x), math.Max(maxX, x)
	}
	if len(order) == 0 {
		return fmt.Errorf("bench: nothing to draw")
	}
	// Decades that enclose the data.
	lo, hi := math.Floor(math.Log10(minY)), math.Ceil(math.Log10(maxY))
	if hi == lo {
		hi++
	}
	xlo, xhi := math.Log2(minX), math.Log2(maxX)
	if xhi == xlo {
		xhi++
	}
	px := func(x float64) float64 { return float64(left) + (math.Log2(x)-xlo)/(xhi-xlo)*plotW }
	py := func(y float64) float64 { return float64(top) + plotH - (math.Log10(y)-lo)/(hi-lo)*plotH }

	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="28" font-size="15">%s</text>`+"\n", left, escape(title))
	for e := lo; e <= hi; e++ {
		y := py(math.Pow(10, e))
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, float64(left)+plotW, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, human(math.Pow(10, e)))
	}
	var xs []float64
	seen := map[float64]bool{}
	for _, r := range results {
		if x := float64(r.Concurrency); !seen[x] {
			seen[x] = true
			xs = append(xs, x)
		}
	}
	sort.Float64s(xs)
	for _, x := range xs {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", px(x), top, px(x), float64(top)+plotH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%g</text>`+"\n", px(x), float64(top)+plotH+18, x)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">concurrency (handlers; log scale)</text>`+"\n", float64(left)+plotW/2, height-14)
	fmt.Fprintf(&b, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">per second (log scale)</text>`+"\n", float64(top)+plotH/2)
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#444"/>`+"\n", left, top, plotW, plotH)
	for i, name := range order {
		s := byName[name]
		sort.Slice(s.pts, func(a, c int) bool { return s.pts[a][0] < s.pts[c][0] })
		col := colors[s.color%len(colors)]
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="5 4"`
		}
		var path []string
		for _, p := range s.pts {
			path = append(path, fmt.Sprintf("%.1f,%.1f", px(p[0]), py(p[1])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", col, dash, strings.Join(path, " "))
		for _, p := range s.pts {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", px(p[0]), py(p[1]), col)
		}
		ly := top + 10 + i*18
		lx := width - right + 16
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", lx, ly, lx+24, ly, col, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", lx+30, ly+4, escape(name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func human(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	}
	return fmt.Sprintf("%g", v)
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
