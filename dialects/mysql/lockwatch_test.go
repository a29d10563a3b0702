package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
)

// lockWaitReport is how long an InnoDB lock wait lasts before the lock
// watch (watchLockWaits) reports it: well inside the server's default
// innodb_lock_wait_timeout (50 s), after which the waiting statement
// fails with error 1205 and the holder can no longer be told.
const lockWaitReport = 20 * time.Second

// watchLockWaits watches the server at dsn until the test ends: every
// transaction that has waited for a row lock longer than after is
// reported once, through t.Logf, with what the server says of the wait
// (the transactions, the waits and the locks they are on, the sessions,
// and InnoDB's status). A statement of the suite that fails with "Lock
// wait timeout exceeded" then names the transaction and the lock that
// held it, which the error alone does not.
//
// The watch is best effort: a query the server does not have (MySQL 8
// moved the lock tables to performance_schema) is reported as such and
// the others still run.
func watchLockWaits(t *testing.T, dsn string, after time.Duration) {
	t.Helper()
	db, err := sqlx.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("lock watch: %v", err)
	}
	db.SetMaxOpenConns(1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		lockWatch(ctx, db, after, func(s string) { t.Logf("lock watch: %s", s) })
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		db.Close()
	})
}

// lockWatch is watchLockWaits' loop on db, until ctx ends: what it finds
// goes to report.
func lockWatch(ctx context.Context, db *sqlx.DB, after time.Duration, report func(string)) {
	reported := map[string]bool{}
	tick := time.NewTicker(min(after/4, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ids, err := longWaits(ctx, db, after)
		if err != nil {
			if ctx.Err() == nil {
				report(err.Error())
			}
			continue
		}
		var fresh []string
		for _, id := range ids {
			if !reported[id] {
				reported[id] = true
				fresh = append(fresh, id)
			}
		}
		if len(fresh) > 0 {
			report(fmt.Sprintf("transaction(s) %s have waited over %v for a row lock; the server's view follows\n%s",
				strings.Join(fresh, ", "), after, lockReport(ctx, db)))
		}
	}
}

// longWaits returns the ids of the transactions waiting for a lock for
// longer than after. The server keeps the start of a wait to the second,
// so a wait is found up to a second after it passed after.
func longWaits(ctx context.Context, db *sqlx.DB, after time.Duration) ([]string, error) {
	var ids []string
	err := db.SelectContext(ctx, &ids, "SELECT trx_id FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' AND trx_wait_started < NOW() - INTERVAL ? SECOND",
		int(after.Seconds()))
	if err != nil {
		return nil, fmt.Errorf("read waiting transactions: %w", err)
	}
	return ids, nil
}

// lockReport is the server's view of its transactions and their locks,
// one titled table per query.
func lockReport(ctx context.Context, db *sqlx.DB) string {
	queries := []struct{ title, q string }{
		{"transactions", "SELECT trx_id, trx_state, trx_started, trx_wait_started, trx_requested_lock_id, trx_mysql_thread_id, trx_isolation_level, trx_rows_locked, trx_query FROM information_schema.INNODB_TRX ORDER BY trx_started"},
		{"lock waits (MariaDB)", "SELECT * FROM information_schema.INNODB_LOCK_WAITS"},
		{"locks waited for and held by the waited-for (MariaDB)", "SELECT * FROM information_schema.INNODB_LOCKS"},
		{"lock waits (MySQL 8)", "SELECT * FROM performance_schema.data_lock_waits"},
		{"sessions", "SELECT id, user, db, command, time, state, info FROM information_schema.PROCESSLIST ORDER BY id"},
		{"InnoDB status", "SHOW ENGINE INNODB STATUS"},
	}
	var b strings.Builder
	for _, q := range queries {
		fmt.Fprintf(&b, "-- %s\n", q.title)
		if err := writeRows(ctx, &b, db, q.q); err != nil {
			fmt.Fprintf(&b, "(not available: %v)\n", err)
		}
	}
	return b.String()
}

// writeRows writes the result of q as a header line and a line per row,
// columns separated by " | ".
func writeRows(ctx context.Context, b *strings.Builder, db *sqlx.DB, q string) error {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return err
	}
	b.WriteString(strings.Join(cols, " | ") + "\n")
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return err
		}
		out := make([]string, len(cols))
		for i, v := range vals {
			out[i] = "NULL"
			if v.Valid {
				out[i] = v.String
			}
		}
		b.WriteString(strings.Join(out, " | ") + "\n")
	}
	return rows.Err()
}

// TestLockWatch: a session that holds a row lock and another that waits
// for it; the watch reports the wait within a few seconds of the report
// time, naming the waiting statement, the table, and the holder's session.
func TestLockWatch(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, testDSN(t))
	const tbl = "sxb_lockwatch"
	for _, q := range []string{"DROP TABLE IF EXISTS " + tbl, "CREATE TABLE " + tbl + " (id BIGINT PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB", "INSERT INTO " + tbl + " VALUES (1, 0)"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + tbl) })

	holder, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	var holderID int64
	if err := holder.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&holderID); err != nil {
		t.Fatal(err)
	}
	hold, err := holder.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if _, err := hold.ExecContext(ctx, "SELECT n FROM "+tbl+" WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}

	waiter, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	if _, err := waiter.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 30"); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := waiter.ExecContext(ctx, "UPDATE "+tbl+" SET n = n + 1 WHERE id = 1")
		waited <- err
	}()

	wctx, cancel := context.WithCancel(ctx)
	reports := make(chan string, 8)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lockWatch(wctx, db, time.Second, func(s string) { reports <- s })
	}()
	defer func() { cancel(); <-done }()

	var got string
	select {
	case got = <-reports:
	case err := <-waited:
		t.Fatalf("the waiting UPDATE ended before the watch reported it: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("no report within 15 s of a lock wait of over 1 s")
	}
	for _, want := range []string{
		"have waited over 1s",
		"LOCK WAIT",
		"UPDATE " + tbl + " SET n = n + 1 WHERE id = 1",
		tbl,
		fmt.Sprint(holderID),
		"-- InnoDB status",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the report does not name %q:\n%s", want, got)
		}
	}
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Errorf("the waiting UPDATE after the holder rolled back: %v", err)
	}
	select {
	case again := <-reports:
		t.Errorf("the same wait reported twice:\n%s", again)
	default:
	}
}
