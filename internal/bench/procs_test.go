package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
)

// TestMain makes the test binary a RunProcs worker when WorkerEnv is set.
func TestMain(m *testing.M) {
	if os.Getenv(WorkerEnv) != "" {
		c, index, err := WorkerConfig()
		if err == nil {
			if c.Driver == "postgres" {
				c.Dialect = postgres.Dialect{ListenDSN: c.DSN}
			}
			err = Worker(context.Background(), c, index, os.Stdin, os.Stdout)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestRunProcs drains one table with three worker processes in every form
// of every database: the deliveries add up to the rows, each process took
// some of them, the aggregate spans every process's part, and the
// contention the database shows was read (PostgreSQL: activity samples
// and index reads; MariaDB: the server's counters and its threads
// running).
func TestRunProcs(t *testing.T) {
	self := func() *exec.Cmd { return exec.Command(os.Args[0], "-test.run=^$") }
	for _, tg := range targets(t) {
		for _, f := range formsOf(tg) {
			t.Run(tg.name+"/"+f.String(), func(t *testing.T) {
				rows, procs := 1000, 3
				if tg.name == "sqlite" {
					// SQLite drains 1,000 rows in a few dozen
					// milliseconds, less than a process may start late
					// on a loaded machine; each process must take part.
					rows = 20000
				}
				r, err := RunProcs(context.Background(), Config{Driver: tg.driver, DSN: tg.dsn, Dialect: tg.dialect, Form: f,
					Rows: rows, Concurrency: 8, Keys: 100, Table: "sxb_procs_test"}, procs, self)
				if tg.name == "sqlite" && f == sqlxbroker.Advisory {
					// SQLite's advisory keys live in one process per file.
					if err == nil || !strings.Contains(err.Error(), "one process") {
						t.Fatalf("advisory on one SQLite file from %d processes: %v, want the refusal", procs, err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if r.Deliveries != int64(rows) || r.Errors != 0 || len(r.PerProcess) != procs {
					t.Fatalf("delivered %d of %d with %d errors by %d processes", r.Deliveries, rows, r.Errors, len(r.PerProcess))
				}
				var sum int64
				pids := map[int]bool{os.Getpid(): true}
				for _, p := range r.PerProcess {
					sum += p.Deliveries
					if pids[p.Pid] {
						t.Errorf("process %d: pid %d is not a process of its own", p.Index, p.Pid)
					}
					pids[p.Pid] = true
					if p.Deliveries == 0 || p.LastNS <= p.BeginNS || p.PeakConns == 0 {
						t.Errorf("process %d: %+v", p.Index, p)
					}
					if span := float64(p.LastNS-p.BeginNS) / 1e9; span > r.Seconds+1e-9 {
						t.Errorf("process %d ran %.3fs, longer than the aggregate %.3fs", p.Index, span, r.Seconds)
					}
				}
				if sum != int64(rows) || r.PerSecond <= 0 {
					t.Errorf("per-process deliveries add up to %d, want %d; %.0f/s", sum, rows, r.PerSecond)
				}
				co := r.Contention
				switch tg.name {
				case "postgres":
					if co.Samples == 0 || co.IndexReadPerDelivery < 1 {
						t.Errorf("PostgreSQL contention not read: %+v", co)
					}
				case "mysql":
					if !co.ServerCountersChecked || co.ReadKeyPerDelivery <= 0 || co.PageReadsPerDelivery < 1 ||
						co.ThreadSamples == 0 || strings.Contains(r.Server, "MariaDB") && co.ThreadHandling == "" {
						t.Errorf("MariaDB counters not read: %+v", co)
					}
				}
				db, err := open(Config{Driver: tg.driver, DSN: tg.dsn, Concurrency: 1})
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				var n int
				if err := db.QueryRow("SELECT count(*) FROM sxb_procs_test").Scan(&n); err == nil {
					t.Errorf("the table is still there, with %d rows", n)
				}
				t.Logf("%.0f deliveries/s over %d processes; contention %+v", r.PerSecond, procs, co)
			})
		}
	}
}

// TestRunProcsRefuses: bad input is refused by name before any process
// starts.
func TestRunProcsRefuses(t *testing.T) {
	never := func() *exec.Cmd { t.Fatal("a worker was started"); return nil }
	c := Config{Driver: "sqlite", DSN: "file:" + t.TempDir() + "/x.db", Form: sqlxbroker.Lease}
	if _, err := RunProcs(context.Background(), c, 0, never); err == nil {
		t.Error("0 processes: no error")
	}
	c.Mode = Steady
	if _, err := RunProcs(context.Background(), c, 2, never); err == nil {
		t.Error("steady mode: no error")
	}
}

// TestRunProcsApart: with Apart each worker process drains a table of its
// own, so each delivers exactly its table's share of the rows, the
// database's counters cover every table, and every table is dropped.
func TestRunProcsApart(t *testing.T) {
	self := func() *exec.Cmd { return exec.Command(os.Args[0], "-test.run=^$") }
	for _, tg := range targets(t) {
		for _, f := range []sqlxbroker.Form{sqlxbroker.Lease, sqlxbroker.Advisory} {
			if tg.name == "sqlite" && f == sqlxbroker.Advisory {
				continue // SQLite's advisory keys live in one process per file
			}
			t.Run(tg.name+"/"+f.String(), func(t *testing.T) { testRunProcsApart(t, tg, f, self) })
		}
	}
}

func testRunProcsApart(t *testing.T, tg target, f sqlxbroker.Form, self func() *exec.Cmd) {
	const rows, procs = 1000, 3
	r, err := RunProcs(context.Background(), Config{Driver: tg.driver, DSN: tg.dsn, Dialect: tg.dialect, Form: f,
		Rows: rows, Concurrency: 8, Keys: 100, Table: "sxb_apart_test", Apart: true}, procs, self)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Apart || r.Deliveries != rows || r.Errors != 0 || len(r.PerProcess) != procs {
		t.Fatalf("apart %v: delivered %d of %d with %d errors by %d processes", r.Apart, r.Deliveries, rows, r.Errors, len(r.PerProcess))
	}
	for _, p := range r.PerProcess {
		if want := int64(procRows(rows, procs, p.Index)); p.Deliveries != want {
			t.Errorf("process %d delivered %d, want its table's %d", p.Index, p.Deliveries, want)
		}
	}
	if tg.name == "postgres" && r.Contention.IndexReadPerDelivery < 1 {
		t.Errorf("PostgreSQL index reads not summed over the tables: %+v", r.Contention)
	}
	db, err := open(Config{Driver: tg.driver, DSN: tg.dsn, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, name := range procTables(Config{Table: "sxb_apart_test", Apart: true}, procs) {
		var n int
		if err := db.QueryRow("SELECT count(*) FROM " + name).Scan(&n); err == nil {
			t.Errorf("table %s is still there, with %d rows", name, n)
		}
	}
}
