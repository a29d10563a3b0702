package conformance

import (
	"context"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// BrokenRows: rows that break the table's contract are delivered, never
// stranded, and repaired by the next count:
//
//   - an attempt that is NULL, 0 or negative reads as a new row's 1, and a
//     failed delivery leaves 2 in the column;
//   - in the lease form, a deadline more than two leases ahead of the clock
//     (a clock that jumped, a hand-edited row) counts as expired, while a
//     live lease (within one lease) keeps its row;
//   - in the advisory form, rows whose key column is NULL share the key
//     the template renders with an empty value: they run one at a time.
//
// The NULL attempt is checked where the attempt column takes NULL: the
// suite's table drops NOT NULL from the dialect's DDL for it (the DDL the
// library recommends refuses NULL attempts).
func BrokenRows(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	db := b.DB()
	tb := tg.nullableAttempt(t, db, f)
	p, err := b.Plan(tb)
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	bodies := []string{"null", "zero", "negative", "dangling", "live", "nokey1", "nokey2"}
	for _, body := range bodies {
		publish(t, b, tb, msg{Acct: "k-" + body, Body: body})
	}
	set := func(body, assign string, args ...any) {
		t.Helper()
		q := p.Rebind("UPDATE " + p.QTable + " SET " + assign + " WHERE " + tg.Dialect.QuoteIdent("body") + " = ?")
		if _, err := db.Exec(q, append(args, body)...); err != nil {
			t.Fatalf("break row %q (%s): %v", body, assign, err)
		}
	}
	attempt := p.QAttempt
	nullable := true
	q := p.Rebind("UPDATE " + p.QTable + " SET " + attempt + " = NULL WHERE " + tg.Dialect.QuoteIdent("body") + " = ?")
	if _, err := db.Exec(q, "null"); err != nil {
		t.Logf("the attempt column refuses NULL (%v): NULL attempts cannot occur", err)
		nullable = false
		set("null", attempt+" = ?", -1)
	}
	set("zero", attempt+" = ?", 0)
	set("negative", attempt+" = ?", -7)
	want := map[string]bool{"null": true, "zero": true, "negative": true, "dangling": true, "live": true, "nokey1": true, "nokey2": true}
	if f == sqlxbroker.Lease {
		now := core.Now()
		set("dangling", p.QLockedUntil+" = ?", p.Time(now.Add(10*tb.LeaseDuration())))
		set("live", p.QLockedUntil+" = ?", p.Time(now.Add(tb.LeaseDuration())))
		want["live"] = false
	}
	if f == sqlxbroker.Advisory {
		set("nokey1", tg.Dialect.QuoteIdent("acct")+" = NULL")
		set("nokey2", tg.Dialect.QuoteIdent("acct")+" = NULL")
		want["nokey2"] = false // its key (the empty one) is held by nokey1
	}

	fm := form(t, b, tb)
	cs := claim(t, fm, 2*len(bodies))
	got := map[string]core.Claim{}
	for _, c := range cs {
		body := bodyOf(c)
		got[body] = c
		if a := sqlxbroker.NewDelivery(c).Attempt(); a != 1 {
			t.Errorf("row %q reports attempt %d, want 1", body, a)
		}
	}
	for _, body := range bodies {
		switch _, ok := got[body]; {
		case want[body] && !ok:
			t.Errorf("row %q was not claimed", body)
		case !want[body] && ok:
			t.Errorf("row %q was claimed, want it held", body)
		}
	}
	if f == sqlxbroker.Advisory {
		if c, ok := got["nokey1"]; ok && sqlxbroker.NewDelivery(c).Key() != "acct-" {
			t.Errorf("a NULL key column renders key %q, want \"acct-\"", sqlxbroker.NewDelivery(c).Key())
		}
	}
	// A failed delivery repairs the column: the next one reads 2.
	for body, c := range got {
		complete(t, c, sqlxbroker.Retry)
		if n := count(t, db, tg.Dialect, tb.Name, attempt+" = 2 AND "+tg.Dialect.QuoteIdent("body")+" = ?", body); n != 1 {
			t.Errorf("after row %q failed its attempt column is not 2", body)
		}
	}
	if !nullable {
		t.Logf("NULL attempts checked as -1")
	}
	// Every row comes back: the failed ones reading 2, the held ones (the
	// live lease once it runs out, the second NULL-key row once its key is
	// free) reading 1 on their first delivery.
	left := map[string]bool{}
	for _, body := range bodies {
		left[body] = true
	}
	WaitFor(t, 10*time.Second+2*tb.LeaseDuration(), "every row to come back and succeed", func() bool {
		for _, c := range claim(t, fm, 2*len(bodies)) {
			body := bodyOf(c)
			if !left[body] {
				t.Errorf("row %q claimed again after it succeeded", body)
			}
			wantAttempt := 2
			if !want[body] {
				wantAttempt = 1
			}
			if a := sqlxbroker.NewDelivery(c).Attempt(); a != wantAttempt {
				t.Errorf("row %q reports attempt %d on its next delivery, want %d", body, a, wantAttempt)
			}
			complete(t, c, sqlxbroker.Succeeded)
			delete(left, body)
		}
		return len(left) == 0
	})
}

// nullableAttempt creates the suite's table for form f with an attempt
// column that takes NULL: the dialect's DDL with its first
// " NOT NULL DEFAULT 1" made " DEFAULT 1". A Target with its own
// CreateTable, or DDL written otherwise, keeps the column as it is.
func (tg *Target) nullableAttempt(t TB, db *sqlx.DB, f sqlxbroker.Form) sqlxbroker.Table {
	t.Helper()
	if tg.CreateTable != nil {
		return tg.fresh(t, db, f, nil)
	}
	tb := suiteTable(f)
	b := sqlxbroker.OpenDialect(db, tg.Dialect)
	stmts, err := b.TableDDL(tb, suitePayload...)
	if err != nil {
		t.Fatalf("table DDL: %v", err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE " + tg.Dialect.QuoteIdent(tb.Name)) })
	for i, s := range stmts {
		if i == 0 {
			s = strings.Replace(s, " NOT NULL DEFAULT 1", " DEFAULT 1", 1)
		}
		if _, err := db.ExecContext(context.Background(), s); err != nil {
			t.Fatalf("create table: %v\n%s", err, s)
		}
	}
	return tb
}

// bodyOf reads a claimed row's body column (its key column may be NULL,
// which msg cannot scan).
func bodyOf(c core.Claim) string {
	v, _ := sqlxbroker.NewDelivery(c).Value("body")
	switch b := v.(type) {
	case []byte:
		return string(b)
	case string:
		return b
	}
	return ""
}
