package sqlxbrokertest_test

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	_ "github.com/sqlxbroker/sqlxbroker/dialects/mysql"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
	"github.com/sqlxbroker/sqlxbroker/internal/testreport"
	"github.com/sqlxbroker/sqlxbroker/sqlxbrokertest"
)

// database is one database the tests run on.
type database struct {
	name    string
	rowLock bool // the dialect has the row-lock form
	open    func(t *testing.T) *sqlx.DB
}

// databases are SQLite (always), PostgreSQL and MariaDB: each of the last
// two is tested when its DSN is set (SQLXBROKER_POSTGRES_DSN,
// SQLXBROKER_MYSQL_DSN) and skipped otherwise, unless
// SQLXBROKER_REQUIRE_DB=1 makes a missing one a failure.
var databases = []database{
	{"SQLite", false, func(t *testing.T) *sqlx.DB {
		testreport.Tested(t, "SQLite", "a file in a temporary directory")
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "test.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}},
	{"PostgreSQL", true, func(t *testing.T) *sqlx.DB {
		db, err := postgres.Open(provision.Postgres.Get(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}},
	{"MariaDB", true, func(t *testing.T) *sqlx.DB {
		db, err := sqlx.Open("mysql", provision.MariaDB.Get(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}},
}

// eachDatabase runs f in a subtest per database.
func eachDatabase(t *testing.T, f func(t *testing.T, db database, b *sqlxbroker.Broker)) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			db := d.open(t)
			b, err := sqlxbroker.Open(db)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close(context.Background()) })
			f(t, d, b)
		})
	}
}

// onSQLite runs f on SQLite alone, for what does not depend on the
// database.
func onSQLite(t *testing.T, f func(t *testing.T, b *sqlxbroker.Broker)) {
	db := databases[0].open(t)
	b, err := sqlxbroker.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close(context.Background()) })
	f(t, b)
}

var seq atomic.Int64

// name returns a table name of its own for this run.
func name(what string) string {
	return fmt.Sprintf("testkit_%s_%x_%d", what, time.Now().UnixNano()&0xffffff, seq.Add(1))
}

// newTable creates tbl (a fresh name) with payload columns and drops it
// when the test ends.
func newTable(t *testing.T, b *sqlxbroker.Broker, tbl sqlxbroker.Table, payload ...[2]string) sqlxbroker.Table {
	t.Helper()
	tbl.Name = name("jobs")
	if err := b.CreateTable(context.Background(), tbl, payload...); err != nil {
		t.Fatal(err)
	}
	dropLater(t, b, tbl.Name)
	return tbl
}

func dropLater(t *testing.T, b *sqlxbroker.Broker, table string) {
	t.Cleanup(func() {
		if _, err := b.DB().Exec("DROP TABLE IF EXISTS " + b.Dialect().QuoteIdent(table)); err != nil {
			t.Errorf("drop %s: %v", table, err)
		}
	})
}

// newAudit creates an audit table (job, note) and returns its name,
// dropped when the test ends.
func newAudit(t *testing.T, b *sqlxbroker.Broker) string {
	t.Helper()
	n := name("audit")
	if _, err := b.DB().Exec("CREATE TABLE " + b.Dialect().QuoteIdent(n) + " (job BIGINT PRIMARY KEY, note VARCHAR(200) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	dropLater(t, b, n)
	return n
}

// audit is a row of the audit table.
type audit struct {
	Job  int64  `db:"job"`
	Note string `db:"note"`
}

// audits reads the audit table through q.
func audits(t *testing.T, q sqlxbrokertest.Querier, table string) []audit {
	t.Helper()
	return sqlxbrokertest.Published[audit](t, q, sqlxbroker.Table{Name: table, ID: "job"})
}

// fakeT is a sqlxbrokertest.TB that records failures instead of failing
// the test: Fatalf ends the goroutine it is called on, as testing's does.
type fakeT struct {
	mu       sync.Mutex
	failed   bool
	fatal    bool
	msgs     []string
	cleanups []func()
}

func (f *fakeT) Helper()                   {}
func (f *fakeT) Cleanup(fn func())         { f.mu.Lock(); f.cleanups = append(f.cleanups, fn); f.mu.Unlock() }
func (f *fakeT) Logf(string, ...any)       {}
func (f *fakeT) Errorf(s string, a ...any) { f.record(false, s, a) }
func (f *fakeT) Fatalf(s string, a ...any) { f.record(true, s, a); runtime.Goexit() }

func (f *fakeT) record(fatal bool, s string, a []any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = true
	f.fatal = f.fatal || fatal
	f.msgs = append(f.msgs, fmt.Sprintf(s, a...))
}

func (f *fakeT) message() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.msgs, "\n")
}

// runFake runs fn with a fakeT on a goroutine of its own, then its
// cleanups (last first), and returns the fakeT.
func runFake(fn func(t sqlxbrokertest.TB)) *fakeT {
	f := &fakeT{}
	done := make(chan struct{})
	go func() { defer close(done); fn(f) }()
	<-done
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	return f
}

// wantFailure fails t unless f failed with a message containing each of
// parts.
func wantFailure(t *testing.T, f *fakeT, parts ...string) {
	t.Helper()
	if !f.failed {
		t.Fatalf("the helper did not fail; want a failure saying %q", parts)
	}
	msg := f.message()
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			t.Errorf("failure message lacks %q:\n%s", p, msg)
		}
	}
}
