package postgres_test

import (
	"context"
	"testing"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/forms"
)

// TestKeySessionLockTimeoutReset: the advisory key session limits its
// lock waits (lock_timeout, core.AdvisoryLocker.LockWaitLimit) only while it holds keys;
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
