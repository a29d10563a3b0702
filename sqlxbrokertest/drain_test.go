package sqlxbrokertest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/sqlxbrokertest"
)

// TestDrainOutcomes drains a table whose handler succeeds, fails once, or
// fails for good depending on the job, and checks the counts, the handled
// IDs and what is left against what the jobs say. In the row-lock form
// (PostgreSQL, MariaDB) the handler also writes an audit row through
// Delivery.Tx: only the deliveries that succeeded leave one.
func TestDrainOutcomes(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db database, b *sqlxbroker.Broker) {
		ctx := context.Background()
		// A retry is ready at once (RetryDelay 0), so the drain sees it.
		desc := sqlxbroker.Table{ReadyAt: "ready_at", DeadAt: "dead_at", MaxAttempts: 3}
		if !db.rowLock {
			desc.LockedUntil = "locked_until"
		}
		tbl := newTable(t, b, desc, [2]string{"n", "bigint"})
		auditTable := newAudit(t, b)
		qAudit := b.Dialect().QuoteIdent(auditTable)

		const jobs = 20
		var msgs []any
		for n := 1; n <= jobs; n++ {
			msgs = append(msgs, map[string]any{"n": n})
		}
		permanent := func(n int64) bool { return n%5 == 0 }
		flaky := func(n int64) bool { return n%7 == 0 } // fails its first attempt
		fail := func(n int64, attempt int) error {
			switch {
			case permanent(n):
				return sqlxbroker.Permanent(fmt.Errorf("job %d is bad", n))
			case flaky(n) && attempt == 1:
				return fmt.Errorf("job %d: try again", n)
			}
			return nil
		}
		h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
			var j job
			if err := d.Scan(&j); err != nil {
				return err
			}
			if db.rowLock {
				tx, err := d.Tx()
				if err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO "+qAudit+" (job, note) VALUES (?, ?)"), j.N, "sent"); err != nil {
					return err
				}
			}
			return fail(j.N, d.Attempt())
		}
		res, err := sqlxbrokertest.Drain(ctx, t, sqlxbrokertest.DrainParams{Broker: b, Table: tbl, Handler: h, Messages: msgs,
			Timeout: 30 * time.Second, Subscribe: sqlxbroker.SubscribeParams{Concurrency: 4, RetryDelay: func(int, error) time.Duration { return 0 }}})
		if err != nil {
			t.Fatal(err)
		}

		// What the jobs say should happen.
		var wantOK, wantDead, wantRetried int64
		var okNs []int64
		for n := int64(1); n <= jobs; n++ {
			switch {
			case permanent(n):
				wantDead++
			case flaky(n):
				wantRetried++
				wantOK++
				okNs = append(okNs, n)
			default:
				wantOK++
				okNs = append(okNs, n)
			}
		}
		s := res.Stats
		if s.Succeeded != wantOK || s.Dead != wantDead || s.Retried != wantRetried || s.Claimed != jobs+wantRetried {
			t.Errorf("stats %+v; want succeeded %d, dead %d, retried %d, claimed %d", s, wantOK, wantDead, wantRetried, jobs+wantRetried)
		}
		if len(res.Handled) != int(s.Claimed) {
			t.Errorf("%d deliveries handled, %d claimed", len(res.Handled), s.Claimed)
		}
		if got := len(res.IDs(sqlxbroker.Succeeded)); got != int(wantOK) {
			t.Errorf("%d succeeded IDs, want %d", got, wantOK)
		}
		for _, hd := range res.Handled {
			if hd.CompleteErr != nil {
				t.Errorf("completion of %v: %v", hd.ID, hd.CompleteErr)
			}
			if (hd.Kind == sqlxbroker.Succeeded) != (hd.Err == nil) {
				t.Errorf("delivery %v: outcome %s with handler error %v", hd.ID, hd.Kind, hd.Err)
			}
		}
		if res.Left.Ready != 0 || res.Left.InWork != 0 || res.Left.Scheduled != 0 || res.Left.Dead != wantDead {
			t.Errorf("left %+v; want nothing ready or in work, %d dead", res.Left, wantDead)
		}
		left := jobsByN(t, b.DB(), tbl)
		for n := int64(1); n <= jobs; n++ {
			if _, kept := left[n]; kept != permanent(n) {
				t.Errorf("job %d kept in the table: %v; want %v (kept dead only when it failed for good)", n, kept, permanent(n))
			}
		}
		if db.rowLock {
			var got []int64
			for _, a := range audits(t, b.DB(), auditTable) {
				got = append(got, a.Job)
			}
			slices.Sort(got)
			if !slices.Equal(got, okNs) {
				t.Errorf("audit rows for jobs %v; want those of the jobs that succeeded, %v (failed deliveries' writes roll back)", got, okNs)
			}
		}
	})
}

// TestDrainDeadline: a handler that never finishes makes Drain fail at
// its deadline, saying how many rows are left in which state.
func TestDrainDeadline(t *testing.T) {
	onSQLite(t, func(t *testing.T, b *sqlxbroker.Broker) {
		ctx := context.Background()
		tbl := newTable(t, b, sqlxbroker.Table{LockedUntil: "locked_until"}, [2]string{"n", "bigint"})
		started := make(chan struct{}, 3)
		h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
			started <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		}
		begin := time.Now()
		res, err := sqlxbrokertest.Drain(ctx, t, sqlxbrokertest.DrainParams{Broker: b, Table: tbl, Handler: h,
			Messages: []any{map[string]any{"n": 1}, map[string]any{"n": 2}, map[string]any{"n": 3}},
			Timeout:  500 * time.Millisecond, Subscribe: sqlxbroker.SubscribeParams{Concurrency: 1}})
		if err == nil {
			t.Fatal("Drain returned no error with a handler that never finishes")
		}
		if took := time.Since(begin); took < 500*time.Millisecond {
			t.Errorf("Drain gave up after %v, before its 500ms deadline", took)
		}
		if len(started) == 0 {
			t.Error("the handler never ran")
		}
		c, cerr := b.Counts(ctx, tbl)
		if cerr != nil {
			t.Fatal(cerr)
		}
		if c.Ready+c.InWork != 3 || res.Left.Ready != c.Ready || res.Left.InWork != c.InWork {
			t.Errorf("counts after the deadline %+v, result's %+v; want 3 rows left, the same in both", c, res.Left)
		}
		t.Log(err)
		for _, part := range []string{"deadline (500ms) passed", tbl.Name, "1 in work (1 deliveries in flight)", fmt.Sprintf("after the stop: %d ready, %d in work", c.Ready, c.InWork)} {
			if !strings.Contains(err.Error(), part) {
				t.Errorf("error %q lacks %q", err, part)
			}
		}
		if res.Stats.Released != 1 || res.Stats.Succeeded != 0 {
			t.Errorf("stats %+v; want the one delivery in work released", res.Stats)
		}
	})
}

// TestDrainRefusesBadParams: bad parameters are errors naming the problem,
// before anything is published.
func TestDrainRefusesBadParams(t *testing.T) {
	onSQLite(t, func(t *testing.T, b *sqlxbroker.Broker) {
		ctx := context.Background()
		tbl := newTable(t, b, sqlxbroker.Table{LockedUntil: "locked_until"}, [2]string{"n", "bigint"})
		ok := func(context.Context, *sqlxbroker.Delivery) error { return nil }
		for _, c := range []struct {
			p    sqlxbrokertest.DrainParams
			want string
		}{
			{sqlxbrokertest.DrainParams{Table: tbl, Handler: ok}, "Broker is nil"},
			{sqlxbrokertest.DrainParams{Broker: b, Table: tbl}, "Handler is nil"},
			{sqlxbrokertest.DrainParams{Broker: b, Table: tbl, Handler: ok, Timeout: -time.Second}, "negative Timeout"},
			{sqlxbrokertest.DrainParams{Broker: b, Table: sqlxbroker.Table{Name: tbl.Name, LockedUntil: "lease_col"}, Handler: ok}, `"lease_col" does not exist`},
			{sqlxbrokertest.DrainParams{Broker: b, Table: tbl, Handler: ok, Messages: []any{map[string]any{"n": 1}, 7}}, "message 1"},
		} {
			_, err := sqlxbrokertest.Drain(ctx, t, c.p)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Drain(%+v): %v; want an error saying %q", c.p, err, c.want)
			}
		}
		if n := len(sqlxbrokertest.Published[map[string]any](t, b.DB(), tbl)); n != 0 {
			t.Errorf("%d rows published by refused drains", n)
		}
		var e *sqlxbroker.TableError
		_, err := sqlxbrokertest.Drain(ctx, t, sqlxbrokertest.DrainParams{Broker: b, Table: sqlxbroker.Table{Name: "bad name"}, Handler: ok})
		if !errors.As(err, &e) {
			t.Errorf("a bad description: %v; want a *sqlxbroker.TableError", err)
		}
	})
}

// TestDrainLeavesScheduledRetries: a failure retried later is not
// claimable, so the drain ends with the row scheduled.
func TestDrainLeavesScheduledRetries(t *testing.T) {
	onSQLite(t, func(t *testing.T, b *sqlxbroker.Broker) {
		tbl := newTable(t, b, sqlxbroker.Table{LockedUntil: "locked_until", ReadyAt: "ready_at"}, [2]string{"n", "bigint"})
		msgs := []any{map[string]any{"n": 1}, map[string]any{"n": 2}}
		res, err := sqlxbrokertest.Drain(context.Background(), t, sqlxbrokertest.DrainParams{Broker: b, Table: tbl, Messages: msgs,
			Handler: func(context.Context, *sqlxbroker.Delivery) error { return errors.New("not yet") }})
		if err != nil {
			t.Fatal(err)
		}
		n := int64(len(msgs))
		if res.Stats.Retried != n || res.Left.Scheduled != n || res.Left.Ready != 0 || len(res.IDs(sqlxbroker.Retry)) != len(msgs) {
			t.Errorf("stats %+v, left %+v; want %d retried and scheduled", res.Stats, res.Left, n)
		}
	})
}
