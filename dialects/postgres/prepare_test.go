package postgres_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
)

// TestPreparedRowLock drains a row-lock table, adds a column while its
// subscription runs, and drains again. Prepared, the claim statement's
// cached plan no longer matches the table ("cached plan must not change
// result type"): the claims that meet it fail, the statement is prepared
// again, and every row still completes exactly once. With NoPrepare no
// claim fails. The failures are what shows the statements were prepared.
func TestPreparedRowLock(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dialect postgres.Dialect
	}{{"prepared", postgres.Dialect{}}, {"NoPrepare", postgres.Dialect{NoPrepare: true}}} {
		t.Run(tc.name, func(t *testing.T) {
			db, admin := openDB(t, ""), openDB(t, "")
			b, ba := sqlxbroker.OpenDialect(db, tc.dialect), openBroker(t, admin)
			tbl := sqlxbroker.Table{Name: uniq("sxb_prep_")}
			createTable(t, ba, tbl)
			const n = 40
			publish(t, ba, tbl, accounts(0, n))
			var mu sync.Mutex
			done := map[int64]int{}
			var empty atomic.Int64 // claims that found nothing
			s, err := b.Subscribe(context.Background(), tbl, func(ctx context.Context, d *sqlxbroker.Delivery) error { return nil },
				sqlxbroker.SubscribeParams{Concurrency: 4, PollInterval: 20 * time.Millisecond, MinPollInterval: time.Millisecond,
					Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
					OnClaim: func(c sqlxbroker.ClaimInfo) {
						if c.Rows == 0 && c.Err == nil {
							empty.Add(1)
						}
					},
					OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
						if err == nil && o.Kind == sqlxbroker.Succeeded {
							mu.Lock()
							done[idOf(d)]++
							mu.Unlock()
						}
					}})
			if err != nil {
				t.Fatal(err)
			}
			defer stopAll(t, []*sqlxbroker.Subscription{s})
			waitFor(t, 20*time.Second, "the first rows completed", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(done) == n
			})
			// Two more claims that find nothing: the second began after
			// every worker was done, and a claim that finds nothing rolls
			// back the chained transactions kept for the next claims. A
			// claim on one of those after the change would fail, drop its
			// prepared statement and claim again unseen; the first claim
			// after the change then begins a transaction of its own, on a
			// connection that prepared the statement before, and fails.
			e0 := empty.Load()
			waitFor(t, 20*time.Second, "two idle claims", func() bool { return empty.Load() >= e0+2 })
			if _, err := admin.Exec("ALTER TABLE " + postgres.Dialect{}.QuoteIdent(tbl.Name) + " ADD COLUMN extra text"); err != nil {
				t.Fatal(err)
			}
			publish(t, ba, tbl, accounts(n, n))
			waitFor(t, 30*time.Second, "the rows published after the change completed", func() bool { return count(t, admin, tbl.Name) == 0 })
			stopAll(t, []*sqlxbroker.Subscription{s})
			st := s.Stats()
			mu.Lock()
			defer mu.Unlock()
			for id, k := range done {
				if k != 1 {
					t.Errorf("row %d completed %d times", id, k)
				}
			}
			if len(done) != 2*n {
				t.Errorf("%d rows completed, want %d", len(done), 2*n)
			}
			switch {
			case tc.dialect.NoPrepare && st.ClaimErrors != 0:
				t.Errorf("unprepared claims failed %d times after the change", st.ClaimErrors)
			case !tc.dialect.NoPrepare && st.ClaimErrors == 0:
				t.Errorf("no prepared claim met the changed table: were the statements prepared?")
			}
			t.Logf("%s: %+v", tc.name, st)
		})
	}
}
