package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
)

// statsRows is the benchmark table's size. Row g goes, as
// scripts/ops-plans.sh fills it: 900,000 done, 20,000 dead, 30,000
// scheduled (from an hour ahead), 49,000 ready, 1,000 in work (a lease 55 s
// ahead: the counts are checked once, at once).
const statsRows = 1000000

// BenchmarkStatsMillion times `sqlxbroker stats` (the process's work:
// connecting, checking the table, the counts) on a 1,000,000-row lease table
// made with the DDL `sqlxbroker ddl` prints, on PostgreSQL and on MariaDB
// (SQLXBROKER_POSTGRES_DSN, SQLXBROKER_MYSQL_DSN). On MariaDB it then drops
// the counts' column (sqlxbroker_state) and times the counts by table scans,
// as on a table made by other DDL. Filling takes several seconds per
// database:
//
//	go test ./cmd/sqlxbroker -run '^$' -bench StatsMillion -benchtime 5x
func BenchmarkStatsMillion(b *testing.B) {
	b.Run("postgres", func(b *testing.B) {
		d := benchDB(b, "postgres", provision.Postgres.Get(b))
		name := statsTable(b, d, `INSERT INTO %[1]s (attempt, ready_at, dead_at, done_at, last_error, locked_until, body)
SELECT CASE WHEN g > 900000 AND g <= 920000 THEN 3 ELSE 1 END,
  CASE WHEN g > 920000 AND g <= 950000 THEN now() + make_interval(secs => 3600 + g - 920000)
       ELSE now() - make_interval(secs => 1000001 - g) END,
  CASE WHEN g > 900000 AND g <= 920000 THEN now() - interval '1 hour' END,
  CASE WHEN g <= 900000 THEN now() - make_interval(secs => 1000001 - g) END,
  CASE WHEN g > 900000 AND g <= 920000 THEN 'boom' END,
  CASE WHEN g > 999000 THEN now() + interval '55 seconds' END,
  'payload ' || g
FROM generate_series(1, %[2]d) g`, "VACUUM (ANALYZE) %s")
		b.Run("partial-indexes", func(b *testing.B) { benchStats(b, d, name) })
	})
	b.Run("mysql", func(b *testing.B) {
		d := benchDB(b, "mysql", provision.MariaDB.Get(b))
		digits := "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4" +
			" UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"
		name := statsTable(b, d, `INSERT INTO %[1]s (attempt, ready_at, dead_at, done_at, last_error, locked_until, body)
SELECT IF(g > 900000 AND g <= 920000, 3, 1),
  IF(g > 920000 AND g <= 950000, UTC_TIMESTAMP(6) + INTERVAL (3600 + g - 920000) SECOND, UTC_TIMESTAMP(6) - INTERVAL (1000001 - g) SECOND),
  IF(g > 900000 AND g <= 920000, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, NULL),
  IF(g <= 900000, UTC_TIMESTAMP(6) - INTERVAL (1000001 - g) SECOND, NULL),
  IF(g > 900000 AND g <= 920000, 'boom', NULL),
  IF(g > 999000, UTC_TIMESTAMP(6) + INTERVAL 55 SECOND, NULL),
  CONCAT('payload ', g)
FROM (SELECT 1 + a.d + 10*b.d + 100*c.d + 1000*e.d + 10000*f.d + 100000*h.d AS g
  FROM `+digits+` a, `+digits+` b, `+digits+` c, `+digits+` e, `+digits+` f, `+digits+` h) s
WHERE g <= %[2]d`, "ANALYZE TABLE %s")
		b.Run("state-column", func(b *testing.B) { benchStats(b, d, name) })
		if _, err := d.db.Exec("ALTER TABLE " + name + " DROP COLUMN sqlxbroker_state"); err != nil {
			b.Fatal(err)
		}
		b.Run("scan", func(b *testing.B) { benchStats(b, d, name) })
	})
}

func benchDB(b *testing.B, driver, dsn string) *opsDB {
	db, err := sqlx.Open(driver, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	br, err := sqlxbroker.Open(db)
	if err != nil {
		b.Fatal(err)
	}
	return &opsDB{driver: driver, dsn: dsn, db: db, b: br}
}

// statsTable creates the benchmark table, fills it by fill (a statement
// with the table and the row count) and runs analyze on it.
func statsTable(b *testing.B, d *opsDB, fill, analyze string) string {
	ctx := context.Background()
	tb := opsTestTable(randName("mycounts_stats"))
	if err := d.b.CreateTable(ctx, tb, [2]string{"body", "text"}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.db.Exec("DROP TABLE IF EXISTS " + tb.Name) })
	start := time.Now()
	if _, err := d.db.Exec(fmt.Sprintf(fill, tb.Name, statsRows)); err != nil {
		b.Fatal(err)
	}
	if _, err := d.db.Exec(fmt.Sprintf(analyze, tb.Name)); err != nil {
		b.Fatal(err)
	}
	b.Logf("%s: filled %d rows in %v", d.driver, statsRows, time.Since(start).Round(time.Millisecond))
	return tb.Name
}

// benchStats runs stats on the table b.N times, checking its counts once.
func benchStats(b *testing.B, d *opsDB, name string) {
	args := append([]string{"stats", "--json"}, describeArgs(d, name)...)
	out, _, err := run(args...)
	if err != nil {
		b.Fatal(err)
	}
	want := `"ready":49000,"scheduled":30000,"in_work":1000,"dead":20000,"done":900000`
	if !strings.Contains(out, want) {
		b.Fatalf("stats: %s, want %s", out, want)
	}
	b.ResetTimer()
	for range b.N {
		if _, _, err := run(args...); err != nil {
			b.Fatal(err)
		}
	}
}
