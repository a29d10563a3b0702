package sqlite_test

import (
	"github.com/sqlxbroker/sqlxbroker/internal/testreport"
	"path/filepath"
	"sync"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
)

var (
	fileOnce sync.Once
	file     string
)

// dbFile is one database file per test binary; a crash child re-runs the
// binary and must find the same file, so its path comes from the parent.
func dbFile(t conformance.TB) string {
	if p := filepath.Clean(getenv("SQLXBROKER_SQLITE_FILE")); p != "." {
		return p
	}
	fileOnce.Do(func() { file = filepath.Join(tempDir(), "conformance.db") })
	return file
}

func TestConformance(t *testing.T) {
	path := dbFile(t)
	t.Setenv("SQLXBROKER_SQLITE_FILE", path)
	testreport.Tested(t, "SQLite", "a file in a temporary directory")
	conformance.Run(t, conformance.Target{
		Dialect: sqlite.Dialect{},
		// One writer at a time: volumes scaled down (500 rows, not 5,000)
		// keep the run short under the race detector.
		Short: true,
		Open: func(t conformance.TB) *sqlx.DB {
			db, err := sqlite.Open(path)
			if err != nil {
				t.Fatalf("open %s: %v", path, err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		},
	})
}
