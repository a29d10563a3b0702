package mysql_test

import (
	"context"
	"testing"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	sxbforms "github.com/sqlxbroker/sqlxbroker/forms"
)

// TestKeySessionLockWaitReset: the advisory key session limits its lock
// waits (innodb_lock_wait_timeout, core.AdvisoryLocker.LockWaitLimit) only while it
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
