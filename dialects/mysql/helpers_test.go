package mysql_test

import (
	"context"
	"fmt"
	"github.com/sqlxbroker/sqlxbroker/internal/testreport"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/mysql"
)

const dsnEnv = "SQLXBROKER_MYSQL_DSN"

// testDSN returns the DSN of the test database, or skips (fails when
// SQLXBROKER_REQUIRE_DB=1) without one.
func testDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv(dsnEnv)
	if dsn == "" {
		if os.Getenv("SQLXBROKER_REQUIRE_DB") == "1" {
			t.Fatalf("%s is not set and SQLXBROKER_REQUIRE_DB=1 forbids skipping: set it to a MySQL 8.0.1+/MariaDB 10.6+ DSN, e.g. root@tcp(127.0.0.1:3306)/test", dsnEnv)
		}
		testreport.Skip(t, "MariaDB", fmt.Sprintf("set %s to a MySQL 8.0.1+/MariaDB 10.6+ DSN, e.g. root@tcp(127.0.0.1:3306)/test, to run this test", dsnEnv))
	}
	testreport.Tested(t, "MariaDB", dsnEnv)
	return dsn
}

// withParams appends query parameters to a DSN.
func withParams(dsn, params string) string {
	if params == "" {
		return dsn
	}
	if strings.Contains(dsn, "?") {
		return dsn + "&" + params
	}
	return dsn + "?" + params
}

// openDB opens a new pool: one pool is one broker.
func openDB(t *testing.T, dsn string) *sqlx.DB {
	t.Helper()
	db, err := sqlx.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(32)
	t.Cleanup(func() { db.Close() })
	if err := db.Ping(); err != nil {
		t.Fatalf("ping %s: %v", dsnEnv, err)
	}
	return db
}

func openBroker(t *testing.T, db *sqlx.DB) *sqlxbroker.Broker {
	t.Helper()
	b, err := sqlxbroker.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// isMariaDB reports whether db's server is MariaDB.
func isMariaDB(t *testing.T, db *sqlx.DB) bool {
	var v string
	if err := db.Get(&v, "SELECT VERSION()"); err != nil {
		t.Fatal(err)
	}
	return strings.Contains(strings.ToLower(v), "mariadb")
}

var tableSeq atomic.Int64

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// newTable creates a uniquely named table for tbl through the broker's
// CreateTable and drops it when the test ends.
func newTable(t *testing.T, b *sqlxbroker.Broker, tbl sqlxbroker.Table, payload ...[2]string) sqlxbroker.Table {
	t.Helper()
	name := nonIdent.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(name) > 36 {
		name = name[len(name)-36:]
	}
	tbl.Name = fmt.Sprintf("sxb_%s_%x_%d", strings.Trim(name, "_"), time.Now().UnixNano()&0xffffff, tableSeq.Add(1))
	if err := b.CreateTable(context.Background(), tbl, payload...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := b.DB().Exec("DROP TABLE IF EXISTS " + b.Dialect().QuoteIdent(tbl.Name)); err != nil {
			t.Errorf("drop %s: %v", tbl.Name, err)
		}
	})
	return tbl
}

// payload is every test table's extra columns.
var payload = [][2]string{{"n", "bigint"}, {"acct", "text"}, {"grp", "text"}, {"k", "text"}}

// forms are the three forms' descriptions; names are filled by newTable.
func forms() []struct {
	name  string
	table sqlxbroker.Table
} {
	return []struct {
		name  string
		table sqlxbroker.Table
	}{
		{"RowLock", sqlxbroker.Table{}},
		{"Lease", sqlxbroker.Table{LockedUntil: "locked_until"}},
		{"Advisory", sqlxbroker.Table{AdvisoryLock: "acct-{acct}"}},
	}
}

// msg is a published row.
type msg struct {
	N    int64  `db:"n"`
	Acct string `db:"acct"`
	Grp  string `db:"grp"`
	K    string `db:"k"`
}

func publish(t *testing.T, b *sqlxbroker.Broker, tbl sqlxbroker.Table, msgs ...msg) {
	t.Helper()
	all := make([]any, len(msgs))
	for i, m := range msgs {
		all[i] = m
	}
	if err := b.Publish(context.Background(), b.DB(), tbl, all...); err != nil {
		t.Fatal(err)
	}
}

func nOf(t *testing.T, d *sqlxbroker.Delivery) int64 {
	var m msg
	if err := d.Scan(&m); err != nil {
		t.Error(err)
	}
	return m.N
}

// startForm returns t's claim form on b, started.
func startForm(t *testing.T, b *sqlxbroker.Broker, tbl sqlxbroker.Table) core.ClaimForm {
	t.Helper()
	return conformance.StartForm(t, b, tbl)
}

func subscribe(t *testing.T, b *sqlxbroker.Broker, tbl sqlxbroker.Table, h sqlxbroker.Handler, p sqlxbroker.SubscribeParams) *sqlxbroker.Subscription {
	t.Helper()
	s, err := b.Subscribe(context.Background(), tbl, h, p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(t, s) })
	return s
}

func stop(t *testing.T, s *sqlxbroker.Subscription) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		t.Errorf("stop: %v", err)
	}
}

// waitFor polls cond until it holds, failing the test at the deadline.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	conformance.WaitFor(t, d, what, cond)
}

// claimWithin claims until one row comes, failing at the deadline.
func claimWithin(t *testing.T, f core.ClaimForm, within time.Duration) core.Claim {
	t.Helper()
	var got core.Claim
	waitFor(t, within, "a claim", func() bool {
		cs, err := f.Claim(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) > 0 {
			got = cs[0]
		}
		return got != nil
	})
	return got
}

func count(t *testing.T, db *sqlx.DB, tbl sqlxbroker.Table, where string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Get(&n, "SELECT COUNT(*) FROM `"+tbl.Name+"` WHERE "+where, args...); err != nil {
		t.Fatal(err)
	}
	return n
}

var dialect = mysql.Dialect{}
