package leaseonly_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/examples/leaseonly"
)

// TestConformance: the example dialect, found through the registry under
// its own driver name, passes the suite.
func TestConformance(t *testing.T) {
	d, err := sqlxbroker.Lookup(leaseonly.DriverName)
	if err != nil {
		t.Fatal(err)
	}
	// The crash scenario's child re-runs this test and must open the same
	// file: it inherits the variable.
	if os.Getenv("LEASEONLY_FILE") == "" {
		t.Setenv("LEASEONLY_FILE", filepath.Join(t.TempDir(), "example.db"))
	}
	path := os.Getenv("LEASEONLY_FILE")
	conformance.Run(t, conformance.Target{
		Dialect: d,
		Short:   true,
		Open: func(tb conformance.TB) *sqlx.DB {
			db, err := sqlx.Open(leaseonly.DriverName, "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
			if err != nil {
				tb.Fatalf("open: %v", err)
			}
			tb.Cleanup(func() { db.Close() })
			return db
		},
	})
}
