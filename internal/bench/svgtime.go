package bench

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// WriteTimeSVG draws steady runs sampled over time (Result.Samples) as
// panels one above the other, sharing the time axis (minutes): deliveries
// per second, p99 publish-to-handler latency, the table's dead rows and
// size, and the process's resident set; one line per run, named by its
// Label (else its dialect and form).
func WriteTimeSVG(w io.Writer, title string, results []Result) error {
	var runs []Result
	for _, r := range results {
		if len(r.Samples) > 0 {
			runs = append(runs, r)
		}
	}
	if len(runs) == 0 {
		return fmt.Errorf("bench: no sampled steady runs to draw (--mode steady --interval)")
	}
	panels := []struct {
		name string
		get  func(Sample) float64
	}{
		{"deliveries/s", func(s Sample) float64 { return s.PerSecond }},
		{"p99 publish-to-handler, ms", func(s Sample) float64 { return s.P99Ms }},
		{"dead rows (PostgreSQL n_dead_tup; MariaDB history list)", func(s Sample) float64 { return float64(s.DeadRows) }},
		{"table size, MB", func(s Sample) float64 { return s.TableMB }},
		{"process RSS, MB", func(s Sample) float64 { return s.RSSMB }},
	}
	const (
		width, panelH, gap = 1130, 150, 40
		left, right, top   = 80, 450, 50
	)
	height := top + len(panels)*(panelH+gap) + 20
	plotW := float64(width - left - right)
	maxT := 0.0
	for _, r := range runs {
		maxT = math.Max(maxT, r.Samples[len(r.Samples)-1].At/60)
	}
	if maxT == 0 {
		maxT = 1
	}
	px := func(t float64) float64 { return float64(left) + t/maxT*plotW }
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="28" font-size="15">%s</text>`+"\n", left, escape(title))
	for i, r := range runs {
		name := r.Label
		if name == "" {
			name = r.Dialect + " " + r.Form
		}
		ly := top + 10 + i*18
		lx := width - right + 16
		col := colors[i%len(colors)]
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>`+"\n", lx, ly, lx+24, ly, col)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", lx+30, ly+4, escape(name))
	}
	for k, p := range panels {
		y0 := float64(top + k*(panelH+gap))
		maxY := 0.0
		for _, r := range runs {
			for _, s := range r.Samples {
				maxY = math.Max(maxY, p.get(s))
			}
		}
		if maxY <= 0 {
			maxY = 1
		}
		maxY = niceCeil(maxY)
		py := func(v float64) float64 { return y0 + panelH - math.Max(v, 0)/maxY*panelH }
		fmt.Fprintf(&b, `<text x="%d" y="%.1f">%s</text>`+"\n", left, y0-6, escape(p.name))
		for _, f := range []float64{0, 0.5, 1} {
			y := py(f * maxY)
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, float64(left)+plotW, y)
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, human(f*maxY))
		}
		fmt.Fprintf(&b, `<rect x="%d" y="%.1f" width="%.0f" height="%d" fill="none" stroke="#444"/>`+"\n", left, y0, plotW, panelH)
		step := tickStep(maxT)
		for i := 0; float64(i)*step <= maxT+1e-9; i++ {
			t := float64(i) * step
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", px(t), y0+panelH+14, strconv.FormatFloat(t, 'g', 4, 64))
		}
		for i, r := range runs {
			var pts []string
			for _, s := range r.Samples {
				if v := p.get(s); v >= 0 {
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.At/60), py(v)))
				}
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", colors[i%len(colors)], strings.Join(pts, " "))
		}
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">minutes</text>`+"\n", float64(left)+plotW/2, height-6)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*e {
			return m * e
		}
	}
	return 10 * e
}

// tickStep is the time axis's step in minutes: about ten ticks.
func tickStep(maxT float64) float64 { return math.Max(niceCeil(maxT/10), 1.0/60) }
