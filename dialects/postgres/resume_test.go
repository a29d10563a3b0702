package postgres_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
)

// TestResumeAfterSessionLoss terminates every session of a running
// subscription (pg_terminate_backend, as a failover or an administrator
// would) while deliveries are in work, in each form: the subscription must
// reconnect and go on claiming, the rows in work when their sessions died
// must come back and complete, and no row may complete twice.
func TestResumeAfterSessionLoss(t *testing.T) {
	for _, fc := range formCases {
		t.Run(fc.name, func(t *testing.T) {
			app := uniq("sxbresume_")
			db, admin := openDB(t, app), openDB(t, "")
			b, ba := openBroker(t, db), openBroker(t, admin)
			tbl := fc.table(uniq("sxb_resume_"), time.Second)
			createTable(t, ba, tbl)
			const batch, blocked = 12, 4
			publish(t, ba, tbl, accounts(0, batch))

			var mu sync.Mutex
			completed := map[int64]int{}
			inWork := 0
			gate := make(chan struct{})
			h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
				mu.Lock()
				inWork++
				first := inWork <= blocked
				mu.Unlock()
				if first {
					<-gate // in work while the sessions die
				}
				return nil
			}
			s, err := b.Subscribe(context.Background(), tbl, h, sqlxbroker.SubscribeParams{
				Concurrency: blocked, PollInterval: 200 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
					if err == nil && o.Kind == sqlxbroker.Succeeded {
						mu.Lock()
						completed[idOf(d)]++
						mu.Unlock()
					}
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer stopAll(t, []*sqlxbroker.Subscription{s}) // on failure; Stop is idempotent
			waitFor(t, 10*time.Second, fmt.Sprintf("%d deliveries in work", blocked), func() bool {
				mu.Lock()
				defer mu.Unlock()
				return inWork >= blocked
			})
			killSessions(t, admin, app)
			close(gate)
			publish(t, ba, tbl, accounts(batch, batch))
			waitFor(t, 30*time.Second, "every row to complete after the sessions died", func() bool {
				return count(t, admin, tbl.Name) == 0
			})
			stopAll(t, []*sqlxbroker.Subscription{s}) // waits for every completion and its OnOutcome
			mu.Lock()
			defer mu.Unlock()
			for id, n := range completed {
				if n != 1 {
					t.Errorf("row %d completed %d times", id, n)
				}
			}
			if len(completed) != 2*batch {
				t.Errorf("%d rows completed, want %d", len(completed), 2*batch)
			}
			t.Logf("%s: %+v", fc.name, s.Stats())
		})
	}
}
