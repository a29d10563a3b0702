package mysql_test

import (
	"slices"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/mysql"
)

// TestFenceLeases: the fence matches exactly the rows whose lease column
// holds their token, with one token for the whole batch and with several,
// and a row re-leased since (another token in the table) is left out
// either way.
func TestFenceLeases(t *testing.T) {
	db := openDB(t, testDSN(t))
	if _, err := db.Exec("DROP TABLE IF EXISTS sxb_fence"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE sxb_fence (id bigint PRIMARY KEY, locked_until datetime(6) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	defer db.Exec("DROP TABLE sxb_fence")
	d := mysql.Dialect{}
	t1 := d.EncodeTime(time.Date(2026, 12, 6, 1, 2, 3, 456789000, time.UTC))
	t2 := d.EncodeTime(time.Date(2026, 12, 6, 1, 2, 4, 456789000, time.UTC))
	p := &core.Plan{QID: "`id`", QLockedUntil: "`locked_until`"}
	for _, c := range []struct {
		name   string
		ids    []any
		tokens []any
		want   []int64
	}{
		{"one token", []any{int64(1), int64(2), int64(3)}, []any{t1, t1, t1}, []int64{1, 2, 3}},
		{"one token, a row re-leased", []any{int64(1), int64(2), int64(4)}, []any{t1, t1, t1}, []int64{1, 2}},
		{"two tokens", []any{int64(3), int64(4)}, []any{t1, t2}, []int64{3, 4}},
		{"two tokens, swapped", []any{int64(3), int64(4)}, []any{t2, t1}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := db.Exec("DELETE FROM sxb_fence"); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec("INSERT INTO sxb_fence VALUES (1, ?), (2, ?), (3, ?), (4, ?)", t1, t1, t1, t2); err != nil {
				t.Fatal(err)
			}
			cond, args := d.FenceLeases(p, c.ids, c.tokens)
			var got []int64
			if err := db.Select(&got, "SELECT id FROM sxb_fence WHERE "+cond, args...); err != nil {
				t.Fatalf("%s: %v", cond, err)
			}
			slices.Sort(got)
			if !slices.Equal(got, c.want) {
				t.Errorf("%s matched %v, want %v", cond, got, c.want)
			}
		})
	}
}
