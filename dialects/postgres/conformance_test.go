package postgres_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"github.com/sqlxbroker/sqlxbroker/internal/testreport"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
)

// TestConformance runs the shared suite on PostgreSQL: SQLXBROKER_POSTGRES_DSN,
// else a container where Docker runs, else a skip that names the variable.
func TestConformance(t *testing.T) {
	conformance.Run(t, target(provision.Postgres.Get(t)))
}

// target is the suite's Target for the server at dsn, with the hook that
// ends a pool's sessions (pg_terminate_backend).
func target(dsn string) conformance.Target {
	return conformance.Target{
		Dialect: postgres.Dialect{},
		Open:    openDSN(dsn),
		Sessions: conformance.Sessions("postgres", func() (driver.Connector, error) { return pq.NewConnector(dsn) },
			"SELECT pg_backend_pid()", "SELECT pg_terminate_backend(%d)"),
		Dial: func(t conformance.TB, dial conformance.DialFunc) *sqlx.DB {
			c, err := pq.NewConnector(dsn)
			if err != nil {
				t.Fatalf("connector: %v", err)
			}
			c.Dialer(dialer(dial))
			db := sqlx.NewDb(sql.OpenDB(c), "postgres")
			t.Cleanup(func() { db.Close() })
			return db
		},
	}
}

// dialer is a conformance.DialFunc as lib/pq's Dialer.
type dialer conformance.DialFunc

func (d dialer) Dial(network, addr string) (net.Conn, error) {
	return d(context.Background(), network, addr)
}

func (d dialer) DialTimeout(network, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d(ctx, network, addr)
}

func (d dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return d(ctx, network, addr)
}

// matrixDSN returns the DSN in env var name, set by scripts/pg-matrix.sh.
// Unset, the test skips, or fails when SQLXBROKER_REQUIRE_PG_MATRIX=1 (CI).
func matrixDSN(t *testing.T, name string) string {
	t.Helper()
	dsn := strings.TrimSpace(os.Getenv(name))
	if dsn == "" {
		msg := name + " is not set; run eval \"$(bash scripts/pg-matrix.sh)\" to start the servers"
		if os.Getenv("SQLXBROKER_REQUIRE_PG_MATRIX") == "1" {
			t.Fatal(msg + " (SQLXBROKER_REQUIRE_PG_MATRIX=1)")
		}
		testreport.Skip(t, matrixName(name), msg)
	}
	testreport.Tested(t, matrixName(name), name)
	return dsn
}

// openDSN returns a Target.Open for dsn.
func openDSN(dsn string) func(t conformance.TB) *sqlx.DB {
	return func(t conformance.TB) *sqlx.DB {
		db, err := sqlx.Open("postgres", dsn)
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
}

// TestConformanceNewest runs the whole suite on the newest PostgreSQL that
// scripts/pg-matrix.sh installs (SQLXBROKER_POSTGRES_NEWEST_DSN). The
// version matrix checks each version's statements, so its servers run the
// scenarios at Short volumes; the full volumes run on the main server.
func TestConformanceNewest(t *testing.T) {
	dsn := matrixDSN(t, "SQLXBROKER_POSTGRES_NEWEST_DSN")
	tg := target(dsn)
	tg.Short = true
	conformance.Run(t, tg)
}

// TestConformancePostgres10 runs the suite on PostgreSQL 10
// (SQLXBROKER_POSTGRES10_DSN), which is too old for the advisory form: the
// version gate checks that advisory subscriptions are refused with
// ErrServerTooOld and the other forms subscribe, then every scenario of the
// row-lock and lease forms runs as "<form>/<scenario>" (the advisory form
// is left out of them, Target.Forms).
func TestConformancePostgres10(t *testing.T) {
	dsn := matrixDSN(t, "SQLXBROKER_POSTGRES10_DSN")
	tg := target(dsn)
	tg.OldServer, tg.OldServerRefuses = openDSN(dsn), []sqlxbroker.Form{sqlxbroker.Advisory}
	tg.Forms = []sqlxbroker.Form{sqlxbroker.RowLock, sqlxbroker.Lease}
	tg.Short = true // as TestConformanceNewest
	conformance.Run(t, tg)
}

// TestChainCommit: the row-lock form chains its commits from PostgreSQL 12
// on, and PostgreSQL 10 (no COMMIT AND CHAIN) is given none.
func TestChainCommit(t *testing.T) {
	for _, c := range []struct{ env, want string }{
		{"SQLXBROKER_POSTGRES_DSN", "COMMIT AND CHAIN"},
		{"SQLXBROKER_POSTGRES10_DSN", ""},
		{"SQLXBROKER_POSTGRES_NEWEST_DSN", "COMMIT AND CHAIN"},
	} {
		t.Run(c.env, func(t *testing.T) {
			var s string
			if c.env == "SQLXBROKER_POSTGRES_DSN" {
				s = dsn(t) // fails rather than skips with SQLXBROKER_REQUIRE_DB=1
			} else {
				s = matrixDSN(t, c.env)
			}
			db := openDSN(s)(t)
			pool := core.NewPool(db, postgres.Dialect{})
			defer pool.Close()
			rl, err := postgres.Dialect{}.RowLock(context.Background(), pool)
			if err != nil || rl.ChainCommit != c.want {
				t.Fatalf("RowLock: %+v, %v; want ChainCommit %q", rl, err, c.want)
			}
			got := rl.ChainCommit
			if got == "" {
				return
			}
			// The statement works: a chained transaction is still open.
			tx, err := db.Beginx()
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := tx.Exec(got); err != nil {
				t.Fatal(err)
			}
			// SAVEPOINT fails outside a transaction block.
			if _, err := tx.Exec("SAVEPOINT chained"); err != nil {
				t.Fatalf("after %s: %v", got, err)
			}
		})
	}
}

// matrixName is what the test report calls the server of a matrix
// variable: "PostgreSQL 10" for SQLXBROKER_POSTGRES10_DSN.
func matrixName(env string) string {
	v := strings.TrimSuffix(strings.TrimPrefix(env, "SQLXBROKER_POSTGRES"), "_DSN")
	return "PostgreSQL " + strings.ToLower(strings.TrimPrefix(v, "_"))
}
