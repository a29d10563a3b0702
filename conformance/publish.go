package conformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// valuerRow is a message whose payload fields are driver.Valuers.
type valuerRow struct {
	Acct string          `db:"acct"`
	Name sql.NullString  `db:"name"`
	N    sql.NullInt64   `db:"n"`
	At   sql.NullTime    `db:"at"`
	G    sql.Null[int64] `db:"g"`
}

var valuerPayload = [][2]string{{"acct", "text"}, {"name", "text"}, {"n", "bigint"}, {"at", "timestamp"}, {"g", "bigint"}}

// PublishFields: Publish stores every field as sqlx binds it. Fields of
// type sql.NullString, sql.NullInt64, sql.NullTime and sql.Null[int64],
// valid and null, are stored exactly, as read back with plain SQL; a
// message with a field that cannot be one column fails with an error that
// names the field, and nothing of the call is inserted.
func PublishFields(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	tb := tg.freshWith(t, b.DB(), f, nil, valuerPayload)
	at := time.Date(2026, 12, 3, 14, 5, 6, 789012000, time.UTC)
	rows := []valuerRow{
		{Acct: "valid", Name: sql.NullString{String: "ada", Valid: true}, N: sql.NullInt64{Int64: -42, Valid: true},
			At: sql.NullTime{Time: at, Valid: true}, G: sql.Null[int64]{V: 1 << 40, Valid: true}},
		{Acct: "null"},
	}
	if err := b.Publish(context.Background(), b.DB(), tb, rows[0], rows[1]); err != nil {
		t.Fatalf("publish Valuer fields: %v", err)
	}
	q := tg.Dialect.QuoteIdent
	var got []map[string]any
	rs, err := b.DB().Queryx("SELECT " + q("acct") + ", " + q("name") + ", " + q("n") + ", " + q("at") + ", " + q("g") +
		" FROM " + q(tb.Name) + " ORDER BY " + q("id"))
	if err != nil {
		t.Fatalf("read back: %v", err)
	}
	for rs.Next() {
		m := map[string]any{}
		if err := rs.MapScan(m); err != nil {
			t.Fatalf("read back: %v", err)
		}
		got = append(got, m)
	}
	rs.Close()
	if len(got) != 2 {
		t.Fatalf("read back %d rows, want 2", len(got))
	}
	want := []map[string]string{
		{"acct": "valid", "name": "ada", "n": "-42", "at": at.Format(time.RFC3339Nano), "g": fmt.Sprint(int64(1 << 40))},
		{"acct": "null", "name": "NULL", "n": "NULL", "at": "NULL", "g": "NULL"},
	}
	for i, w := range want {
		for col, wv := range w {
			if gv := normalize(t, got[i][col], col == "at"); gv != wv {
				t.Errorf("row %s: column %s holds %s, want %s", w["acct"], col, gv, wv)
			}
		}
	}

	type inner struct{ A, B string }
	bad := struct {
		Acct  string `db:"acct"`
		Name  string `db:"name"`
		Inner inner  `db:"inner_meta"`
	}{Acct: "bad", Name: "x"}
	err = b.Publish(context.Background(), b.DB(), tb, valuerRow{Acct: "first of the call"}, bad)
	if err == nil {
		t.Fatalf("a message with a nested struct field was published")
	}
	if !strings.Contains(err.Error(), "Inner") {
		t.Errorf("the error %q does not name the field Inner", err)
	}
	if n := count(t, b.DB(), tg.Dialect, tb.Name, ""); n != 2 {
		t.Errorf("%d rows after a refused publish, want the 2 before it", n)
	}
}

// normalize renders a value read back by the driver as text: NULL, a
// number, a string, or for a timestamp its UTC RFC 3339 form.
func normalize(t TB, v any, timestamp bool) string {
	t.Helper()
	switch x := v.(type) {
	case nil:
		return "NULL"
	case []byte:
		v = string(x)
	}
	if !timestamp {
		return fmt.Sprint(v)
	}
	switch x := v.(type) {
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case string:
		for _, layout := range []string{"2006-01-02 15:04:05.999999999Z07:00", "2006-01-02 15:04:05.999999999-07:00", "2006-01-02 15:04:05.999999999", time.RFC3339Nano} {
			if ts, err := time.Parse(layout, x); err == nil {
				return ts.UTC().Format(time.RFC3339Nano)
			}
		}
		if n, err := strconv.ParseInt(x, 10, 64); err == nil {
			return time.Unix(n, 0).UTC().Format(time.RFC3339Nano)
		}
	}
	return fmt.Sprintf("%v (%T)", v, v)
}

// uniquePayload are the suite's payload columns and ukey, a bigint the
// duplicate scenarios give a unique index (a bigint, so every database
// indexes it whole).
var uniquePayload = append(append([][2]string{}, suitePayload...), [2]string{"ukey", "bigint"})

// keyed is a row with a unique key.
type keyed struct {
	Acct string `db:"acct"`
	Body string `db:"body"`
	Key  int64  `db:"ukey"`
}

// freshUnique is fresh with the ukey column and a unique index on it, made
// with the one statement PostgreSQL, MySQL, MariaDB and SQLite all take.
func (tg *Target) freshUnique(t TB, db *sqlx.DB, f sqlxbroker.Form) sqlxbroker.Table {
	t.Helper()
	tb := tg.freshWith(t, db, f, nil, uniquePayload)
	q := tg.Dialect.QuoteIdent
	if _, err := db.Exec("CREATE UNIQUE INDEX " + q(tb.Name+"_ukey") + " ON " + q(tb.Name) + " (" + q("ukey") + ")"); err != nil {
		t.Fatalf("create the unique index on ukey: %v", err)
	}
	return tb
}

func keyedRows(from, to int, body string) []any {
	out := make([]any, 0, to-from)
	for k := from; k < to; k++ {
		out = append(out, keyed{Acct: fmt.Sprintf("a%d", k%7), Body: body, Key: int64(k)})
	}
	return out
}

// PublishDuplicates: PublishWith with SkipDuplicates skips rows whose
// unique column is already in the table or earlier in the same call, and
// reports exactly the rows it inserted. n rows (10,000; 1,000 with Short)
// are published after the first half of them: n/2 inserted, n rows in the
// table, each key once, the rows already there unchanged. A call of five
// rows with two keys seen earlier in the call inserts 2. Skipping on a
// column without a unique index, or on a column the messages do not
// insert, fails and inserts nothing. A dialect without
// core.DuplicateSkipper must refuse SkipDuplicates with ErrUnsupported,
// naming itself and the capability, and insert nothing.
func PublishDuplicates(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	db := b.DB()
	tb := tg.freshUnique(t, db, f)
	ctx := context.Background()
	skip := sqlxbroker.PublishParams{SkipDuplicates: "ukey"}
	n := volume(tg, 10000, 1000)
	rows := func() int { return count(t, db, tg.Dialect, tb.Name, "") }

	if core.CapabilitiesOf(tg.Dialect).DuplicateSkipper == nil {
		got, err := b.PublishWith(ctx, db, tb, skip, keyedRows(0, 10, "first")...)
		switch {
		case err == nil:
			t.Fatalf("a dialect without core.DuplicateSkipper skipped duplicates (%d rows inserted)", got)
		case !errors.Is(err, sqlxbroker.ErrUnsupported):
			t.Errorf("the refusal %q does not match ErrUnsupported", err)
		case !strings.Contains(err.Error(), tg.Dialect.Name()) || !strings.Contains(err.Error(), "DuplicateSkipper"):
			t.Errorf("the refusal %q does not name the dialect %q and the capability DuplicateSkipper", err, tg.Dialect.Name())
		}
		if r := rows(); r != 0 {
			t.Errorf("%d rows after the refusal, want 0", r)
		}
		return
	}

	got, err := b.PublishWith(ctx, db, tb, skip, keyedRows(0, n/2, "first")...)
	if err != nil {
		t.Fatalf("publish the first half: %v", err)
	}
	if got != int64(n/2) {
		t.Errorf("the first %d new rows: PublishWith reports %d inserted", n/2, got)
	}
	got, err = b.PublishWith(ctx, db, tb, skip, keyedRows(0, n, "second")...)
	if err != nil {
		t.Fatalf("publish %d rows, %d of them duplicates: %v", n, n/2, err)
	}
	if got != int64(n-n/2) {
		t.Errorf("%d rows of which %d exist: PublishWith reports %d inserted, want %d", n, n/2, got, n-n/2)
	}
	t.Logf("%d rows of which %d exist: %d inserted", n, n/2, got)
	if r := rows(); r != n {
		t.Errorf("the table holds %d rows, want %d", r, n)
	}
	var distinct int
	q := tg.Dialect.QuoteIdent
	if err := db.Get(&distinct, "SELECT COUNT(DISTINCT "+q("ukey")+") FROM "+q(tb.Name)); err != nil {
		t.Fatalf("count distinct keys: %v", err)
	}
	if distinct != n {
		t.Errorf("%d distinct keys, want %d", distinct, n)
	}
	if c := count(t, db, tg.Dialect, tb.Name, q("body")+" = ?", "first"); c != n/2 {
		t.Errorf("%d rows keep the first call's body, want %d (a skipped row leaves the row there unchanged)", c, n/2)
	}

	// Duplicates within one call: keys n, n, n+1, 0 (in the table), n+1.
	within := []any{keyed{"w", "w1", int64(n)}, keyed{"w", "w2", int64(n)}, keyed{"w", "w3", int64(n + 1)}, keyed{"w", "w4", 0}, keyed{"w", "w5", int64(n + 1)}}
	got, err = b.PublishWith(ctx, db, tb, skip, within...)
	if err != nil {
		t.Fatalf("publish with duplicates within the call: %v", err)
	}
	if got != 2 {
		t.Errorf("5 rows with 2 new keys: PublishWith reports %d inserted, want 2", got)
	}
	if r := rows(); r != n+2 {
		t.Errorf("the table holds %d rows after the call with duplicates within it, want %d", r, n+2)
	}
	if c := count(t, db, tg.Dialect, tb.Name, q("body")+" IN (?, ?)", "w1", "w3"); c != 2 {
		t.Errorf("%d of the first rows of each new key were kept, want 2", c)
	}

	// Refusals: a column that is not unique, a column not inserted.
	before := rows()
	if _, err := b.PublishWith(ctx, db, tb, sqlxbroker.PublishParams{SkipDuplicates: "acct"},
		keyed{"same", "x", int64(n + 10)}, keyed{"same", "y", int64(n + 11)}); err == nil {
		t.Errorf("SkipDuplicates on acct, which has no unique index, succeeded")
	}
	if _, err := b.PublishWith(ctx, db, tb, sqlxbroker.PublishParams{SkipDuplicates: "grp"}, keyed{"g", "x", int64(n + 12)}); !errors.Is(err, sqlxbroker.ErrInvalidTable) || !strings.Contains(err.Error(), "grp") {
		t.Errorf("SkipDuplicates on grp, which the messages do not insert: %v, want a TableError naming grp", err)
	}
	if r := rows(); r != before {
		t.Errorf("%d rows after the refused calls, want %d", r, before)
	}
}

// PublishReadyAt: PublishWith's Delay and ReadyAt are written to the
// ReadyAt column, so the rows are not delivered before their time (by the
// host clock) and are delivered after it; a ReadyAt in the params wins
// over the message's own. A plain Publish writes the publish time (Counts
// reads it as OldestReady). Delay and ReadyAt together, and either on a
// table without a ReadyAt column, are refused.
func PublishReadyAt(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	db := b.DB()
	tb := tg.fresh(t, db, f, nil)
	ctx := context.Background()

	before := core.Now()
	publish(t, b, tb, msg{Acct: "p", Body: "plain"})
	after := core.Now()
	c, err := b.Counts(ctx, tb)
	if err != nil {
		t.Fatalf("counts: %v", err)
	}
	if c.Ready != 1 || c.OldestReady.Before(before) || c.OldestReady.After(after) {
		t.Errorf("after a plain publish between %v and %v: %d ready, OldestReady %v; want 1 ready since the publish",
			before, after, c.Ready, c.OldestReady)
	}

	if _, err := b.PublishWith(ctx, db, tb, sqlxbroker.PublishParams{Delay: time.Second, ReadyAt: time.Now()}, msg{Acct: "x"}); err == nil ||
		!strings.Contains(err.Error(), "Delay") || !strings.Contains(err.Error(), "ReadyAt") {
		t.Errorf("Delay and ReadyAt both set: %v, want an error naming both", err)
	}
	noReady := tb
	noReady.ReadyAt = ""
	if _, err := b.PublishWith(ctx, db, noReady, sqlxbroker.PublishParams{Delay: time.Second}, msg{Acct: "x"}); !errors.Is(err, sqlxbroker.ErrInvalidTable) || !strings.Contains(err.Error(), "ReadyAt") {
		t.Errorf("Delay on a table without ReadyAt: %v, want a TableError naming ReadyAt", err)
	}

	const delay, later = 1500 * time.Millisecond, 2 * time.Second
	asked := map[string]time.Time{"plain": {}}
	start := core.Now()
	if n, err := b.PublishWith(ctx, db, tb, sqlxbroker.PublishParams{Delay: delay}, msg{Acct: "d", Body: "delayed"}); err != nil || n != 1 {
		t.Fatalf("publish with Delay: %d, %v", n, err)
	}
	asked["delayed"] = start.Add(delay)
	at := core.Now().Add(later)
	// The message's own ready_at (an hour ago) loses to the params'.
	own := map[string]any{"acct": "r", "grp": "", "body": "at", tb.ReadyAt: time.Now().Add(-time.Hour).UTC()}
	if n, err := b.PublishWith(ctx, db, tb, sqlxbroker.PublishParams{ReadyAt: at}, own); err != nil || n != 1 {
		t.Fatalf("publish with ReadyAt: %d, %v", n, err)
	}
	asked["at"] = at
	if c, err := b.Counts(ctx, tb); err != nil || c.Scheduled != 2 {
		t.Errorf("counts after the delayed publishes: %+v, %v; want 2 scheduled", c, err)
	}

	var mu sync.Mutex
	got := map[string]time.Time{}
	s := subscribe(t, b, tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		now := core.Now()
		var m msg
		if err := d.Scan(&m); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if _, ok := got[m.Body]; !ok {
			got[m.Body] = now
		}
		return nil
	}, quick)
	deadline := time.Now().Add(30 * time.Second)
	for s.Stats().Succeeded < 3 {
		if time.Now().After(deadline) {
			mu.Lock()
			t.Fatalf("timed out after 30s waiting for the three rows delivered: delivered %v, stats %+v", got, s.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for body, want := range asked {
		when, ok := got[body]
		switch {
		case !ok:
			t.Errorf("row %q was not delivered", body)
		case when.Before(want):
			t.Errorf("row %q was delivered at %v, %v before its ready time %v", body, when, want.Sub(when), want)
		}
	}
}

// metaKey is the context key of the trace text PublishMetadata's
// MetadataFunc returns.
type metaKey struct{}

// PublishMetadata: with a MetadataFunc set, Publish writes what it returns
// for the publisher's ctx to the table's Metadata column (NULL for ""), a
// message's own value wins, and each delivery reads it back through
// Delivery.Metadata, along with the row's ReadyAt (the publish time). A
// table without the column passes no metadata and errs nothing; a
// description naming a column the table lacks fails CheckTable naming
// Metadata.
func PublishMetadata(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	db := b.DB()
	tb := tg.fresh(t, db, f, func(tb *sqlxbroker.Table) { tb.Metadata = "meta" })
	ctx := context.Background()

	missing := tb
	missing.Metadata = "no_such_meta"
	if err := b.CheckTable(ctx, missing); !errors.Is(err, sqlxbroker.ErrInvalidTable) || !strings.Contains(err.Error(), "Metadata") {
		t.Errorf("CheckTable with a Metadata column the table lacks: %v, want a TableError naming Metadata", err)
	}
	if err := b.CheckTable(ctx, tb); err != nil {
		t.Fatalf("CheckTable: %v", err)
	}

	publish(t, b, tb, msg{Acct: "a", Body: "before"}) // no MetadataFunc yet: NULL
	b.SetMetadataFunc(func(ctx context.Context) string {
		s, _ := ctx.Value(metaKey{}).(string)
		return s
	})
	defer b.SetMetadataFunc(nil)
	before := core.Now()
	traced := context.WithValue(ctx, metaKey{}, "traceparent=00-abc")
	if err := b.Publish(traced, db, tb, msg{Acct: "b", Body: "traced"}, msg{Acct: "c", Body: "traced"}); err != nil {
		t.Fatalf("publish with metadata: %v", err)
	}
	own := map[string]any{"acct": "d", "grp": "", "body": "own", "meta": "mine"}
	if err := b.Publish(traced, db, tb, own); err != nil {
		t.Fatalf("publish with the message's own metadata: %v", err)
	}
	publish(t, b, tb, msg{Acct: "e", Body: "empty"}) // the function returns "": NULL
	after := core.Now()
	if n := count(t, db, tg.Dialect, tb.Name, "meta IS NULL"); n != 2 {
		t.Errorf("%d rows with a NULL metadata column, want 2 (published without a function, and with one returning \"\")", n)
	}

	want := map[string]string{"before": "", "traced": "traceparent=00-abc", "own": "mine", "empty": ""}
	type seen struct {
		meta    string
		ready   time.Time
		readyOK bool
	}
	var mu sync.Mutex
	got := map[string][]seen{}
	s := subscribe(t, b, tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		var m msg
		if err := d.Scan(&m); err != nil {
			return err
		}
		r, ok := d.ReadyAt()
		mu.Lock()
		got[m.Body] = append(got[m.Body], seen{d.Metadata(), r, ok})
		mu.Unlock()
		return nil
	}, quick)
	WaitFor(t, 30*time.Second, "the five rows delivered", func() bool { return s.Stats().Succeeded >= 5 })
	mu.Lock()
	defer mu.Unlock()
	for body, w := range want {
		n := 1
		if body == "traced" {
			n = 2
		}
		if len(got[body]) != n {
			t.Errorf("row %q delivered %d times, want %d", body, len(got[body]), n)
		}
		for _, g := range got[body] {
			if g.meta != w {
				t.Errorf("row %q: Delivery.Metadata %q, want %q", body, g.meta, w)
			}
			if body != "before" && (!g.readyOK || g.ready.Before(before) || g.ready.After(after)) {
				t.Errorf("row %q: Delivery.ReadyAt %v (%v), want the publish time, between %v and %v", body, g.ready, g.readyOK, before, after)
			}
		}
	}
}
