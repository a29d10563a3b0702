package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
)

// TestSteadySampled runs a short sampled steady run with a prioritized
// backlog on a DoneAt table that is pruned, on every database: every
// steady message and every backlog row is handled, the samples cover the
// run, the pruning removed done rows, and the backlog drained.
func TestSteadySampled(t *testing.T) {
	for _, tg := range targets(t) {
		t.Run(tg.name, func(t *testing.T) {
			const rate, backlog = 400, 2000
			r, err := Run(context.Background(), Config{Driver: tg.driver, DSN: tg.dsn, Dialect: tg.dialect,
				Form: sqlxbroker.Lease, Mode: Steady, Rate: rate, Duration: 3 * time.Second, Concurrency: 16,
				Interval: 500 * time.Millisecond, Backlog: backlog, Prioritized: true, DoneAt: true,
				PruneEvery: 300 * time.Millisecond, PruneAge: time.Millisecond, CommitDuration: -1,
				Table: "sxb_steady_go", Label: "steady test"})
			if err != nil {
				t.Fatal(err)
			}
			if r.Deliveries != int64(r.Rows) || r.Rows < rate*3-rate/10 {
				t.Errorf("handled %d of %d steady messages, want all of about %d", r.Deliveries, r.Rows, rate*3)
			}
			if r.BacklogRows != backlog || r.BacklogDrained <= 0 {
				t.Errorf("backlog %d rows drained at %.2f s, want %d drained", r.BacklogRows, r.BacklogDrained, backlog)
			}
			if len(r.Samples) < 5 {
				t.Fatalf("%d samples, want at least 5 over 3 s at 500 ms", len(r.Samples))
			}
			var delivered int64
			for i, s := range r.Samples {
				delivered += s.Delivered
				if s.RSSMB <= 0 || s.HeapMB <= 0 {
					t.Errorf("sample %d: rss %.1f heap %.1f MB, want both read", i, s.RSSMB, s.HeapMB)
				}
				if tg.name != "sqlite" && (s.TableMB <= 0 || s.LiveRows < 0 || s.DeadRows < 0) {
					t.Errorf("sample %d: table %.2f MB, live %d, dead %d: want the server's figures", i, s.TableMB, s.LiveRows, s.DeadRows)
				}
			}
			if delivered > r.Deliveries {
				t.Errorf("samples count %d deliveries, the run %d", delivered, r.Deliveries)
			}
			if r.Pruned == 0 {
				t.Error("nothing pruned")
			}
			// (SQLite has no wake-ups between pools: its subscription polls,
			// so a window may see no delivery.)
			if r.First == nil || r.Last == nil || r.Last.From < r.First.To || r.First.PerSecond+r.Last.PerSecond <= 0 {
				t.Errorf("windows %+v and %+v: want two disjoint windows with deliveries", r.First, r.Last)
			}
			var svg bytes.Buffer
			if err := WriteTimeSVG(&svg, "steady", []Result{*r}); err != nil || !strings.Contains(svg.String(), "steady test") {
				t.Errorf("WriteTimeSVG: %v, %d bytes without the run's label", err, svg.Len())
			}
		})
	}
}

// TestWindows checks the first and last windows of synthetic samples: five
// minutes each of a 30-minute run, their rates and quantiles from the
// histogram snapshots between them.
func TestWindows(t *testing.T) {
	var h hist
	var samples []Sample
	snaps := []*[nBuckets]int64{h.snapshot()}
	for i := 1; i <= 180; i++ { // 10 s samples
		d := time.Millisecond
		if i > 150 {
			d = 4 * time.Millisecond // the last five minutes are slower
		}
		for range 100 {
			h.Record(d)
		}
		samples = append(samples, Sample{At: float64(i * 10), Delivered: 1000, DeadRows: int64(i)})
		snaps = append(snaps, h.snapshot())
	}
	f, l := windows(samples, snaps, 1800)
	if f.From != 0 || f.To != 300 || l.From != 1500 || l.To != 1800 {
		t.Fatalf("windows %v-%v and %v-%v, want 0-300 and 1500-1800", f.From, f.To, l.From, l.To)
	}
	if f.PerSecond != 100 || l.PerSecond != 100 {
		t.Errorf("rates %v and %v, want 100", f.PerSecond, l.PerSecond)
	}
	if f.P99Ms < 0.98 || f.P99Ms > 1.03 || l.P99Ms < 3.9 || l.P99Ms > 4.1 {
		t.Errorf("p99 %v and %v ms, want about 1 and 4", f.P99Ms, l.P99Ms)
	}
	if f.DeadRows != 30 || l.DeadRows != 180 {
		t.Errorf("dead rows %d and %d, want 30 and 180", f.DeadRows, l.DeadRows)
	}
	if f, l := windows(nil, snaps[:1], 10); f != nil || l != nil {
		t.Error("windows of no samples")
	}
}

// TestSteadyRefuses: the steady mode's options are refused where they
// make no sense, naming them.
func TestSteadyRefuses(t *testing.T) {
	for _, c := range []Config{
		{Mode: Drain, Interval: time.Second},
		{Mode: Steady, PruneEvery: time.Second},
		{Mode: Steady, Backlog: -1},
	} {
		c.Driver, c.DSN = "sqlite", "file:x"
		if err := c.defaults(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}
