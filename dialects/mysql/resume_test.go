package mysql_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	driver "github.com/go-sql-driver/mysql"
	"github.com/sqlxbroker/sqlxbroker"
)

// TestResumeAfterSessionLoss kills every connection of a running
// subscription (KILL CONNECTION, as a failover or an administrator would)
// while deliveries are in work, in each form: the subscription must
// reconnect and go on claiming, the rows in work when their connections
// died must come back and complete, and no row may complete twice. The
// subscription's pool uses a database of its own, so the test finds its
// connections by database and kills no one else's.
func TestResumeAfterSessionLoss(t *testing.T) {
	dsn := testDSN(t)
	admin := openDB(t, dsn)
	name := fmt.Sprintf("sxb_resume_%x", time.Now().UnixNano()&0xffffffff)
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec("DROP DATABASE IF EXISTS " + name) })
	cfg, err := driver.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = name
	killAll := func(t *testing.T) {
		var ids []int64
		if err := admin.Select(&ids, "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ?", name); err != nil {
			t.Fatal(err)
		}
		if len(ids) == 0 {
			t.Fatal("no connection to kill")
		}
		for _, id := range ids {
			_, _ = admin.Exec(fmt.Sprintf("KILL CONNECTION %d", id))
		}
		waitFor(t, 5*time.Second, "the killed connections to end", func() bool {
			var n int
			_ = admin.Get(&n, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = ? AND COMMAND <> 'Killed'", name)
			return n == 0
		})
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, fc := range forms() {
		t.Run(fc.name, func(t *testing.T) {
			b := openBroker(t, openDB(t, cfg.FormatDSN()))
			tb := fc.table
			if tb.LockedUntil != "" {
				tb.Lease = time.Second
			}
			tbl := newTable(t, b, tb, payload...)
			const batch, blocked = 12, 4
			msgs := func(from int) []msg {
				out := make([]msg, batch)
				for i := range out {
					out[i] = msg{N: int64(from + i), Acct: fmt.Sprint("a", from+i)}
				}
				return out
			}
			publish(t, b, tbl, msgs(0)...)
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
					<-gate // in work while the connections die
				}
				return nil
			}
			s := subscribe(t, b, tbl, h, sqlxbroker.SubscribeParams{
				Concurrency: blocked, PollInterval: 200 * time.Millisecond, Logger: quiet,
				OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
					if err == nil && o.Kind == sqlxbroker.Succeeded {
						mu.Lock()
						completed[nOf(t, d)]++
						mu.Unlock()
					}
				},
			})
			waitFor(t, 10*time.Second, fmt.Sprintf("%d deliveries in work", blocked), func() bool {
				mu.Lock()
				defer mu.Unlock()
				return inWork >= blocked
			})
			killAll(t)
			close(gate)
			publish(t, b, tbl, msgs(batch)...)
			waitFor(t, 30*time.Second, "every row to complete after the connections died", func() bool {
				return count(t, b.DB(), tbl, "1=1") == 0
			})
			stop(t, s) // waits for every completion and its OnOutcome
			mu.Lock()
			defer mu.Unlock()
			for n, c := range completed {
				if c != 1 {
					t.Errorf("row %d completed %d times", n, c)
				}
			}
			if len(completed) != 2*batch {
				t.Errorf("%d rows completed, want %d", len(completed), 2*batch)
			}
			t.Logf("%s: %+v", fc.name, s.Stats())
		})
	}
}
