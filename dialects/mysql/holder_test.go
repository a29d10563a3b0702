package mysql_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	sxbforms "github.com/sqlxbroker/sqlxbroker/forms"
)

// TestAdvisoryHolderLost kills the one connection that holds an advisory
// subscription's keys (found with IS_USED_LOCK) while its handlers run:
// every handler's context must be cancelled (the holder's ping notices
// within about a second), their completions must change nothing
// (sqlxbroker.ErrLeaseLost), and the rows must come back with the attempt counted
// and complete once.
func TestAdvisoryHolderLost(t *testing.T) {
	dsn := testDSN(t)
	admin := openDB(t, dsn)
	b := openBroker(t, openDB(t, dsn))
	tbl := newTable(t, b, sqlxbroker.Table{AdvisoryLock: "acct-{acct}"}, payload...)
	const n = 4
	var msgs []msg
	for i := range n {
		msgs = append(msgs, msg{N: int64(i), Acct: fmt.Sprint(i)})
	}
	publish(t, b, tbl, msgs...)

	var mu sync.Mutex
	cancelled, attempts := 0, map[int64][]int{}
	h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
		mu.Lock()
		attempts[nOf(t, d)] = append(attempts[nOf(t, d)], d.Attempt())
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
	s := subscribe(t, b, tbl, h, sqlxbroker.SubscribeParams{
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
	waitFor(t, 10*time.Second, "every row in work", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts) == n
	})
	holders := map[int64]bool{}
	for i := range n {
		var id *int64
		if err := admin.Get(&id, "SELECT IS_USED_LOCK(CONCAT(DATABASE(), ':', ?))", fmt.Sprint("acct-", i)); err != nil {
			t.Fatal(err)
		}
		if id == nil {
			t.Fatalf("key acct-%d is not held while its row is in work", i)
		}
		holders[*id] = true
	}
	if len(holders) != 1 {
		t.Fatalf("%d connections hold the subscription's %d keys, want 1", len(holders), n)
	}
	for id := range holders {
		if _, err := admin.Exec(fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "every handler cancelled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return cancelled == n
	})
	waitFor(t, 20*time.Second, "every row completed", func() bool { return count(t, admin, tbl, "1=1") == 0 })
	stop(t, s)
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

// TestKeySessionLockWaitReset: the advisory key session limits its lock
// waits (innodb_lock_wait_timeout, core.LockWaitLimiter) only while it
// holds keys; back in the pool, every connection has the global value
// again.
func TestKeySessionLockWaitReset(t *testing.T) {
	ctx := context.Background()
	dsn := testDSN(t)
	admin, db := openDB(t, dsn), openDB(t, dsn)
	db.SetMaxOpenConns(sxbforms.AdvisoryConnections)
	b := openBroker(t, db)
	tbl := newTable(t, openBroker(t, admin), sqlxbroker.Table{AdvisoryLock: "acct-{acct}"}, payload...)
	publish(t, b, tbl, msg{N: 0, Acct: "a"}, msg{N: 1, Acct: "b"}, msg{N: 2, Acct: "c"})
	f := startForm(t, b, tbl)
	cs, err := f.Claim(ctx, 3)
	if err != nil || len(cs) != 3 {
		t.Fatalf("claimed %d rows (%v), want 3", len(cs), err)
	}
	for _, c := range cs {
		if err := conformance.Complete(ctx, c, sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range sxbforms.AdvisoryConnections {
		c, err := db.Connx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var session, global int
		if err := c.QueryRowxContext(ctx, "SELECT @@SESSION.innodb_lock_wait_timeout, @@GLOBAL.innodb_lock_wait_timeout").Scan(&session, &global); err != nil {
			t.Fatal(err)
		}
		if session != global {
			t.Errorf("pool connection %d: innodb_lock_wait_timeout %d after the key session went back, want the global %d", i, session, global)
		}
	}
}
