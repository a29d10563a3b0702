package postgres_test

import (
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
)

// TestConformance runs the shared suite on PostgreSQL: SQLXBROKER_POSTGRES_DSN,
// else a container where Docker runs, else a skip that names the variable.
func TestConformance(t *testing.T) {
	dsn := provision.Postgres.Get(t)
	conformance.Run(t, conformance.Target{
		Dialect: postgres.Dialect{},
		Open: func(t conformance.TB) *sqlx.DB {
			db, err := sqlx.Open("postgres", dsn)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		},
	})
}
