package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
	"github.com/sqlxbroker/sqlxbroker/forms"
)

// TestSoak runs short soaks with faults and fails on any audit violation.
// By default (not -short) it runs one on an SQLite file: two workers, a
// few SIGKILLs, about 15 seconds. SQLXBROKER_SOAK=1 adds PostgreSQL
// (SQLXBROKER_POSTGRES_DSN; the soak's sessions are told apart by
// application_name and terminated at random) and MySQL/MariaDB
// (SQLXBROKER_MYSQL_DSN; the soak runs in a database of its own, created and
// dropped, whose sessions are killed at random). SQLXBROKER_SOAK_DURATION
// sets the fault phase of those (default 30s). The test never restarts a
// server: `sqlxbroker soak --restart-cmd` on servers of the soak's own
// does (scripts/soak.sh).
//
// The workers are this test binary again: with SQLXBROKER_SOAK_WORKER set,
// TestSoak runs worker mode instead.
func TestSoak(t *testing.T) {
	if os.Getenv(workerEnv) != "" {
		if err := soakWorker(); err != nil {
			fmt.Fprintln(os.Stderr, "soak worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if testing.Short() {
		t.Skip("the soak takes about 15 seconds; run without -short")
	}
	t.Run("sqlite", func(t *testing.T) {
		c := testSoakConfig(t, "sqlite", filepath.Join(t.TempDir(), "soak.db"))
		c.Duration, c.Workers, c.KillEvery = 8*time.Second, 2, 2*time.Second
		rep := runTestSoak(t, c)
		if rep.Faults.Kills < 1 {
			t.Errorf("%d worker kills in %v, want at least 1", rep.Faults.Kills, c.Duration)
		}
	})
	t.Run("sqlite-forms", func(t *testing.T) {
		// --forms: only the lease form's tables are soaked.
		c := testSoakConfig(t, "sqlite", filepath.Join(t.TempDir(), "soak.db"))
		c.Duration, c.Workers, c.KillEvery, c.Forms = 3*time.Second, 1, 0, []sqlxbroker.Form{sqlxbroker.Lease}
		rep := runTestSoak(t, c)
		var got []string
		for _, f := range rep.Forms {
			got = append(got, f.Form)
		}
		if want := []string{"lease", "lease-delete"}; !slices.Equal(got, want) {
			t.Errorf("soaked %v, want %v", got, want)
		}
	})
	if os.Getenv("SQLXBROKER_SOAK") != "1" {
		return
	}
	dur := 30 * time.Second
	if s := os.Getenv("SQLXBROKER_SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("SQLXBROKER_SOAK_DURATION: %v", err)
		}
		dur = d
	}
	t.Run("postgres", func(t *testing.T) {
		dsn := os.Getenv("SQLXBROKER_POSTGRES_DSN")
		if dsn == "" {
			t.Fatal("SQLXBROKER_SOAK=1 needs SQLXBROKER_POSTGRES_DSN")
		}
		c := testSoakConfig(t, "postgres", dsn)
		c.Duration, c.SessionKillEvery, c.NetFaultEvery = dur, dur/4, dur/4
		rep := runTestSoak(t, c)
		if rep.Faults.SessionsKilled < 1 {
			t.Errorf("no session terminated in %v", dur)
		}
		if rep.Faults.NetStalls+rep.Faults.NetCuts < 1 {
			t.Errorf("no network fault in %v", dur)
		}
	})
	t.Run("mysql", func(t *testing.T) {
		dsn := os.Getenv("SQLXBROKER_MYSQL_DSN")
		if dsn == "" {
			t.Fatal("SQLXBROKER_SOAK=1 needs SQLXBROKER_MYSQL_DSN")
		}
		own, drop, err := soakDatabase(context.Background(), dsn, "sqlxbroker_soak_"+randHex(4))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(drop)
		c := testSoakConfig(t, "mysql", own)
		c.Duration, c.SessionKillEvery, c.NetFaultEvery = dur, dur/4, dur/4
		rep := runTestSoak(t, c)
		if rep.Faults.SessionsKilled < 1 {
			t.Errorf("no session terminated in %v", dur)
		}
		if rep.Faults.NetStalls+rep.Faults.NetCuts < 1 {
			t.Errorf("no network fault in %v", dur)
		}
	})
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// testSoakConfig is a small soak: tables of its own, dropped afterwards.
func testSoakConfig(t *testing.T, driver, dsn string) soakConfig {
	return soakConfig{
		Driver: driver, DSN: dsn, Duration: 10 * time.Second, Workers: 3, Concurrency: 4, Rate: 10,
		Lease: 2 * time.Second, MaxAttempts: 3, FailPct: 10, SlowPct: 10, PoisonPct: 2,
		KillEvery: 3 * time.Second, Calm: 60 * time.Second, DrainTimeout: 90 * time.Second,
		Prefix: "soak_" + randHex(4), LogDir: t.TempDir(),
		WorkerArgs: []string{"-test.run=^TestSoak$", "-test.count=1"}, Out: testWriter{t},
	}
}

// runTestSoak runs c and fails the test on any violation or an audit that
// does not add up.
func runTestSoak(t *testing.T, c soakConfig) *soakReport {
	t.Helper()
	rep, err := runSoak(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	rep.print(&b)
	t.Log(b.String())
	for _, v := range rep.Violations {
		t.Errorf("violation: %s", v)
	}
	if len(rep.Violations) > 0 {
		for _, w := range []string{"worker-0.log", "worker-1.log", "worker-2.log"} {
			if s, err := os.ReadFile(filepath.Join(rep.LogDir, w)); err == nil {
				t.Logf("%s:\n%s", w, s)
			}
		}
	}
	tot := rep.Total
	if tot.Published == 0 || tot.Completed == 0 {
		t.Errorf("published %d, completed %d: the soak did no work", tot.Published, tot.Completed)
	}
	if tot.Completed+tot.Dead != tot.Published {
		t.Errorf("completed %d + dead %d != published %d", tot.Completed, tot.Dead, tot.Published)
	}
	if db, err := openSoakDB(c.Driver, c.DSN); err == nil {
		dropSoakTables(context.Background(), db, c, formsOfDriver(t, c.Driver))
		db.Close()
	}
	return rep
}

func formsOfDriver(t *testing.T, driver string) []soakVariant {
	d, err := sqlxbroker.Lookup(driver)
	if err != nil {
		t.Fatal(err)
	}
	return soakVariants(core.FormsOf(d))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestSoakAudit plants each kind of violation in real tables (SQLite) and
// checks the audit finds it, and finds nothing in clean messages.
func TestSoakAudit(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	b, err := sqlxbroker.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	c := soakConfig{Driver: "sqlite", Prefix: "audit", Lease: time.Second, MaxAttempts: 3}
	lease := soakVariant{Name: "lease", Form: sqlxbroker.Lease}
	if err := createSoakTables(ctx, b, c, []soakVariant{lease}); err != nil {
		t.Fatal(err)
	}
	tb := soakTable(c.Prefix, lease, c.Lease, c.MaxAttempts)
	p, err := b.Plan(tb)
	if err != nil {
		t.Fatal(err)
	}
	pub, runs, _, outc := ledgers(c.Prefix)
	now := p.Time(time.Now())
	// message: row state ("done", "dead", "pending", "" for no row),
	// published, ok runs, outcome records (rec ids).
	type plant struct {
		state     string
		published bool
		okRuns    int
		recs      []string
	}
	plants := map[string]plant{
		"clean":        {"done", true, 1, []string{"r1"}},
		"clean-dead":   {"dead", true, 0, []string{"r2"}},
		"retried-rec":  {"done", true, 1, []string{"r3", "r3"}},
		"unrecorded":   {"done", true, 1, nil},
		"extra":        {"done", true, 3, []string{"r4"}},
		"lost-no-row":  {"", true, 0, nil},
		"lost-no-run":  {"done", true, 0, []string{"r5"}},
		"twice":        {"done", true, 2, []string{"r6", "r7"}},
		"pending":      {"pending", true, 0, nil},
		"phantom":      {"done", false, 1, []string{"r8"}},
		"dead-success": {"dead", true, 0, []string{"r9"}},
	}
	for m, pl := range plants {
		tx := db.MustBegin()
		if pl.state != "" {
			row := map[string]any{"msg": m, "account": "a", "poison": 0}
			switch pl.state {
			case "done":
				row["done_at"] = now
			case "dead":
				row["dead_at"] = now
			}
			if err := b.Publish(ctx, tx, tb, row); err != nil {
				t.Fatal(err)
			}
		}
		if pl.published {
			tx.MustExec("INSERT INTO "+pub+" (msg, form) VALUES (?, ?)", m, "lease")
		}
		for range pl.okRuns {
			tx.MustExec("INSERT INTO "+runs+" (form, msg, worker, pid, attempt, ok) VALUES ('lease', ?, 0, 0, 1, 1)", m)
		}
		tx.MustExec("INSERT INTO "+runs+" (form, msg, worker, pid, attempt, ok) VALUES ('lease', ?, 0, 0, 1, 0)", m)
		for _, r := range pl.recs {
			kind := "succeeded"
			if pl.state == "dead" && m != "dead-success" {
				kind = "dead"
			}
			tx.MustExec("INSERT INTO "+outc+" (form, msg, kind, rec, worker, pid) VALUES ('lease', ?, ?, ?, 0, 0)", m, kind, r)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	rep := &soakReport{}
	if err := auditSoak(ctx, db, b.Dialect(), c, []soakVariant{lease}, rep); err != nil {
		t.Fatal(err)
	}
	got := rep.Forms[0]
	want := formReport{Form: "lease", Published: 10, Rows: 10, Completed: 7, Dead: 2, Pending: 1, CompletedTwice: 1,
		Lost: 2, Other: 2, Runs: 11 + 9, FailedRuns: 11, ExtraRuns: 2 + 1, Unrecorded: 1}
	if got != want {
		t.Errorf("audit\n got %+v\nwant %+v", got, want)
	}
	for _, v := range []string{"completed twice, e.g. twice", "lost: published, no row (nor, where done rows are deleted, a successful run), e.g. lost-no-row",
		"lost: done without a successful run recorded, e.g. lost-no-run", "pending after the drain, e.g. pending",
		"row without a committed publish, e.g. phantom", "success recorded for a dead row, e.g. dead-success"} {
		if !strings.Contains(strings.Join(rep.Violations, "\n"), v) {
			t.Errorf("no violation %q in\n%s", v, strings.Join(rep.Violations, "\n"))
		}
	}
	if n := len(rep.Violations); n != 6 {
		t.Errorf("%d violations, want 6:\n%s", n, strings.Join(rep.Violations, "\n"))
	}
}

// TestSoakAuditRowLock checks the row-lock rules, where handler writes
// through the delivery transaction must commit exactly once per done row
// and never for a dead or unfinished one.
func TestSoakAuditRowLock(t *testing.T) {
	a := newAuditData()
	plant := func(m string, row rowState, okRuns, effects int, outcome string) {
		a.published[m] = true
		a.rows[m] = []rowState{row}
		a.okRuns[m] = okRuns
		a.effects[m] = effects
		if outcome != "" {
			a.outcomes[m] = map[string]int{outcome: 1}
		}
	}
	done, dead, pending := rowState{done: true}, rowState{dead: true}, rowState{}
	plant("clean", done, 1, 1, "succeeded")
	plant("rerun-rolled-back", done, 2, 1, "succeeded") // killed before the commit once
	plant("effect-twice", done, 2, 2, "succeeded")
	plant("no-effect", done, 1, 0, "succeeded")
	plant("dead-effect", dead, 0, 1, "dead")
	plant("pending-effect", pending, 1, 1, "")
	r, v := auditForm(soakVariant{Name: "row-lock", Form: sqlxbroker.RowLock}, a)
	want := formReport{Form: "row-lock", Published: 6, Rows: 6, Completed: 4, Dead: 1, Pending: 1, CompletedTwice: 1,
		Lost: 1, Other: 2, Runs: 7, ExtraRuns: 2}
	if r != want {
		t.Errorf("audit\n got %+v\nwant %+v\n%s", r, want, strings.Join(v, "\n"))
	}
	if len(v) != 5 {
		t.Errorf("%d violation kinds, want 5 (twice, lost, dead effect, pending, pending effect):\n%s", len(v), strings.Join(v, "\n"))
	}
}

// TestSoakAuditDeleted checks a table that deletes done rows: a message
// without a row is completed when a successful run was recorded, and lost
// when none was.
func TestSoakAuditDeleted(t *testing.T) {
	a := newAuditData()
	plant := func(m string, rows []rowState, okRuns int, outcomes map[string]int) {
		a.published[m] = true
		a.rows[m] = rows
		a.okRuns[m] = okRuns
		a.outcomes[m] = outcomes
	}
	plant("deleted", nil, 1, map[string]int{"succeeded": 1})
	plant("deleted-unrecorded", nil, 1, nil)
	plant("deleted-rerun", nil, 2, map[string]int{"succeeded": 1})
	plant("deleted-twice", nil, 2, map[string]int{"succeeded": 2})
	plant("deleted-without-run", nil, 0, map[string]int{"succeeded": 1})
	plant("dead", []rowState{{dead: true}}, 0, map[string]int{"dead": 1})
	plant("pending", []rowState{{}}, 0, nil)
	r, v := auditForm(soakVariant{Name: "lease-delete", Form: sqlxbroker.Lease, Delete: true}, a)
	want := formReport{Form: "lease-delete", Published: 7, Rows: 2, Completed: 4, Dead: 1, Pending: 1, CompletedTwice: 1,
		Lost: 1, Runs: 6, ExtraRuns: 2, Unrecorded: 1}
	if r != want {
		t.Errorf("audit\n got %+v\nwant %+v\n%s", r, want, strings.Join(v, "\n"))
	}
	if len(v) != 3 {
		t.Errorf("%d violation kinds, want 3 (twice, lost, pending):\n%s", len(v), strings.Join(v, "\n"))
	}
}

// TestSoakRefusesTooManyConnections: a soak whose workers may hold more
// connections than the server accepts fails before it starts, with an
// error that names the numbers and what to change, and creates nothing; a
// small one passes the check.
func TestSoakRefusesTooManyConnections(t *testing.T) {
	for _, s := range []struct {
		driver string
		db     provision.Database
	}{{"postgres", provision.Postgres}, {"mysql", provision.MariaDB}} {
		t.Run(s.driver, func(t *testing.T) {
			dsn := s.db.Get(t)
			db, err := openSoakDB(s.driver, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var left int
			if err := db.QueryRow(connectionsLeftQuery(s.driver)).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left < 20 {
				t.Fatalf("the server accepts only %d more connections", left)
			}
			variants := formsOfDriver(t, s.driver)
			c := testSoakConfig(t, s.driver, dsn)
			c.Workers, c.Concurrency = 3, left // 3 x left row-lock handlers alone
			if _, err := runSoak(context.Background(), c); err == nil ||
				!strings.Contains(err.Error(), fmt.Sprintf("%d row-lock handlers each", left)) ||
				!strings.Contains(err.Error(), "--workers or --concurrency") {
				t.Fatalf("soak of 3 workers x %d handlers on a server that accepts %d more connections: %v, want the connections refused", left, left, err)
			}
			for _, name := range soakTables(c, variants) {
				var n int
				q := "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = ?"
				if err := db.QueryRow(sqlx.Rebind(sqlx.BindType(s.driver), q), name).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 0 {
					t.Errorf("the refused soak created table %s", name)
				}
			}
			c.Workers, c.Concurrency = 3, 4
			if err := checkSoakConnections(context.Background(), db, c, variants); err != nil {
				t.Errorf("a soak of 3 workers x 4 handlers: %v", err)
			}
		})
	}
}

// soakConnections counts every row-lock handler, each lease and advisory
// subscription's pool, and the harness.
func TestSoakConnections(t *testing.T) {
	c := soakConfig{Workers: 3, Concurrency: 200}
	all, rowLock := soakConnections(c, soakVariants(core.Forms))
	if rowLock != 600 {
		t.Errorf("row-lock part %d, want 600", rowLock)
	}
	if want := 600 + 3*(2*forms.LeaseConnections+forms.AdvisoryConnections) + 1; all != want {
		t.Errorf("all %d, want %d", all, want)
	}
}
