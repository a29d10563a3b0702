package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
)

// TestLeaseClaimsByAddress: once a lease subscription has started on a
// plain table (the dialect's Start), its claims find the rows they locked
// by address: the claim scans the primary key once (the sub-select), not
// again to find the rows to update, and still takes the first rows in
// order, their attempt counted and the deadline written. Before Start and
// after its stop, the claim finds the rows through the key again. A child
// table made after a start, its rows at the same addresses as the claimed
// ones, is left alone.
func TestLeaseClaimsByAddress(t *testing.T) {
	db := openDSN(dsn(t))(t)
	ctx := context.Background()
	p := leaseTable(t, db, "sxb_tid", 100)
	// claim takes 10 rows in a transaction it rolls back, and returns the
	// primary key's index scans the claim made.
	claim := func(what string) int64 {
		t.Helper()
		tx := db.MustBegin()
		defer tx.Rollback()
		// The index's scans so far: the counts since the server last
		// took them in, which it does between transactions, not in one.
		scans := func() (n int64) {
			if err := tx.Get(&n, `SELECT pg_stat_get_xact_numscans('sxb_tid_pkey'::regclass)`); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := scans()
		deadline := time.Now().Add(time.Minute).Truncate(time.Microsecond)
		where, args := p.Ready(p.Alias, core.Now())
		rows, err := postgres.Dialect{}.ClaimLeases(ctx, tx, &core.LeaseClaimParams{Plan: p, Where: where, Args: args,
			Limit: 10, Deadline: p.Time(deadline)})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		var ids []int64
		for rows.Next() {
			m := map[string]any{}
			if err := rows.MapScan(m); err != nil {
				t.Fatal(err)
			}
			if m["attempt"].(int64) != 2 || !m["locked_until"].(time.Time).Equal(deadline) {
				t.Errorf("%s: row %v: attempt %v, lease %v, want 2 and %v", what, m["id"], m["attempt"], m["locked_until"], deadline)
			}
			ids = append(ids, m["id"].(int64))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		if !slices.Equal(ids, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) {
			t.Fatalf("%s: claimed %v, want rows 1 to 10 in order", what, ids)
		}
		return scans() - before
	}
	// Through the key, the update's look-ups are one scan or more (eleven
	// for ten ids on PostgreSQL 15); by address there are none.
	if got := claim("before Start"); got < 2 {
		t.Errorf("before Start: %d scans of the primary key, want 2 or more (the sub-select and the update)", got)
	}
	stop, err := postgres.Dialect{}.Start(ctx, core.NewPool(db, postgres.Dialect{}), p)
	if err != nil {
		t.Fatal(err)
	}
	if stop == nil {
		t.Fatal("Start of a lease subscription on a plain table returned no stop")
	}
	if got := claim("started"); got != 1 {
		t.Errorf("started: %d scans of the primary key, want 1 (the sub-select; the update by address)", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := claim("stopped"); got < 2 {
		t.Errorf("stopped: %d scans of the primary key, want 2 or more", got)
	}
	// A child table made while a subscription runs, its rows ready and at
	// the addresses of the parent's first rows: the claim (whose rows are
	// every row its update changed) still takes rows 1 to 10 alone.
	stop, err = postgres.Dialect{}.Start(ctx, core.NewPool(db, postgres.Dialect{}), p)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	db.MustExec(`CREATE TABLE sxb_tid_child () INHERITS (sxb_tid)`)
	defer db.Exec(`DROP TABLE sxb_tid_child`)
	db.MustExec(`INSERT INTO sxb_tid_child (id, n) SELECT 1000 + g, g FROM generate_series(1, 10) g`)
	var shared int
	if err := db.Get(&shared, `SELECT count(*) FROM ONLY sxb_tid p JOIN sxb_tid_child c ON p.ctid = c.ctid WHERE p.id <= 10`); err != nil {
		t.Fatal(err)
	}
	if shared != 10 {
		t.Fatalf("%d of the parent's first 10 rows share an address with a child's row, want 10: the check shows nothing", shared)
	}
	claim("started again, a child table made since")
}

// TestLeaseClaimsPartitioned: a lease subscription on a partitioned table,
// whose partitions hold rows at the same addresses (each partition's first
// row is at its page 0, item 1), delivers the ready rows of one partition
// and leaves the other partition's rows, leased to someone else (within
// the table's lease), as they were: a claim by address would update those
// too.
func TestLeaseClaimsPartitioned(t *testing.T) {
	db := openDSN(dsn(t))(t)
	ctx := context.Background()
	b, err := sqlxbroker.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = db.Exec(`DROP TABLE IF EXISTS sxb_parts`)
	db.MustExec(`CREATE TABLE sxb_parts (id bigint NOT NULL, attempt integer NOT NULL DEFAULT 1,
		locked_until timestamptz DEFAULT '1970-01-01 00:00:00+00', n bigint) PARTITION BY RANGE (id)`)
	defer db.Exec(`DROP TABLE sxb_parts`)
	db.MustExec(`CREATE TABLE sxb_parts_1 PARTITION OF sxb_parts FOR VALUES FROM (1) TO (1001)`)
	db.MustExec(`CREATE TABLE sxb_parts_2 PARTITION OF sxb_parts FOR VALUES FROM (1001) TO (2001)`)
	db.MustExec(`CREATE INDEX ON sxb_parts_1 (id)`)
	db.MustExec(`CREATE INDEX ON sxb_parts_2 (id)`)
	const n = 50
	db.MustExec(`INSERT INTO sxb_parts (id, locked_until, n) SELECT g, now() + interval '50 minutes', g FROM generate_series(1, $1) g`, n)
	db.MustExec(`INSERT INTO sxb_parts (id, n) SELECT 1000 + g, g FROM generate_series(1, $1) g`, n)
	var shared int
	if err := db.Get(&shared, `SELECT count(*) FROM sxb_parts_1 a JOIN sxb_parts_2 b ON a.ctid = b.ctid`); err != nil {
		t.Fatal(err)
	}
	if shared != n {
		t.Fatalf("%d rows of the two partitions share an address, want %d: the test shows nothing", shared, n)
	}
	tb := sqlxbroker.Table{Name: "sxb_parts", LockedUntil: "locked_until", Lease: time.Hour}
	var mu sync.Mutex
	got := map[int64]int{}
	all := make(chan struct{})
	s, err := b.Subscribe(ctx, tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		got[d.ID().(int64)]++
		if len(got) == n {
			close(all)
		}
		return nil
	}, sqlxbroker.SubscribeParams{Concurrency: 8, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-all:
	case <-time.After(30 * time.Second):
		t.Error("the ready partition's rows were not all delivered within 30 s")
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for id, k := range got {
		if id <= 1000 || k != 1 {
			t.Errorf("row %d delivered %d times; want each of rows 1001-%d once, no other", id, k, 1000+n)
		}
	}
	mu.Unlock()
	var left, changed int
	if err := db.Get(&left, `SELECT count(*) FROM sxb_parts_2`); err != nil {
		t.Fatal(err)
	}
	if err := db.Get(&changed, `SELECT count(*) FROM sxb_parts_1 WHERE attempt <> 1 OR locked_until < now() + interval '40 minutes'`); err != nil {
		t.Fatal(err)
	}
	if left != 0 || changed != 0 {
		t.Errorf("%d rows left in the ready partition (want 0), %d rows of the leased one changed (want 0)", left, changed)
	}
}

// TestLeaseClaimByAddressPassesOverUpdated: a row another transaction
// updates and commits after the claim's snapshot, while the claim is
// scanning (held at that row by a lock the test holds), is passed over by
// the claim by address: the claim takes the other rows, and the row stays
// as that transaction left it, not leased. Never a row without its lock.
func TestLeaseClaimByAddressPassesOverUpdated(t *testing.T) {
	db := openDSN(dsn(t))(t)
	ctx := context.Background()
	p := leaseTable(t, db, "sxb_tid_epq", 5)
	stop, err := postgres.Dialect{}.Start(ctx, core.NewPool(db, postgres.Dialect{}), p)
	if err != nil || stop == nil {
		t.Fatalf("Start: %v (stop %v)", err, stop != nil)
	}
	defer stop()
	holder, err := db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	const key = 7_424_242
	if _, err := holder.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		t.Fatal(err)
	}
	type result struct {
		ids []int64
		err error
	}
	got := make(chan result, 1)
	go func() {
		where, args := p.Ready(p.Alias, core.Now())
		// The scan waits at row 1, after the statement's snapshot.
		where += fmt.Sprintf(" AND (%s.%s <> 1 OR pg_advisory_xact_lock(%d) IS NOT NULL)", p.Alias, p.QID, key)
		rows, err := postgres.Dialect{}.ClaimLeases(ctx, db, &core.LeaseClaimParams{Plan: p, Where: where, Args: args,
			Limit: 3, Deadline: p.Time(time.Now().Add(time.Minute))})
		if err != nil {
			got <- result{err: err}
			return
		}
		defer rows.Close()
		var r result
		for rows.Next() {
			m := map[string]any{}
			if r.err = rows.MapScan(m); r.err != nil {
				break
			}
			r.ids = append(r.ids, m["id"].(int64))
		}
		if r.err == nil {
			r.err = rows.Err()
		}
		got <- r
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		if err := db.Get(&waiting, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND query LIKE '%sxb_tid_epq%'`); err != nil {
			t.Fatal(err)
		}
		if waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the claim did not reach row 1 within 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	db.MustExec(`UPDATE sxb_tid_epq SET n = n + 100 WHERE id = 1`)
	if _, err := holder.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !slices.Equal(r.ids, []int64{2, 3}) {
		t.Errorf("claimed %v, want rows 2 and 3 (row 1 passed over)", r.ids)
	}
	var n, attempt int64
	var leased bool
	if err := db.QueryRow(`SELECT n, attempt, locked_until > now() FROM sxb_tid_epq WHERE id = 1`).Scan(&n, &attempt, &leased); err != nil {
		t.Fatal(err)
	}
	if n != 101 || attempt != 1 || leased {
		t.Errorf("row 1: n %d, attempt %d, leased %v; want 101, 1, false (as the other transaction left it)", n, attempt, leased)
	}
}

// leaseTable makes a lease table name (CreateTable, a bigint column n,
// dropped when t ends) holding n rows, ids 1 to n with n equal to the id,
// and returns its plan.
func leaseTable(t *testing.T, db *sqlx.DB, name string, n int) *core.Plan {
	t.Helper()
	ctx := context.Background()
	b, err := sqlxbroker.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	tb := sqlxbroker.Table{Name: name, LockedUntil: "locked_until", Lease: time.Minute}
	_, _ = db.Exec(`DROP TABLE IF EXISTS ` + name)
	if err := b.CreateTable(ctx, tb, [2]string{"n", "bigint"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec(`DROP TABLE IF EXISTS ` + name) })
	msgs := make([]any, n)
	for i := range msgs {
		msgs[i] = map[string]any{"n": i + 1}
	}
	if err := b.Publish(ctx, db, tb, msgs...); err != nil {
		t.Fatal(err)
	}
	p, err := b.Plan(tb)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
