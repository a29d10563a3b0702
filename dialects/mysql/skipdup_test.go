package mysql_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	"github.com/sqlxbroker/sqlxbroker/dialects/mysql"
)

// TestSkipDuplicatesFoundRows: a pool whose DSN sets clientFoundRows=true
// would count skipped duplicates as inserted, so SkipDuplicates refuses it
// and inserts nothing; the same table on a default DSN counts right.
func TestSkipDuplicatesFoundRows(t *testing.T) {
	dsn := provision.MariaDB.Get(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	ctx := context.Background()
	plain := sqlx.MustOpen("mysql", dsn)
	defer plain.Close()
	plain.MustExec("DROP TABLE IF EXISTS sqlxbroker_found_rows_test")
	plain.MustExec("CREATE TABLE sqlxbroker_found_rows_test (id BIGINT AUTO_INCREMENT PRIMARY KEY, attempt INT NOT NULL DEFAULT 1, k BIGINT NOT NULL, UNIQUE INDEX (k))")
	defer plain.Exec("DROP TABLE sqlxbroker_found_rows_test")
	tb := sqlxbroker.Table{Name: "sqlxbroker_found_rows_test"}
	type row struct {
		K int64 `db:"k"`
	}
	skip := sqlxbroker.PublishParams{SkipDuplicates: "k"}

	found := sqlx.MustOpen("mysql", dsn+sep+"clientFoundRows=true")
	defer found.Close()
	fb := sqlxbroker.OpenDialect(found, mysql.Dialect{})
	if _, err := fb.PublishWith(ctx, found, tb, skip, row{1}, row{1}); err == nil || !strings.Contains(err.Error(), "clientFoundRows") {
		t.Errorf("clientFoundRows=true: %v, want a refusal naming clientFoundRows", err)
	}
	pb := sqlxbroker.OpenDialect(plain, mysql.Dialect{})
	n, err := pb.PublishWith(ctx, plain, tb, skip, row{1}, row{1}, row{2})
	if err != nil || n != 2 {
		t.Errorf("default DSN: %d inserted, %v; want 2", n, err)
	}
	if _, err := pb.PublishWith(ctx, plain, tb, sqlxbroker.PublishParams{SkipDuplicates: "attempt"}, row{3}); err == nil || !strings.Contains(err.Error(), "no unique index") {
		t.Errorf("a column without a unique index: %v, want a refusal", err)
	}
}
