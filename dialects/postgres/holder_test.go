package postgres_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/forms"
)

// TestAdvisoryHolderLost terminates the one session that holds an advisory
// subscription's keys while its handlers run: every handler's context must
// be cancelled (the holder's ping notices within about a second), their
// completions must change nothing (sqlxbroker.ErrLeaseLost), and the rows must
// come back with the attempt counted and complete once.
func TestAdvisoryHolderLost(t *testing.T) {
	app := uniq("sxbholder_")
	db, admin := openDB(t, app), openDB(t, "")
	b, ba := openBroker(t, db), openBroker(t, admin)
	tbl := sqlxbroker.Table{Name: uniq("sxb_holder_"), AdvisoryLock: "acct-{account}"}
	createTable(t, ba, tbl)
	const n = 4
	publish(t, ba, tbl, accounts(0, n))

	var mu sync.Mutex
	cancelled, attempts := 0, map[int64][]int{}
	h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
		mu.Lock()
		attempts[idOf(d)] = append(attempts[idOf(d)], d.Attempt())
		first := d.Attempt() == 1
		mu.Unlock()
		if !first {
			return nil
		}
		select {
		case <-ctx.Done():
			mu.Lock()
			cancelled++
			mu.Unlock()
			return ctx.Err()
		case <-time.After(30 * time.Second):
			return nil // the test fails below: the loss went unnoticed
		}
	}
	var lost []error
	s, err := b.Subscribe(context.Background(), tbl, h, sqlxbroker.SubscribeParams{
		Concurrency: n, PollInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
			if err != nil {
				mu.Lock()
				lost = append(lost, err)
				mu.Unlock()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, []*sqlxbroker.Subscription{s})
	waitFor(t, 10*time.Second, "every row in work", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts) == n
	})
	var holders []int
	if err := admin.Select(&holders, "SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND a.application_name = $1", app); err != nil {
		t.Fatal(err)
	}
	if len(holders) != 1 {
		t.Fatalf("%d sessions hold the subscription's %d keys, want 1", len(holders), n)
	}
	if _, err := admin.Exec("SELECT pg_terminate_backend($1)", holders[0]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "every handler cancelled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return cancelled == n
	})
	waitFor(t, 20*time.Second, "every row completed", func() bool { return count(t, admin, tbl.Name) == 0 })
	stopAll(t, []*sqlxbroker.Subscription{s})
	mu.Lock()
	defer mu.Unlock()
	for id, as := range attempts {
		if len(as) != 2 || as[1] != 2 {
			t.Errorf("row %d ran with attempts %v, want [1 2]", id, as)
		}
	}
	if st := s.Stats(); st.LeaseLost != n || st.Succeeded != n {
		t.Errorf("stats %+v: want %d lost and %d succeeded", st, n, n)
	}
	for _, err := range lost {
		if !errors.Is(err, sqlxbroker.ErrLeaseLost) {
			t.Errorf("a lost delivery's completion returned %v, want sqlxbroker.ErrLeaseLost", err)
		}
	}
}

// TestKeySessionLockTimeoutReset: the advisory key session limits its
// lock waits (lock_timeout, core.LockWaitLimiter) only while it holds keys;
// back in the pool, every connection has the session default again.
func TestKeySessionLockTimeoutReset(t *testing.T) {
	ctx := context.Background()
	db, admin := openDB(t, ""), openDB(t, "")
	db.SetMaxOpenConns(forms.AdvisoryConnections)
	b, ba := openBroker(t, db), openBroker(t, admin)
	tbl := sqlxbroker.Table{Name: uniq("sxb_reset_"), AdvisoryLock: "acct-{account}"}
	createTable(t, ba, tbl)
	publish(t, ba, tbl, accounts(0, 3))
	f := startForm(t, b, tbl)
	cs, err := f.Claim(ctx, 3)
	if err != nil || len(cs) != 3 {
		t.Fatalf("claimed %d rows (%v), want 3", len(cs), err)
	}
	completeAll(t, cs) // the last release gives the key session back
	var def string
	if err := admin.Get(&def, "SHOW lock_timeout"); err != nil {
		t.Fatal(err)
	}
	for i := range forms.AdvisoryConnections {
		c, err := db.Connx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var v string
		if err := c.QueryRowxContext(ctx, "SHOW lock_timeout").Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v != def {
			t.Errorf("pool connection %d: lock_timeout %q after the key session went back, want the default %q", i, v, def)
		}
	}
}
