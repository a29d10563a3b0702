package mysql_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
)

// TestOperationsPassRowsInWork: the operations that change rows of a
// small row-lock table by their ids, one ready row of it in work (locked
// by an open transaction, as a handler's delivery holds it), finish at
// once and leave that row: Delete of the ready rows and of the dead rows,
// Requeue of the dead rows, Prune of the done rows. A statement over a
// list of ids is planned as a scan of so small a table, and would wait for
// the row in work (here for the session's lock wait timeout, then fail
// with error 1205).
func TestOperationsPassRowsInWork(t *testing.T) {
	dsn := withParams(testDSN(t), "innodb_lock_wait_timeout=3")
	db := openDB(t, dsn)
	b := openBroker(t, db)
	ctx := context.Background()
	const each = 10 // ready, dead and done rows
	for _, c := range []struct {
		name string
		run  func(ctx context.Context, tbl sqlxbroker.Table) (int64, error)
		want int64 // rows removed
		left string
	}{
		{"delete ready", func(ctx context.Context, tbl sqlxbroker.Table) (int64, error) {
			return b.Delete(ctx, tbl, sqlxbroker.DeleteParams{State: sqlxbroker.StateReady, Select: sqlxbroker.Select{All: true}})
		}, each - 1, "dead_at IS NULL AND done_at IS NULL"},
		{"delete dead", func(ctx context.Context, tbl sqlxbroker.Table) (int64, error) {
			return b.Delete(ctx, tbl, sqlxbroker.DeleteParams{State: sqlxbroker.StateDead, Select: sqlxbroker.Select{All: true}})
		}, each, "dead_at IS NOT NULL"},
		{"requeue dead", func(ctx context.Context, tbl sqlxbroker.Table) (int64, error) {
			return b.Requeue(ctx, tbl, sqlxbroker.Select{All: true})
		}, each, "dead_at IS NOT NULL"},
		{"prune done", func(ctx context.Context, tbl sqlxbroker.Table) (int64, error) {
			return b.Prune(ctx, tbl, sqlxbroker.PruneParams{})
		}, each, "done_at IS NOT NULL"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tbl := newTable(t, b, sqlxbroker.Table{DeadAt: "dead_at", DoneAt: "done_at"}, payload...)
			for i := range 3 * each {
				publish(t, b, tbl, msg{N: int64(i)})
			}
			q := "`" + tbl.Name + "`"
			db.MustExec("UPDATE "+q+" SET dead_at = NOW(6) WHERE n >= ? AND n < ?", each, 2*each)
			db.MustExec("UPDATE "+q+" SET done_at = NOW(6) - INTERVAL 1 MINUTE WHERE n >= ?", 2*each)
			var held int64
			if err := db.Get(&held, "SELECT id FROM "+q+" WHERE n = 0"); err != nil {
				t.Fatal(err)
			}
			tx := db.MustBegin()
			defer tx.Rollback()
			tx.MustExec("SELECT id FROM "+q+" WHERE id = ? FOR UPDATE", held) // that row alone

			var ids []any
			if err := db.Select(&ids, "SELECT id FROM "+q+" WHERE NOT ("+c.left+") OR id <> ?", held); err != nil {
				t.Fatal(err)
			}
			var plan string
			if err := db.QueryRow("EXPLAIN DELETE FROM "+q+" WHERE id IN (?"+strings.Repeat(", ?", each-1)+")", ids[:each]...).Scan(new(any), new(any), new(any), &plan, new(any), new(any), new(any), new(any), new(any), new(any)); err != nil {
				t.Fatalf("explain: %v", err)
			}
			t.Logf("a DELETE of %d ids of %d rows is planned as %q", each, 3*each, plan)
			dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			began := time.Now()
			n, err := c.run(dctx, tbl)
			if err != nil {
				t.Fatalf("with a row in work: %v (after %v)", err, time.Since(began).Round(time.Millisecond))
			}
			if n != c.want {
				t.Errorf("removed %d rows, want %d", n, c.want)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			var left int
			if err := db.Get(&left, "SELECT COUNT(*) FROM "+q+" WHERE "+c.left); err != nil {
				t.Fatal(err)
			}
			want := 0
			if c.name == "delete ready" {
				want = 1 // the one in work
			}
			if left != want {
				t.Errorf("%d rows left where %s, want %d", left, c.left, want)
			}
			if err := db.Get(&left, "SELECT COUNT(*) FROM "+q+" WHERE id = ?", held); err != nil || left != 1 {
				t.Errorf("the row in work: %d rows, %v", left, err)
			}
		})
	}
}
