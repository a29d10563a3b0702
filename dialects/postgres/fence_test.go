package postgres_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
)

// TestFenceLeases: the fence matches exactly the rows whose lease column
// holds their token, with one token for the whole batch (the condition
// without array_position) and with several, and a row re-leased since
// (another token in the table) is left out either way.
func TestFenceLeases(t *testing.T) {
	db := openDSN(dsn(t))(t)
	if _, err := db.Exec(`DROP TABLE IF EXISTS sxb_fence; CREATE TABLE sxb_fence (id bigint PRIMARY KEY, locked_until timestamptz NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	defer db.Exec(`DROP TABLE sxb_fence`)
	t1 := time.Date(2026, 12, 6, 1, 2, 3, 456789000, time.UTC)
	t2 := t1.Add(time.Second)
	d := postgres.Dialect{}
	p := &core.Plan{QID: `"id"`, QLockedUntil: `"locked_until"`}
	for _, c := range []struct {
		name   string
		ids    []any
		tokens []any
		want   []int64
		one    bool // one token: the condition reads no array by position
	}{
		{"one token", []any{int64(1), int64(2), int64(3)}, []any{t1, t1, t1}, []int64{1, 2, 3}, true},
		{"one token, a row re-leased", []any{int64(1), int64(2), int64(4)}, []any{t1, t1, t1}, []int64{1, 2}, true},
		{"one token in another zone", []any{int64(1), int64(2)}, []any{t1.In(time.FixedZone("x", 3600)), t1}, []int64{1, 2}, true},
		{"two tokens", []any{int64(3), int64(4)}, []any{t1, t2}, []int64{3, 4}, false},
		{"two tokens, swapped", []any{int64(3), int64(4)}, []any{t2, t1}, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := db.Exec(`TRUNCATE sxb_fence`); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(`INSERT INTO sxb_fence VALUES (1, $1), (2, $1), (3, $1), (4, $2)`, t1, t2); err != nil {
				t.Fatal(err)
			}
			cond, args := d.FenceLeases(p, c.ids, c.tokens)
			if strings.Contains(cond, "array_position") == c.one {
				t.Errorf("one token %v, condition %s", c.one, cond)
			}
			var got []int64
			if err := db.Select(&got, sqlx.Rebind(sqlx.DOLLAR, "DELETE FROM sxb_fence WHERE "+cond+" RETURNING id"), args...); err != nil {
				t.Fatalf("%s: %v", cond, err)
			}
			slices.Sort(got)
			if !slices.Equal(got, c.want) {
				t.Errorf("%s matched %v, want %v", cond, got, c.want)
			}
		})
	}
}

// TestMatchIDs: one array argument matches exactly the rows whose ID is
// in the list, for integer and text keys (quotes, backslashes, commas and
// braces in them), repeated IDs and IDs no row has.
func TestMatchIDs(t *testing.T) {
	db := openDSN(dsn(t))(t)
	if _, err := db.Exec(`DROP TABLE IF EXISTS sxb_match; CREATE TABLE sxb_match (n bigint PRIMARY KEY, s text NOT NULL UNIQUE)`); err != nil {
		t.Fatal(err)
	}
	defer db.Exec(`DROP TABLE sxb_match`)
	texts := []string{`plain`, `a "quoted" one`, `back\slash`, `{braced},comma`, `NULL`}
	for i, s := range texts {
		if _, err := db.Exec(`INSERT INTO sxb_match VALUES ($1, $2)`, i+1, s); err != nil {
			t.Fatal(err)
		}
	}
	d := postgres.Dialect{}
	p := &core.Plan{}
	for _, c := range []struct {
		name string
		col  string
		ids  []any
		want []int64
	}{
		{"integers", "sxb_match.n", []any{int64(1), int64(3), int64(9)}, []int64{1, 3}},
		{"integers repeated", `"n"`, []any{int64(2), int64(2)}, []int64{2}},
		{"texts", "s", []any{`a "quoted" one`, []byte(`back\slash`), `{braced},comma`, `NULL`, `absent`}, []int64{2, 3, 4, 5}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cond, args := d.MatchIDs(p, c.col, c.ids)
			if len(args) != 1 {
				t.Errorf("%d args for %d IDs, want 1", len(args), len(c.ids))
			}
			var got []int64
			if err := db.Select(&got, sqlx.Rebind(sqlx.DOLLAR, "SELECT n FROM sxb_match WHERE "+cond+" ORDER BY n"), args...); err != nil {
				t.Fatalf("%s: %v", cond, err)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("%s matched %v, want %v", cond, got, c.want)
			}
		})
	}
}

// TestClaimLeasesPassesOverTouched: a lease claim from the cursor passes
// over a row whose version another transaction has updated, deleted or
// locked since it was written (here an update that rolled back, and a
// share lock since committed), which a claim with a stale snapshot would
// otherwise lock and keep locked until it commits; a claim from the first
// row takes them, in order.
func TestClaimLeasesPassesOverTouched(t *testing.T) {
	ctx := context.Background()
	db := openDSN(dsn(t))(t)
	b, err := sqlxbroker.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	tb := sqlxbroker.Table{Name: "sxb_touched", LockedUntil: "locked_until", Lease: time.Minute}
	_, _ = db.Exec(`DROP TABLE IF EXISTS sxb_touched`)
	if err := b.CreateTable(ctx, tb, [2]string{"account", "text"}); err != nil {
		t.Fatal(err)
	}
	defer db.Exec(`DROP TABLE sxb_touched`)
	for range 4 {
		if err := b.Publish(ctx, db, tb, map[string]any{"account": "a"}); err != nil {
			t.Fatal(err)
		}
	}
	tx := db.MustBegin()
	tx.MustExec(`UPDATE sxb_touched SET account = 'b' WHERE id = 1`)
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	db.MustExec(`SELECT 1 FROM sxb_touched WHERE id = 2 FOR KEY SHARE`)
	p, err := b.Plan(tb)
	if err != nil {
		t.Fatal(err)
	}
	claim := func(cursor bool) int64 {
		t.Helper()
		where, args := p.Ready(p.Alias, core.Now())
		rows, err := postgres.Dialect{}.ClaimLeases(ctx, db, &core.LeaseClaimParams{Plan: p, Where: where, Args: args,
			Limit: 1, Deadline: p.Time(time.Now().Add(time.Minute)), Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var id int64 = -1
		for rows.Next() {
			m := map[string]any{}
			if err := rows.MapScan(m); err != nil {
				t.Fatal(err)
			}
			id = m["id"].(int64)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return id
	}
	for i, c := range []struct {
		cursor bool
		want   int64
	}{{true, 3}, {false, 1}, {false, 2}, {true, 4}, {true, -1}} {
		if got := claim(c.cursor); got != c.want {
			t.Fatalf("claim %d (from the cursor: %v) took row %d, want %d", i+1, c.cursor, got, c.want)
		}
	}
}

// TestLeaseClaimsStayHeapOnly: on a table from CreateTable, whose lease
// column defaults to a time long past, every row a lease claim updates
// stays on its page with no new index entry (a heap-only update): the
// claim statement's own counts, read in its transaction. A table whose
// lease column is published NULL is claimed too, for the log: its rows
// grow at their claim, and some no longer fit beside their old version.
func TestLeaseClaimsStayHeapOnly(t *testing.T) {
	db := openDSN(dsn(t))(t)
	ctx := context.Background()
	b, err := sqlxbroker.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000
	claimAll := func(tb sqlxbroker.Table) (updated, hot int64) {
		t.Helper()
		p, err := b.Plan(tb)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		where, args := p.Ready(p.Alias, core.Now())
		rows, err := postgres.Dialect{}.ClaimLeases(ctx, tx, &core.LeaseClaimParams{Plan: p, Where: where, Args: args,
			Limit: n, Deadline: p.Time(time.Now().Add(time.Minute))})
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for rows.Next() {
			got++
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		if got != n {
			t.Fatalf("%s: claimed %d rows, want %d", tb.Name, got, n)
		}
		if err := tx.QueryRowxContext(ctx, `SELECT pg_stat_get_xact_tuples_updated($1::regclass), pg_stat_get_xact_tuples_hot_updated($1::regclass)`,
			tb.Name).Scan(&updated, &hot); err != nil {
			t.Fatal(err)
		}
		return updated, hot
	}
	filled := func(name string, alter string) sqlxbroker.Table {
		t.Helper()
		tb := sqlxbroker.Table{Name: name, LockedUntil: "locked_until", Lease: time.Minute}
		_, _ = db.Exec(`DROP TABLE IF EXISTS ` + name)
		if err := b.CreateTable(ctx, tb, [2]string{"n", "bigint"}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Exec(`DROP TABLE ` + name) })
		if alter != "" {
			db.MustExec(alter)
		}
		msgs := make([]any, n)
		for i := range msgs {
			msgs[i] = map[string]any{"n": i}
		}
		if err := b.Publish(ctx, db, tb, msgs...); err != nil {
			t.Fatal(err)
		}
		return tb
	}
	past := filled("sxb_heaponly", "")
	var def string
	if err := db.Get(&def, `SELECT column_default FROM information_schema.columns WHERE table_name = 'sxb_heaponly' AND column_name = 'locked_until'`); err != nil {
		t.Fatal(err)
	}
	updated, hot := claimAll(past)
	t.Logf("lease column default %s: %d rows updated, %d heap-only", def, updated, hot)
	if updated != n || hot != updated {
		t.Errorf("lease column default %s: %d rows updated, %d of them heap-only; want all %d", def, updated, hot, n)
	}
	null := filled("sxb_heaponly_null", `ALTER TABLE sxb_heaponly_null ALTER COLUMN locked_until DROP DEFAULT`)
	updated, hot = claimAll(null)
	t.Logf("lease column published NULL: %d rows updated, %d heap-only", updated, hot)
}
