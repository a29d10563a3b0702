package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/mysql"
)

// TestTryFirstAdvisoryLocks: keys are tried in order until as many as
// wanted are locked, in one statement (JSON_TABLE) and in waves of as many
// as are still wanted (servers without it); a key another session holds
// is passed over, the keys after the last one wanted stay free, and each
// key locked holds the lock name TryAdvisoryLocks would take for it
// (quotes and backslashes, which the JSON array escapes; long and
// unprintable keys, hashed).
func TestTryFirstAdvisoryLocks(t *testing.T) {
	db := openDB(t, testDSN(t))
	ctx := context.Background()
	var dialect mysql.Dialect
	pool := core.NewPool(db, dialect)
	defer pool.Close()
	var database string
	if err := db.Get(&database, "SELECT DATABASE()"); err != nil {
		t.Fatal(err)
	}
	for _, way := range []struct {
		name string
		try  func(context.Context, *core.AdvisoryParams, int) ([]int, error)
	}{
		{"one statement", dialect.TryFirstAdvisoryLocks},
		{"waves", func(ctx context.Context, p *core.AdvisoryParams, want int) ([]int, error) {
			return mysql.TryInWaves(dialect, ctx, p, want)
		}},
	} {
		t.Run(way.name, func(t *testing.T) {
			mine, err := db.Connx(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer mine.Close()
			other, err := db.Connx(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			tag := fmt.Sprintf("first-%d-", time.Now().UnixNano())
			keys := []string{tag + `a"q`, tag + `b\s`, tag + "c\x00\xff", tag + strings.Repeat("x", 70), tag + "e"}
			if ok, err := dialect.TryAdvisoryLocks(ctx, &core.AdvisoryParams{Pool: pool, Conn: other, Keys: keys[1:2]}); err != nil || !ok[0] {
				t.Fatalf("another session locks %q: %v %v", keys[1], ok, err)
			}
			got, err := way.try(ctx, &core.AdvisoryParams{Pool: pool, Conn: mine, Keys: keys}, 3)
			if err != nil || !slices.Equal(got, []int{0, 2, 3}) {
				t.Fatalf("3 of 5, the second held elsewhere = %v, %v; want positions [0 2 3]", got, err)
			}
			// Each key locked holds its name: another session cannot take it.
			ok, err := dialect.TryAdvisoryLocks(ctx, &core.AdvisoryParams{Pool: pool, Conn: other, Keys: []string{keys[0], keys[2], keys[3]}})
			if err != nil || !slices.Equal(ok, []bool{false, false, false}) {
				t.Errorf("another session took keys locked by the first: %v, %v", ok, err)
			}
			var owner sql.NullInt64
			if err := other.GetContext(ctx, &owner, "SELECT IS_USED_LOCK(?)", []byte(database+":"+keys[0])); err != nil || !owner.Valid {
				t.Errorf("lock name of %q not held: %v %v", keys[0], owner, err)
			}
			// The key after the last one wanted was never tried.
			if ok, err := dialect.TryAdvisoryLocks(ctx, &core.AdvisoryParams{Pool: pool, Conn: other, Keys: keys[4:]}); err != nil || !ok[0] {
				t.Errorf("the key after the third locked was tried: another session takes it: %v, %v", ok, err)
			}
			// Fewer free keys than wanted: every key is tried.
			third, err := db.Connx(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer third.Close()
			if got, err := way.try(ctx, &core.AdvisoryParams{Pool: pool, Conn: third, Keys: keys}, 5); err != nil || len(got) != 0 {
				t.Errorf("5 of 5, each held elsewhere = %v, %v; want none", got, err)
			}
			for _, c := range []*core.AdvisoryParams{{Pool: pool, Conn: mine, Keys: keys}, {Pool: pool, Conn: other, Keys: keys}} {
				if err := dialect.AdvisoryUnlocks(ctx, c); err != nil {
					t.Error(err)
				}
			}
		})
	}
}
