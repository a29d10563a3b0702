package sqlxbrokertest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/sqlxbrokertest"
)

// job is a row of the row-lock tests' job table.
type job struct {
	ID        int64   `db:"id"`
	Attempt   int     `db:"attempt"`
	N         int64   `db:"n"`
	LastError *string `db:"last_error"`
}

// auditHandler writes an audit row for its job through the delivery's
// transaction, then fails when fail says so.
func auditHandler(auditTable string, fail func(n int64) error) sqlxbroker.Handler {
	return func(ctx context.Context, d *sqlxbroker.Delivery) error {
		var j job
		if err := d.Scan(&j); err != nil {
			return err
		}
		tx, err := d.Tx()
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO "+auditTable+" (job, note) VALUES (?, ?)"),
			j.N, fmt.Sprintf("job %d attempt %d", j.N, d.Attempt())); err != nil {
			return err
		}
		return fail(j.N)
	}
}

func never(int64) error { return nil }

// jobsByN reads the job table through q, by n.
func jobsByN(t *testing.T, q sqlxbrokertest.Querier, tbl sqlxbroker.Table) map[int64]job {
	t.Helper()
	out := map[int64]job{}
	for _, j := range sqlxbrokertest.Published[job](t, q, tbl) {
		out[j.N] = j
	}
	return out
}

// TestRowLockDeliveryTxWrites claims rows of a row-lock table for real and
// runs a handler that writes an audit row through Delivery.Tx: the write
// is visible inside the claim transaction only until the delivery
// succeeds, then to everyone; a failed or released delivery leaves no
// audit row, and the job row's attempt says which it was.
func TestRowLockDeliveryTxWrites(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db database, b *sqlxbroker.Broker) {
		ctx := context.Background()
		if !db.rowLock {
			tbl := newTable(t, b, sqlxbroker.Table{LockedUntil: "locked_until"}, [2]string{"n", "bigint"})
			f := runFake(func(ft sqlxbrokertest.TB) { sqlxbrokertest.NewRowLockDelivery(ft, b, tbl, 1) })
			wantFailure(t, f, "NewRowLockDelivery", "lease table", "a row-lock table names neither")
			tbl.LockedUntil = ""
			f = runFake(func(ft sqlxbrokertest.TB) { sqlxbrokertest.NewRowLockDelivery(ft, b, tbl, 1) })
			wantFailure(t, f, "NewRowLockDelivery", "row-lock form")
			return
		}
		tbl := newTable(t, b, sqlxbroker.Table{LastError: "last_error"}, [2]string{"n", "bigint"})
		auditTable := newAudit(t, b)
		qAudit := b.Dialect().QuoteIdent(auditTable)
		if err := b.Publish(ctx, b.DB(), tbl, map[string]any{"n": 1}, map[string]any{"n": 2}, map[string]any{"n": 3}); err != nil {
			t.Fatal(err)
		}
		jobs := jobsByN(t, b.DB(), tbl)

		// Row 2 comes after row 1 in the claim order: row 1 is claimed on
		// the way and released untouched.
		d := sqlxbrokertest.NewRowLockDelivery(t, b, tbl, jobs[2].ID)
		if d.ID() == nil || d.Attempt() != 1 {
			t.Fatalf("delivery of job 2: ID %v, attempt %d", d.ID(), d.Attempt())
		}
		h := auditHandler(qAudit, never)
		if err := h(ctx, d.Delivery); err != nil {
			t.Fatal(err)
		}
		tx, err := d.Tx()
		if err != nil {
			t.Fatal(err)
		}
		// Inside the claim transaction the write is there; outside not yet.
		if got := audits(t, tx, auditTable); len(got) != 1 || got[0] != (audit{2, "job 2 attempt 1"}) {
			t.Errorf("audit rows inside the claim transaction: %+v", got)
		}
		if got := audits(t, b.DB(), auditTable); len(got) != 0 {
			t.Errorf("audit rows outside before the commit: %+v", got)
		}
		// Row 2 is locked: a second claim of it fails, saying so.
		f := runFake(func(ft sqlxbrokertest.TB) { sqlxbrokertest.NewRowLockDelivery(ft, b, tbl, jobs[2].ID) })
		wantFailure(t, f, "is not claimable", "locked by another transaction")
		d.Succeed()
		if got := audits(t, b.DB(), auditTable); len(got) != 1 || got[0] != (audit{2, "job 2 attempt 1"}) {
			t.Errorf("audit rows after Succeed: %+v; want job 2's", got)
		}
		if _, err := d.Tx(); !errors.Is(err, sql.ErrTxDone) {
			t.Errorf("Tx after the completion: %v, want sql.ErrTxDone", err)
		}
		after := jobsByN(t, b.DB(), tbl)
		if _, ok := after[2]; ok || len(after) != 2 || after[1].Attempt != 1 {
			t.Errorf("jobs after job 2 succeeded: %+v; want jobs 1 and 3, job 1 untouched (attempt 1)", after)
		}

		// Job 3 fails after writing: its write rolls back, the attempt counts.
		d = sqlxbrokertest.NewRowLockDelivery(t, b, tbl, jobs[3].ID)
		boom := errors.New("mail server down")
		err = d.Run(ctx, auditHandler(qAudit, func(int64) error { return boom }))
		if !errors.Is(err, boom) {
			t.Errorf("Run returned %v, want the handler's error", err)
		}
		after = jobsByN(t, b.DB(), tbl)
		if j := after[3]; j.Attempt != 2 || j.LastError == nil || *j.LastError != boom.Error() {
			t.Errorf("job 3 after a failure: %+v; want attempt 2 and last_error %q", j, boom)
		}

		// Job 1 is released after writing: nothing is kept, nothing counted.
		d = sqlxbrokertest.NewRowLockDelivery(t, b, tbl, jobs[1].ID)
		if err := h(ctx, d.Delivery); err != nil {
			t.Fatal(err)
		}
		d.Release()
		if got := audits(t, b.DB(), auditTable); len(got) != 1 {
			t.Errorf("audit rows after a failure and a release: %+v; want job 2's only", got)
		}
		if j := jobsByN(t, b.DB(), tbl)[1]; j.Attempt != 1 {
			t.Errorf("job 1 after a release: %+v; want attempt 1", j)
		}
		if err := d.Complete(sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err == nil {
			t.Error("a second completion was accepted")
		}

		// A delivery the test does not complete is released at its end.
		runFake(func(ft sqlxbrokertest.TB) {
			d := sqlxbrokertest.NewRowLockDelivery(ft, b, tbl, jobs[1].ID)
			if err := h(ctx, d.Delivery); err != nil {
				ft.Errorf("%v", err)
			}
		})
		if got := audits(t, b.DB(), auditTable); len(got) != 1 {
			t.Errorf("audit rows after a delivery left open: %+v; want job 2's only", got)
		}
		// A missing row, and a bad ID.
		f = runFake(func(ft sqlxbrokertest.TB) { sqlxbrokertest.NewRowLockDelivery(ft, b, tbl, jobs[3].ID+1000) })
		wantFailure(t, f, "is not claimable", "2 other ready rows claimed and released")
		f = runFake(func(ft sqlxbrokertest.TB) { sqlxbrokertest.NewRowLockDelivery(ft, b, tbl, nil) })
		wantFailure(t, f, "is not a row ID")
		// The rows passed on the way are all claimable again.
		if got := jobsByN(t, b.DB(), tbl); len(got) != 2 || got[1].Attempt != 1 || got[3].Attempt != 2 {
			t.Errorf("jobs at the end: %+v", got)
		}
	})
}

// TestRowLockDeliveryPassesAtMostMaxPassed: the row after MaxPassed ready
// rows is found, the one after more is refused, saying why, and every row
// passed on the way is left as it was.
func TestRowLockDeliveryPassesAtMostMaxPassed(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db database, b *sqlxbroker.Broker) {
		if !db.rowLock {
			t.Skipf("%s has no row-lock form", db.name)
		}
		tbl := newTable(t, b, sqlxbroker.Table{}, [2]string{"n", "bigint"})
		var msgs []any
		for n := 1; n <= sqlxbrokertest.MaxPassed+2; n++ {
			msgs = append(msgs, map[string]any{"n": n})
		}
		if err := b.Publish(context.Background(), b.DB(), tbl, msgs...); err != nil {
			t.Fatal(err)
		}
		jobs := jobsByN(t, b.DB(), tbl)
		last := int64(sqlxbrokertest.MaxPassed + 2)
		f := runFake(func(ft sqlxbrokertest.TB) { sqlxbrokertest.NewRowLockDelivery(ft, b, tbl, jobs[last].ID) })
		wantFailure(t, f, fmt.Sprintf("more than %d ready rows", sqlxbrokertest.MaxPassed), "MaxPassed")
		d := sqlxbrokertest.NewRowLockDelivery(t, b, tbl, jobs[last-1].ID)
		var j job
		if err := d.Scan(&j); err != nil || j.N != last-1 {
			t.Errorf("claimed the row with n %d (%v), want %d", j.N, err, last-1)
		}
		d.Succeed()
		after := jobsByN(t, b.DB(), tbl)
		for n, j := range after {
			if j.Attempt != 1 {
				t.Errorf("job %d passed on the way has attempt %d, want 1", n, j.Attempt)
			}
		}
		if _, ok := after[last-1]; ok || len(after) != len(msgs)-1 {
			t.Errorf("%d jobs left (job %d among them: %v); want all but the one completed", len(after), last-1, ok)
		}
	})
}
