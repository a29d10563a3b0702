package mysql_test

import (
	"database/sql"
	sqldriver "database/sql/driver"
	"testing"

	driver "github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	"github.com/sqlxbroker/sqlxbroker/dialects/mysql"
)

// TestConformance runs the shared suite on MySQL or MariaDB:
// SQLXBROKER_MYSQL_DSN, else a MariaDB container where Docker runs, else a
// skip that names the variable. A lock wait of over lockWaitReport is
// reported with the server's view of it (watchLockWaits).
func TestConformance(t *testing.T) {
	dsn := provision.MariaDB.Get(t)
	watchLockWaits(t, dsn, lockWaitReport)
	conformance.Run(t, target(t, dsn))
}

// TestConformanceMySQL8 runs the suite on MySQL 8 where one is given
// (SQLXBROKER_MYSQL8_DSN) or Docker can start one.
func TestConformanceMySQL8(t *testing.T) {
	dsn := provision.MySQL.GetOptional(t)
	watchLockWaits(t, dsn, lockWaitReport)
	conformance.Run(t, target(t, dsn))
}

// TestConformanceMariaDBReturning runs the lease form's scenarios with
// Dialect{MariaDB: true}, whose completion batches name the rows they
// deleted with DELETE .. RETURNING (DoneAt tables' batches, an UPDATE
// MariaDB cannot return from, go as in the registered dialect), on the
// MariaDB server of TestConformance.
func TestConformanceMariaDBReturning(t *testing.T) {
	dsn := provision.MariaDB.Get(t)
	if !isMariaDB(t, openDB(t, dsn)) {
		t.Skip("the server is not MariaDB: Dialect{MariaDB: true} refuses it (mysql_test.go checks that)")
	}
	watchLockWaits(t, dsn, lockWaitReport)
	tg := targetOf(t, mysql.Dialect{MariaDB: true}, dsn)
	tg.Forms = []sqlxbroker.Form{sqlxbroker.Lease}
	conformance.Run(t, tg)
}

// target is the suite's Target for the server at dsn, with the hook that
// ends a pool's sessions (KILL CONNECTION).
func target(t *testing.T, dsn string) conformance.Target {
	return targetOf(t, mysql.Dialect{}, dsn)
}

// targetOf is target with dialect d.
func targetOf(t *testing.T, d mysql.Dialect, dsn string) conformance.Target {
	cfg, err := driver.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("DSN: %v", err)
	}
	tg := conformance.DSNTarget(d, "mysql", dsn)
	tg.Sessions = conformance.Sessions("mysql", func() (sqldriver.Connector, error) { return driver.NewConnector(cfg) },
		"SELECT CONNECTION_ID()", "KILL CONNECTION %d")
	tg.Dial = func(t conformance.TB, dial conformance.DialFunc) *sqlx.DB {
		c := cfg.Clone()
		c.DialFunc = dial
		conn, err := driver.NewConnector(c)
		if err != nil {
			t.Fatalf("connector: %v", err)
		}
		db := sqlx.NewDb(sql.OpenDB(conn), "mysql")
		t.Cleanup(func() { db.Close() })
		return db
	}
	return tg
}
