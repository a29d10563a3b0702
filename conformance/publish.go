package conformance

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
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
