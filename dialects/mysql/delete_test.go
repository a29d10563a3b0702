package mysql_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
)

// TestDeleteReadyPassesRowsInWork: Delete of the ready rows of a small
// row-lock table, one row of it in work (locked by an open transaction,
// as a handler's delivery holds it), deletes the others at once and
// leaves that one. A DELETE over the list of ids is planned as a scan of
// so small a table, and would wait for the row in work (here for the
// session's lock wait timeout, then fail with error 1205).
func TestDeleteReadyPassesRowsInWork(t *testing.T) {
	dsn := withParams(testDSN(t), "innodb_lock_wait_timeout=3")
	db := openDB(t, dsn)
	b := openBroker(t, db)
	tbl := newTable(t, b, sqlxbroker.Table{}, payload...)
	ctx := context.Background()
	const rows = 30
	for i := range rows {
		publish(t, b, tbl, msg{N: int64(i)})
	}
	var held int64
	tx := db.MustBegin()
	defer tx.Rollback()
	if err := tx.Get(&held, "SELECT id FROM `"+tbl.Name+"` ORDER BY id LIMIT 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	ids := []any{}
	for i := int64(1); i < rows; i++ {
		ids = append(ids, held+i)
	}
	var plan string
	if err := db.QueryRow("EXPLAIN DELETE FROM `"+tbl.Name+"` WHERE id IN (?"+strings.Repeat(", ?", len(ids)-1)+")", ids...).Scan(new(any), new(any), new(any), &plan, new(any), new(any), new(any), new(any), new(any), new(any)); err != nil {
		t.Fatalf("explain: %v", err)
	}
	t.Logf("a DELETE of the other %d ids is planned as %q", len(ids), plan)
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	began := time.Now()
	n, err := b.Delete(dctx, tbl, sqlxbroker.DeleteParams{State: sqlxbroker.StateReady, Select: sqlxbroker.Select{All: true}})
	if err != nil {
		t.Fatalf("delete ready rows with one in work: %v (after %v)", err, time.Since(began).Round(time.Millisecond))
	}
	if n != rows-1 {
		t.Errorf("deleted %d rows, want %d (all but the one in work)", n, rows-1)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	var left []int64
	if err := db.Select(&left, "SELECT id FROM `"+tbl.Name+"`"); err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != held {
		t.Errorf("rows left %v, want only the one in work (%d)", left, held)
	}
}
