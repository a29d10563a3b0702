package mysql_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/mysql"
)

// countsTable is a lease table with every state column.
func countsTable(name string) sqlxbroker.Table {
	return sqlxbroker.Table{Name: name, LockedUntil: "locked_until", ReadyAt: "ready_at", DeadAt: "dead_at",
		DoneAt: "done_at", LastError: "last_error", MaxAttempts: 3}
}

// fillCounts creates tb with the dialect's DDL and rows in every state,
// then doubles them until the table holds about rows rows.
func fillCounts(t *testing.T, db *sqlx.DB, b *sqlxbroker.Broker, tb sqlxbroker.Table, rows int) {
	t.Helper()
	ctx := context.Background()
	if err := b.CreateTable(ctx, tb, [2]string{"body", "text"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + tb.Name) })
	now := core.Now()
	enc := mysql.Dialect{}.EncodeTime
	var msgs []any
	add := func(n int, m func(i int) map[string]any) {
		for i := range n {
			r := map[string]any{"ready_at": enc(now.Add(-time.Hour)), "body": fmt.Sprint(len(msgs)),
				"locked_until": nil, "dead_at": nil, "done_at": nil, "last_error": nil, "attempt": 1}
			for k, v := range m(i) {
				r[k] = v
			}
			msgs = append(msgs, r)
		}
	}
	add(7, func(int) map[string]any { return nil })                             // ready
	add(2, func(int) map[string]any { return map[string]any{"ready_at": nil} }) // ready, no ReadyAt
	add(5, func(i int) map[string]any {
		return map[string]any{"ready_at": enc(now.Add(time.Duration(i+1) * time.Hour))}
	}) // scheduled
	add(3, func(int) map[string]any { return map[string]any{"locked_until": enc(now.Add(20 * time.Second))} }) // in work
	add(1, func(int) map[string]any { return map[string]any{"locked_until": enc(now.Add(-time.Minute))} })     // lease run out: ready
	add(4, func(int) map[string]any {
		return map[string]any{"dead_at": enc(now.Add(-time.Minute)), "last_error": "boom", "attempt": 3}
	})
	add(2, func(int) map[string]any { // dead and done: dead
		return map[string]any{"dead_at": enc(now.Add(-time.Minute)), "done_at": enc(now.Add(-time.Minute))}
	})
	add(16, func(int) map[string]any { return map[string]any{"done_at": enc(now.Add(-2 * time.Hour))} })
	if err := b.Publish(ctx, db, tb, msgs...); err != nil {
		t.Fatal(err)
	}
	cols := "attempt, body, locked_until, ready_at, dead_at, done_at, last_error"
	for n := len(msgs); n < rows; n *= 2 {
		db.MustExec("INSERT INTO " + tb.Name + " (" + cols + ") SELECT " + cols + " FROM " + tb.Name)
	}
	db.MustExec("ANALYZE TABLE " + tb.Name)
}

// trueCounts counts tb's states from the state columns themselves.
func trueCounts(t *testing.T, db *sqlx.DB, tb sqlxbroker.Table, at time.Time) []int64 {
	t.Helper()
	now, later := mysql.Dialect{}.EncodeTime(at), mysql.Dialect{}.EncodeTime(at.Add(time.Minute))
	unf := "dead_at IS NULL AND done_at IS NULL"
	free := "(locked_until IS NULL OR locked_until <= ? OR locked_until > ?)"
	var c struct{ Ready, Scheduled, InWork, Dead, Done int64 }
	err := db.QueryRowx("SELECT"+
		" COALESCE(SUM("+unf+" AND (ready_at IS NULL OR ready_at <= ?) AND "+free+"), 0),"+
		" COALESCE(SUM("+unf+" AND ready_at > ? AND "+free+"), 0),"+
		" COALESCE(SUM("+unf+" AND locked_until > ? AND locked_until <= ?), 0),"+
		" COALESCE(SUM(dead_at IS NOT NULL), 0),"+
		" COALESCE(SUM(done_at IS NOT NULL AND dead_at IS NULL), 0) FROM "+tb.Name,
		now, now, later, now, now, later, now, later).Scan(&c.Ready, &c.Scheduled, &c.InWork, &c.Dead, &c.Done)
	if err != nil {
		t.Fatal(err)
	}
	return []int64{c.Ready, c.Scheduled, c.InWork, c.Dead, c.Done}
}

func countsOf(c sqlxbroker.Counts) []int64 {
	return []int64{c.Ready, c.Scheduled, c.InWork, c.Dead, c.Done}
}

// scanned is how many rows the session has read by scanning a table
// (Handler_read_rnd_next), on db's one connection.
func scanned(t *testing.T, db *sqlx.DB) int64 {
	t.Helper()
	var name string
	var n int64
	if err := db.QueryRow("SHOW SESSION STATUS LIKE 'Handler_read_rnd_next'").Scan(&name, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCountsStateColumn: on the table CreateTable makes, Counts reads the
// sqlxbroker_state column's index and scans no table, and counts what the
// state columns say (in work too, derived from the unfinished rows); with
// the column dropped (a table made by other DDL) the same counts come from
// scans. The rows are counted on one session, so
// its handler counters are Counts' own.
func TestCountsStateColumn(t *testing.T) {
	dsn := testDSN(t)
	db := openDB(t, dsn)
	db.SetMaxOpenConns(1)
	b := sqlxbroker.OpenDialect(db, mysql.Dialect{})
	tb := countsTable(fmt.Sprintf("mycounts_state_%d", time.Now().UnixNano()%1e9))
	const rows = 20000
	fillCounts(t, db, b, tb, rows)
	ctx := context.Background()

	check := func(what string, maxScanned, minScanned int64) {
		t.Helper()
		before := scanned(t, db)
		c, err := b.Counts(ctx, tb)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		n := scanned(t, db) - before
		t.Logf("%s: Counts scanned %d rows: %v", what, n, countsOf(c))
		if want := trueCounts(t, db, tb, c.At); !slices.Equal(countsOf(c), want) {
			t.Errorf("%s: counts %v, the state columns say %v", what, countsOf(c), want)
		}
		if c.Dead == 0 || c.Done == 0 || c.Scheduled == 0 || c.InWork == 0 || c.Ready == 0 {
			t.Errorf("%s: a state without rows: %v", what, countsOf(c))
		}
		if n > maxScanned || n < minScanned {
			t.Errorf("%s: Counts scanned %d rows, want %d to %d", what, n, minScanned, maxScanned)
		}
	}
	check("with the state column", 100, 0)

	// Rows change state, and the column follows.
	db.MustExec("UPDATE " + tb.Name + " SET done_at = ready_at WHERE dead_at IS NULL AND done_at IS NULL AND id % 3 = 0")
	db.MustExec("UPDATE " + tb.Name + " SET dead_at = NOW(6) WHERE done_at IS NOT NULL AND id % 5 = 0")
	check("after updates", 100, 0)

	db.MustExec("ALTER TABLE " + tb.Name + " DROP COLUMN sqlxbroker_state")
	if err := b.CheckTable(ctx, tb); err != nil {
		t.Fatal(err)
	}
	check("without the state column", 1<<40, 3*rows)
}

// TestStateMarks: StateMarks gives the conditions only for a column whose
// expression is the DDL's for the description's own columns.
func TestStateMarks(t *testing.T) {
	dsn := testDSN(t)
	db := openDB(t, dsn)
	b := sqlxbroker.OpenDialect(db, mysql.Dialect{})
	pool := core.NewPool(db, mysql.Dialect{})
	ctx := context.Background()
	name := fmt.Sprintf("mycounts_marks_%d", time.Now().UnixNano()%1e9)
	tb := countsTable(name)
	if err := b.CreateTable(ctx, tb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + name) })
	marks := func(tb sqlxbroker.Table) *core.StateMarks {
		t.Helper()
		p, err := b.Plan(tb)
		if err != nil {
			t.Fatal(err)
		}
		m, err := mysql.Dialect{}.StateMarks(ctx, pool, p)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := marks(tb)
	if m == nil || !strings.Contains(m.Unfinished, "sqlxbroker_state") || m.Dead == "" || m.Done == "" {
		t.Fatalf("the DDL's table: marks %+v", m)
	}
	// The same table described without DoneAt: its rows' classes are not
	// the column's, so the counts must not use it.
	noDone := tb
	noDone.DoneAt = ""
	if m := marks(noDone); m != nil {
		t.Errorf("a description without DoneAt: marks %+v, want none", m)
	}
	// The same name in another schema-qualified spelling finds the column.
	var schema string
	if err := db.Get(&schema, "SELECT DATABASE()"); err != nil {
		t.Fatal(err)
	}
	qualified := tb
	qualified.Name = schema + "." + name
	if m := marks(qualified); m == nil {
		t.Errorf("%s: no marks", qualified.Name)
	}
	// A column of that name with another expression is not the counts'.
	db.MustExec("ALTER TABLE " + name + " MODIFY sqlxbroker_state TINYINT AS (CASE WHEN done_at IS NOT NULL THEN 2 ELSE 0 END) STORED INVISIBLE")
	if m := marks(tb); m != nil {
		t.Errorf("a column with another expression: marks %+v, want none", m)
	}
	db.MustExec("ALTER TABLE " + name + " DROP COLUMN sqlxbroker_state")
	if m := marks(tb); m != nil {
		t.Errorf("no column: marks %+v, want none", m)
	}
	// A table without DeadAt and DoneAt has no column to look for.
	if m := marks(sqlxbroker.Table{Name: name, LockedUntil: "locked_until"}); m != nil {
		t.Errorf("no state columns: marks %+v", m)
	}
}

// TestStateColumnDDL: the column is invisible (SELECT * and List leave it
// out), CheckTable and Publish work on the table, and a payload column of
// the same name is refused.
func TestStateColumnDDL(t *testing.T) {
	dsn := testDSN(t)
	db := openDB(t, dsn)
	b := sqlxbroker.OpenDialect(db, mysql.Dialect{})
	ctx := context.Background()
	name := fmt.Sprintf("mycounts_ddl_%d", time.Now().UnixNano()%1e9)
	tb := countsTable(name)
	stmts, err := b.TableDDL(tb, [2]string{"body", "text"})
	if err != nil {
		t.Fatal(err)
	}
	ddl := strings.Join(stmts, "\n")
	for _, want := range []string{"`sqlxbroker_state` TINYINT AS (CASE WHEN `dead_at` IS NOT NULL THEN 2 WHEN `done_at` IS NOT NULL THEN 1 ELSE 0 END) STORED INVISIBLE",
		"INDEX `sqlxbroker_counts` (`sqlxbroker_state`, `ready_at`)",
		"`locked_until` DATETIME(6) NULL DEFAULT '1970-01-01 00:00:00'", "`ready_at` DATETIME(6) NULL,"} {
		if !strings.Contains(ddl, want) {
			t.Errorf("DDL lacks %s:\n%s", want, ddl)
		}
	}
	if err := b.CreateTable(ctx, tb, [2]string{"body", "text"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + name) })
	if err := b.CheckTable(ctx, tb); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, db, tb, map[string]any{"body": "x"}); err != nil {
		t.Fatal(err)
	}
	page, err := b.List(ctx, tb, sqlxbroker.ListParams{State: sqlxbroker.StateReady})
	if err != nil || len(page.Rows) != 1 {
		t.Fatalf("list: %v %v", page, err)
	}
	// Published with the lease column's default, a time long past: ready,
	// not in work.
	if c, err := b.Counts(ctx, tb); err != nil || c.Ready != 1 || c.InWork != 0 {
		t.Errorf("counts of a new row: %+v, %v; want it ready", c, err)
	}
	if slices.Contains(page.Rows[0].Columns, "sqlxbroker_state") {
		t.Errorf("SELECT * returns the state column: %v", page.Rows[0].Columns)
	}
	var state int
	if err := db.Get(&state, "SELECT sqlxbroker_state FROM "+name); err != nil || state != 0 {
		t.Errorf("state of a new row: %d, %v", state, err)
	}
	if _, err := b.TableDDL(tb, [2]string{"sqlxbroker_state", "int"}); err == nil || !strings.Contains(err.Error(), "sqlxbroker_state") {
		t.Errorf("a payload column named sqlxbroker_state: %v, want a refusal naming it", err)
	}
}

// TestSameStateExpr: the expression CreateTable writes matches what
// MariaDB prints for it and what MySQL 8 prints (parenthesised, each
// condition too), and not an expression with another column or value.
func TestSameStateExpr(t *testing.T) {
	ddl := "CASE WHEN `dead_at` IS NOT NULL THEN 2 WHEN `done_at` IS NOT NULL THEN 1 ELSE 0 END"
	for _, e := range []string{
		"case when `dead_at` is not null then 2 when `done_at` is not null then 1 else 0 end",       // MariaDB 10.11
		"(case when (`dead_at` is not null) then 2 when (`done_at` is not null) then 1 else 0 end)", // MySQL 8
	} {
		if !mysql.SameStateExpr(ddl, e) {
			t.Errorf("%q does not match the DDL's expression", e)
		}
	}
	for _, e := range []string{
		"case when `done_at` is not null then 2 when `dead_at` is not null then 1 else 0 end",
		"case when `dead_at` is not null then 2 else 0 end",
		"case when `dead_at2` is not null then 2 when `done_at` is not null then 1 else 0 end",
	} {
		if mysql.SameStateExpr(ddl, e) {
			t.Errorf("%q matches the DDL's expression", e)
		}
	}
}
