package sqlxbrokertest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/sqlxbrokertest"
)

type signup struct {
	ID    int64  `db:"id"`
	Email string `db:"email"`
	Plan  int64  `db:"plan"`
	Trial bool   `db:"trial"`
}

// TestRequirePublishedInTx publishes in a transaction, checks the rows
// through it, rolls back and checks the table is empty, on each database.
func TestRequirePublishedInTx(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ database, b *sqlxbroker.Broker) {
		ctx := context.Background()
		tbl := newTable(t, b, sqlxbroker.Table{LockedUntil: "locked_until", ReadyAt: "ready_at"}, [2]string{"email", "text"}, [2]string{"plan", "bigint"}, [2]string{"trial", "bool"})
		tx, err := b.DB().BeginTxx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		msgs := []any{signup{Email: "ada@example.com", Plan: 2, Trial: true}, signup{Email: "alan@example.com", Plan: 1}}
		if err := b.Publish(ctx, tx, tbl, msgs...); err != nil {
			t.Fatal(err)
		}
		// In any order, and as maps with other Go types for the values.
		sqlxbrokertest.RequirePublished(t, tx, tbl, msgs[1], msgs[0])
		sqlxbrokertest.RequirePublished(t, tx, tbl,
			map[string]any{"email": "ada@example.com", "plan": 2, "trial": true},
			map[string]any{"email": []byte("alan@example.com"), "plan": int32(1), "trial": false})

		got := sqlxbrokertest.Published[signup](t, tx, tbl)
		if len(got) != 2 || got[0].Email != "ada@example.com" || got[0].Plan != 2 || !got[0].Trial ||
			got[1].Email != "alan@example.com" || got[1].Trial || got[0].ID == 0 || got[1].ID <= got[0].ID {
			t.Fatalf("Published through the transaction: %+v", got)
		}
		// With its ID given, a row must have it.
		sqlxbrokertest.RequirePublished(t, tx, tbl, got[0], got[1])
		rows := sqlxbrokertest.Published[map[string]any](t, tx, tbl)
		if len(rows) != 2 || rows[0]["ready_at"] == nil {
			t.Errorf("Published as maps: %v; want 2 rows with ready_at set", rows)
		}

		// Another session does not see the uncommitted rows.
		sqlxbrokertest.RequirePublished(t, b.DB(), tbl)
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		sqlxbrokertest.RequirePublished(t, b.DB(), tbl)
		if n := len(sqlxbrokertest.Published[signup](t, b.DB(), tbl)); n != 0 {
			t.Errorf("%d rows after the rollback", n)
		}
	})
}

// TestRequirePublishedReportsDifferences checks that a wrong expectation
// fails with a message naming the rows missing, what differs, and the rows
// not wanted.
func TestRequirePublishedReportsDifferences(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ database, b *sqlxbroker.Broker) {
		ctx := context.Background()
		tbl := newTable(t, b, sqlxbroker.Table{LockedUntil: "locked_until"}, [2]string{"email", "text"}, [2]string{"plan", "bigint"}, [2]string{"trial", "bool"})
		tx, err := b.DB().BeginTxx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := b.Publish(ctx, tx, tbl, signup{Email: "ada@example.com", Plan: 2}, signup{Email: "alan@example.com", Plan: 1}); err != nil {
			t.Fatal(err)
		}

		// One row differs in a column: missing, with the closest row.
		f := runFake(func(ft sqlxbrokertest.TB) {
			sqlxbrokertest.RequirePublished(ft, tx, tbl, signup{Email: "ada@example.com", Plan: 2}, signup{Email: "alan@example.com", Plan: 3})
		})
		wantFailure(t, f, "RequirePublished", tbl.Name, "holds 2 rows, 2 wanted",
			`- want[1] {email="alan@example.com", plan=3, trial=false, attempt=1}`,
			"differs in plan: want 3, got 1", `+ row {id=`, `email="alan@example.com", plan=1`)
		if !f.fatal {
			t.Error("RequirePublished reported with Errorf; want Fatalf (the test stops)")
		}
		if strings.Contains(f.message(), "want[0]") {
			t.Errorf("the matching row is reported:\n%s", f.message())
		}

		// Too few wanted: the other row is not wanted.
		f = runFake(func(ft sqlxbrokertest.TB) {
			sqlxbrokertest.RequirePublished(ft, tx, tbl, signup{Email: "alan@example.com", Plan: 1})
		})
		wantFailure(t, f, "holds 2 rows, 1 wanted", "missing (-): 0, not wanted (+): 1", `email="ada@example.com"`)

		// An empty table wanted.
		f = runFake(func(ft sqlxbrokertest.TB) { sqlxbrokertest.RequirePublished(ft, tx, tbl) })
		wantFailure(t, f, "holds 2 rows, 0 wanted")

		// A column the table lacks, a table that does not exist, a bad message.
		f = runFake(func(ft sqlxbrokertest.TB) {
			sqlxbrokertest.RequirePublished(ft, tx, tbl, map[string]any{"email": "ada@example.com", "plan": 2, "trial": false, "colour": "red"})
		})
		wantFailure(t, f, "colour: want \"red\", the table has no such column")
		f = runFake(func(ft sqlxbrokertest.TB) {
			sqlxbrokertest.RequirePublished(ft, b.DB(), sqlxbroker.Table{Name: tbl.Name + "_none"})
		})
		wantFailure(t, f, "read table "+tbl.Name+"_none")
		f = runFake(func(ft sqlxbrokertest.TB) {
			sqlxbrokertest.RequirePublished(ft, tx, tbl, struct{ C chan int }{})
		})
		wantFailure(t, f, "want[0]", "field C", "chan int")
		f = runFake(func(ft sqlxbrokertest.TB) { sqlxbrokertest.Published[int](ft, tx, tbl) })
		wantFailure(t, f, "T is int")
	})
}
