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
	"github.com/sqlxbroker/sqlxbroker/core"
)

// TestAdvisoryHolderLost terminates the one session that holds an advisory
// subscription's keys while its handlers run: every handler's context must
// be cancelled (the holder's ping notices within about a second), their
// completions must change nothing (core.ErrLeaseLost), and the rows must
// come back with the attempt counted and complete once.
func TestAdvisoryHolderLost(t *testing.T) {
	db, admin := openDB(t, ""), openDB(t, "")
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
		OnOutcome: func(d *sqlxbroker.Delivery, o core.Outcome, err error) {
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
	if err := admin.Select(&holders, "SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"); err != nil {
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
		if !errors.Is(err, core.ErrLeaseLost) {
			t.Errorf("a lost delivery's completion returned %v, want core.ErrLeaseLost", err)
		}
	}
}
