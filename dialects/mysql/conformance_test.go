package mysql_test

import (
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	"github.com/sqlxbroker/sqlxbroker/dialects/mysql"
)

// TestConformance runs the shared suite on MySQL or MariaDB:
// SQLXBROKER_MYSQL_DSN, else a container where Docker runs, else a skip that
// names the variable.
func TestConformance(t *testing.T) {
	dsn := provision.MariaDB.Get(t)
	conformance.Run(t, conformance.Target{
		Dialect: mysql.Dialect{},
		Open: func(t conformance.TB) *sqlx.DB {
			db, err := sqlx.Open("mysql", dsn)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		},
	})
}

// TestConformanceMySQL8 runs the suite on MySQL 8 where one is given
// (SQLXBROKER_MYSQL8_DSN) or Docker can start one.
func TestConformanceMySQL8(t *testing.T) {
	dsn := provision.MySQL.GetOptional(t)
	conformance.Run(t, conformance.Target{
		Dialect: mysql.Dialect{},
		Open: func(t conformance.TB) *sqlx.DB {
			db, err := sqlx.Open("mysql", dsn)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		},
	})
}
