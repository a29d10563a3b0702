package bench

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	"github.com/sqlxbroker/sqlxbroker/core"
	_ "github.com/sqlxbroker/sqlxbroker/dialects/mysql"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
	"github.com/sqlxbroker/sqlxbroker/forms"
)

// target is a database the benchmarks run on.
type target struct {
	name, driver, dsn string
	dialect           core.Dialect
}

// targets returns SQLite (a temporary file) and the servers whose DSNs
// the environment gives (provision's rules: a skip that names the variable,
// a failure under SQLXBROKER_REQUIRE_DB=1).
func targets(tb testing.TB) []target {
	out := []target{{name: "sqlite", driver: "sqlite", dsn: sqlite.DSN(filepath.Join(tb.TempDir(), "bench.db"))}}
	if os.Getenv(provision.Postgres.Env) != "" || os.Getenv(provision.Require) == "1" {
		dsn := provision.Postgres.Get(tb)
		out = append(out, target{name: "postgres", driver: "postgres", dsn: dsn, dialect: postgres.Dialect{ListenDSN: dsn}})
	}
	if os.Getenv(provision.MariaDB.Env) != "" || os.Getenv(provision.Require) == "1" {
		out = append(out, target{name: "mysql", driver: "mysql", dsn: provision.MariaDB.Get(tb)})
	}
	return out
}

func TestHistQuantiles(t *testing.T) {
	var h hist
	if h.Quantile(0.5) != 0 {
		t.Fatal("empty histogram: want 0")
	}
	// 1..1000 ms, shuffled: the q-quantile is q*1000 ms.
	ms := rand.Perm(1000)
	for _, v := range ms {
		h.Record(time.Duration(v+1) * time.Millisecond)
	}
	for _, q := range []float64{0.5, 0.9, 0.99, 1} {
		want := time.Duration(q*1000) * time.Millisecond
		got := h.Quantile(q)
		if got < want || float64(got) > float64(want)*growth*1.0001 {
			t.Errorf("q%.2f = %v, want %v within 2%%", q, got, want)
		}
	}
	if h.Count() != 1000 {
		t.Errorf("count %d, want 1000", h.Count())
	}
}

func TestWriteSVG(t *testing.T) {
	var b strings.Builder
	rs := []Result{
		{Dialect: "PostgreSQL", Form: "lease", Concurrency: 8, PerSecond: 4000, CommitsPerSec: 2500},
		{Dialect: "PostgreSQL", Form: "lease", Concurrency: 64, PerSecond: 30000, CommitsPerSec: 5000},
		{Dialect: "PostgreSQL", Form: "row-lock", Concurrency: 8, PerSecond: 2300, CommitsPerSec: 2500},
	}
	if err := WriteSVG(&b, "a <sweep>", rs); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	for _, want := range []string{"<svg", "PostgreSQL lease", "PostgreSQL row-lock", "PostgreSQL lease: raw commits/s", "a &lt;sweep&gt;", "</svg>"} {
		if !strings.Contains(svg, want) {
			t.Errorf("the chart lacks %q", want)
		}
	}
	if strings.Count(svg, "<polyline") != 4 {
		t.Errorf("%d lines, want 4 (two forms, and the commit rate of each)", strings.Count(svg, "<polyline"))
	}
	if err := WriteSVG(&b, "empty", nil); err == nil {
		t.Error("an empty sweep drew a chart")
	}
}

// TestDrain drains a small backlog in every form of every database: every
// row is delivered once, and a lease subscription keeps to its connection
// budget however many handlers run.
func TestDrain(t *testing.T) {
	for _, tg := range targets(t) {
		for _, f := range formsOf(tg) {
			t.Run(tg.name+"/"+f.String(), func(t *testing.T) {
				k := 50
				r, err := Run(context.Background(), Config{Driver: tg.driver, DSN: tg.dsn, Dialect: tg.dialect, Form: f,
					Rows: 2000, Concurrency: k, Keys: 100, CommitDuration: -1, Table: "sxb_bench_test"})
				if err != nil {
					t.Fatal(err)
				}
				if r.Deliveries != 2000 || r.Errors != 0 {
					t.Errorf("delivered %d of 2000 with %d errors", r.Deliveries, r.Errors)
				}
				if r.PerSecond <= 0 || r.P99Ms < r.P50Ms || r.PeakRSSMB <= 0 {
					t.Errorf("implausible result %+v", r)
				}
				if f == sqlxbroker.Lease && r.PeakConns > forms.LeaseConnections {
					t.Errorf("lease form with %d handlers opened %d connections, want at most %d", k, r.PeakConns, forms.LeaseConnections)
				}
				if f == sqlxbroker.Advisory && r.PeakConns > forms.AdvisoryConnections {
					t.Errorf("advisory form with %d handlers opened %d connections, want at most %d", k, r.PeakConns, forms.AdvisoryConnections)
				}
				t.Logf("%.0f deliveries/s, p50 %.2f ms, p99 %.2f ms, %d connections", r.PerSecond, r.P50Ms, r.P99Ms, r.PeakConns)
			})
		}
	}
}

func formsOf(tg target) []sqlxbroker.Form {
	d := tg.dialect
	if d == nil {
		c := Config{Driver: tg.driver, DSN: tg.dsn}
		if err := c.defaults(); err != nil {
			return nil
		}
		d = c.Dialect
	}
	return core.FormsOf(d)
}

// BenchmarkDrain drains b.N rows with 64 no-op handlers, for every form of
// every database; ns/op is the drain's time per delivery, the fill left
// out.
func BenchmarkDrain(b *testing.B) {
	for _, tg := range targets(b) {
		for _, f := range formsOf(tg) {
			b.Run(tg.name+"/"+f.String(), func(b *testing.B) {
				r, err := Run(context.Background(), Config{Driver: tg.driver, DSN: tg.dsn, Dialect: tg.dialect, Form: f,
					Rows: b.N, Concurrency: 64, CommitDuration: -1, Table: "sxb_bench_go"})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(r.Seconds*1e9/float64(r.Deliveries), "ns/op")
				b.ReportMetric(r.PerSecond, "deliveries/s")
				b.ReportMetric(r.P99Ms, "p99-ms")
				b.ReportMetric(float64(r.PeakConns), "conns")
			})
		}
	}
}

// TestRowLockFloor drains a table with the row-lock form's statements alone
// on every database that offers the form: every row is deleted once (the
// floor counts them and fails otherwise) and its table is dropped; a run
// with Floor reports the floor beside the drain. A dialect without the
// form is refused by name.
func TestRowLockFloor(t *testing.T) {
	for _, tg := range targets(t) {
		t.Run(tg.name, func(t *testing.T) {
			c := Config{Driver: tg.driver, DSN: tg.dsn, Dialect: tg.dialect, Form: sqlxbroker.RowLock,
				Rows: 3000, Concurrency: 4, Table: "sxb_floor_test"}
			offered := false
			for _, f := range formsOf(tg) {
				offered = offered || f == sqlxbroker.RowLock
			}
			if !offered {
				c.Form = sqlxbroker.Lease
				if err := c.defaults(); err != nil {
					t.Fatal(err)
				}
				db, err := open(c)
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				_, _, err = RowLockFloor(context.Background(), c, db, 4)
				var fe *sqlxbroker.FormError
				if !errors.As(err, &fe) || fe.Form != sqlxbroker.RowLock {
					t.Fatalf("floor on a dialect without the row lock: %v, want a FormError naming it", err)
				}
				return
			}
			r, err := Run(context.Background(), Config{Driver: tg.driver, DSN: tg.dsn, Dialect: tg.dialect, Form: sqlxbroker.RowLock,
				Rows: 3000, Concurrency: 4, CommitDuration: 200 * time.Millisecond, Table: "sxb_floor_test", Floor: true})
			if err != nil {
				t.Fatal(err)
			}
			if r.FloorPerSec <= 0 || r.FloorRatio <= 0 || r.OfFloor != r.PerSecond/r.FloorPerSec {
				t.Errorf("floor %.0f/s, %.2f of commits, broker %.2f of it: want all set", r.FloorPerSec, r.FloorRatio, r.OfFloor)
			}
			db, err := open(Config{Driver: tg.driver, DSN: tg.dsn, Concurrency: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var n int
			if err := db.QueryRow("SELECT count(*) FROM sxb_floor_test_floor").Scan(&n); err == nil {
				t.Errorf("the floor's table is still there, with %d rows", n)
			}
			t.Logf("drain %.0f/s, floor %.0f/s (%.2f of %.0f commits/s), the broker %.2f of the floor",
				r.PerSecond, r.FloorPerSec, r.FloorRatio, r.CommitsPerSec, r.OfFloor)
		})
	}
}

// TestFormFloors drains tables with the lease and advisory forms' own
// statements on every database that offers them: every row is deleted
// once (each floor counts them and fails otherwise), the floor keeps to
// its connections (two claim loops; the advisory form's key session on
// top), its table is dropped, and a run with Floor reports it beside the
// drain.
func TestFormFloors(t *testing.T) {
	for _, tg := range targets(t) {
		for _, f := range formsOf(tg) {
			if f == sqlxbroker.RowLock {
				continue // TestRowLockFloor
			}
			t.Run(tg.name+"/"+f.String(), func(t *testing.T) {
				r, err := Run(context.Background(), Config{Driver: tg.driver, DSN: tg.dsn, Dialect: tg.dialect, Form: f,
					Rows: 1500, Concurrency: 40, Keys: 500, CommitDuration: -1, Table: "sxb_ffloor_test", Floor: true})
				if err != nil {
					t.Fatal(err)
				}
				if r.FloorPerSec <= 0 || r.OfFloor != r.PerSecond/r.FloorPerSec {
					t.Errorf("floor %.0f/s, broker %.2f of it: want both set", r.FloorPerSec, r.OfFloor)
				}
				want := floorLoops
				if f == sqlxbroker.Advisory {
					want++
				}
				if r.FloorConns != want {
					t.Errorf("the floor ran on %d connections, want %d", r.FloorConns, want)
				}
				db, err := open(Config{Driver: tg.driver, DSN: tg.dsn, Concurrency: 1})
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				var n int
				if err := db.QueryRow("SELECT count(*) FROM sxb_ffloor_test_floor").Scan(&n); err == nil {
					t.Errorf("the floor's table is still there, with %d rows", n)
				}
				t.Logf("drain %.0f/s, floor %.0f/s on %d connections, the broker %.2f of the floor", r.PerSecond, r.FloorPerSec, r.FloorConns, r.OfFloor)
			})
		}
	}
}

// TestFloorClaimSize: the floors claim half a batch, as the engine does
// once half a batch of handlers is free.
func TestFloorClaimSize(t *testing.T) {
	for _, c := range []struct{ k, batch, want int }{{1, 0, 1}, {2, 0, 1}, {64, 0, 32}, {1000, 0, 500}, {1000, 100, 50}, {8, 100, 4}} {
		if got := floorClaimSize(Config{Concurrency: c.k, BatchSize: c.batch}); got != c.want {
			t.Errorf("concurrency %d, batch %d: claims of %d, want %d", c.k, c.batch, got, c.want)
		}
	}
}
