package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
)

// TestOperationsPassRowsInWork: on PostgreSQL a statement over a list of
// ids waits only for the rows it changes, so the operations change a
// row-lock table's rows a list per statement
// (core.Features.ListScanWaits false), and one ready row in work (locked
// by an open transaction, as a handler's delivery holds it) holds up none
// of them: Delete of the ready and the dead rows, Requeue of the dead,
// Prune of the done, each finishing at once and leaving that row.
func TestOperationsPassRowsInWork(t *testing.T) {
	db := openDB(t, "")
	b := openBroker(t, db)
	if b.Dialect().Features().ListScanWaits {
		t.Fatal("PostgreSQL says a statement over a list of ids waits for rows out of it")
	}
	ctx := context.Background()
	const each = 10 // ready, dead and done rows
	for _, c := range []struct {
		name string
		run  func(ctx context.Context, tbl sqlxbroker.Table) (int64, error)
		want int64
		left string // the rows of the state changed
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
			tbl := sqlxbroker.Table{Name: uniq("sxb_ops_"), DeadAt: "dead_at", DoneAt: "done_at"}
			createTable(t, b, tbl)
			publish(t, b, tbl, accounts(0, 3*each))
			q := `"` + tbl.Name + `"`
			db.MustExec("UPDATE "+q+" SET dead_at = now() WHERE account >= $1 AND account < $2", each, 2*each)
			db.MustExec("UPDATE "+q+" SET done_at = now() - interval '1 minute' WHERE account >= $1", 2*each)
			var held int64
			if err := db.Get(&held, "SELECT id FROM "+q+" WHERE account = 0"); err != nil {
				t.Fatal(err)
			}
			tx := db.MustBegin()
			defer tx.Rollback()
			tx.MustExec("SELECT id FROM "+q+" WHERE id = $1 FOR UPDATE", held)
			dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			began := time.Now()
			n, err := c.run(dctx, tbl)
			if err != nil {
				t.Fatalf("with a row in work: %v (after %v)", err, time.Since(began).Round(time.Millisecond))
			}
			if n != c.want {
				t.Errorf("changed %d rows, want %d", n, c.want)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			var left int
			if err := db.Get(&left, "SELECT count(*) FROM "+q+" WHERE "+c.left); err != nil {
				t.Fatal(err)
			}
			want := 0
			if c.name == "delete ready" {
				want = 1 // the one in work
			}
			if left != want {
				t.Errorf("%d rows left where %s, want %d", left, c.left, want)
			}
		})
	}
}
