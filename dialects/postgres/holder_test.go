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
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
)

// TestAdvisoryHolderLost terminates the one session that holds an advisory
// subscription's keys while its handlers run: every handler's context must
// be cancelled (the holder's ping notices within about a second), their
// completions must change nothing (core.ErrLeaseLost), and the rows must
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
		if !errors.Is(err, core.ErrLeaseLost) {
			t.Errorf("a lost delivery's completion returned %v, want core.ErrLeaseLost", err)
		}
	}
}

// TestAdvisoryCompletionBlocked completes an advisory delivery whose row
// an application's transaction holds FOR UPDATE for longer than a key
// session statement may run (10 s). The driver ends the session to cancel
// the statement (lib/pq marks the connection bad, as go-sql-driver closes
// it), so the keys go with it: the blocked completion fails within about
// the statement's time, the other delivery of the session is lost at once
// (its completion changes nothing), and both rows come back, with their
// attempt counted, to complete once.
func TestAdvisoryCompletionBlocked(t *testing.T) {
	db, admin := openDB(t, ""), openDB(t, "")
	b, ba := openBroker(t, db), openBroker(t, admin)
	tbl := sqlxbroker.Table{Name: uniq("sxb_blocked_"), AdvisoryLock: "acct-{account}"}
	createTable(t, ba, tbl)
	publish(t, ba, tbl, accounts(0, 2))
	f := startForm(t, b, tbl)
	cs, err := f.Claim(context.Background(), 2)
	if err != nil || len(cs) != 2 {
		t.Fatalf("claimed %d rows (%v), want 2", len(cs), err)
	}
	tx, err := admin.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var id int64
	if err := tx.Get(&id, "SELECT id FROM "+postgres.Dialect{}.QuoteIdent(tbl.Name)+" WHERE id = $1 FOR UPDATE", cs[0].Delivery().ID()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- cs[0].Complete(context.Background(), core.Outcome{Kind: core.Succeeded}) }()
	select {
	case err = <-done:
	case <-time.After(25 * time.Second):
		t.Fatal("a completion blocked on a row lock did not return within 25 s")
	}
	took := time.Since(start)
	if err == nil || took > 15*time.Second {
		t.Errorf("the blocked completion returned %v after %v, want a failure after about 10 s", err, took)
	}
	select {
	case <-cs[1].Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the key session ended, but its other delivery was not lost")
	}
	if err := cs[1].Complete(context.Background(), core.Outcome{Kind: core.Succeeded}); !errors.Is(err, core.ErrLeaseLost) {
		t.Errorf("the lost delivery's completion returned %v, want core.ErrLeaseLost", err)
	}
	tx.Rollback()
	if n := count(t, admin, tbl.Name); n != 2 {
		t.Errorf("%d rows left, want 2: neither completion may stand", n)
	}
	again, err := f.Claim(context.Background(), 2)
	if err != nil || len(again) != 2 {
		t.Fatalf("claimed again %d rows (%v), want both", len(again), err)
	}
	for _, c := range again {
		if a := c.Delivery().Attempt(); a != 2 {
			t.Errorf("row %v claimed again at attempt %d, want 2", c.Delivery().ID(), a)
		}
	}
	completeAll(t, again)
	if n := count(t, admin, tbl.Name); n != 0 {
		t.Errorf("%d rows left after their completions, want 0", n)
	}
}
