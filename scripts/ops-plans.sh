#!/usr/bin/env bash
# Fills a 1,000,000-row lease table (900k done, 49k ready, 1k in work, 30k
# scheduled, 20k dead) on PostgreSQL and MariaDB with the DDL `sqlxbroker ddl`
# prints, and shows the plan and time of each statement Broker.Counts runs
# (the SQL of ops.go's countQueries, the host's time inlined), then times
# `sqlxbroker stats` on it; on MariaDB again after dropping the counts'
# column sqlxbroker_state (the table scans a table made by other DDL gets).
# The table (PLANS_TABLE, default a random name) is dropped at the end.
#   PG_DSN=postgres://root@127.0.0.1:5432/test?sslmode=disable MY_DSN='root@tcp(127.0.0.1:3306)/test' bash scripts/ops-plans.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PG_DSN=${PG_DSN:-postgres://root@127.0.0.1:5432/test?sslmode=disable}
MY_DSN=${MY_DSN:-root@tcp(127.0.0.1:3306)/test}
T=${PLANS_TABLE:-sxb_plans_$RANDOM$RANDOM}
BIN=$(mktemp -d)/sqlxbroker
trap 'rm -rf "$(dirname "$BIN")"' EXIT
go build -o "$BIN" ./cmd/sqlxbroker
DESC=(--table "$T" --locked-until locked_until --ready-at ready_at --dead-at dead_at --done-at done_at --last-error last_error)
NOW=$(date -u +"%Y-%m-%d %H:%M:%S.000000")
LATER=$(date -u -d "+60 seconds" +"%Y-%m-%d %H:%M:%S.000000")   # now + 2 leases

echo "## PostgreSQL"
"$BIN" ddl --driver postgres "${DESC[@]}" --payload body:text | psql -q "$PG_DSN"
psql -q "$PG_DSN" <<SQL
INSERT INTO $T (attempt, ready_at, dead_at, done_at, last_error, locked_until, body)
SELECT CASE WHEN g > 900000 AND g <= 920000 THEN 3 ELSE 1 END,
  CASE WHEN g > 920000 AND g <= 950000 THEN '$NOW'::timestamptz + make_interval(secs => g - 920000)
       ELSE '$NOW'::timestamptz - make_interval(secs => 1000001 - g) END,
  CASE WHEN g > 900000 AND g <= 920000 THEN '$NOW'::timestamptz - interval '1 hour' END,
  CASE WHEN g <= 900000 THEN '$NOW'::timestamptz - make_interval(secs => 1000001 - g) END,
  CASE WHEN g > 900000 AND g <= 920000 THEN 'boom' END,
  CASE WHEN g > 999000 THEN '$NOW'::timestamptz + interval '20 seconds' END,
  'payload ' || g
FROM generate_series(1, 1000000) g;
VACUUM (ANALYZE) $T;
SQL
q() { echo "### $1"; echo '```'; psql -qAt "$PG_DSN" -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) $2"; echo '```'; }
N="'$NOW'"; L="'$LATER'"
UNF="c.dead_at IS NULL AND c.done_at IS NULL"
NL="(c.locked_until IS NULL OR c.locked_until <= $N OR c.locked_until > $L)"
q ready     "SELECT COUNT(*) FROM $T c WHERE $UNF AND (c.ready_at IS NULL OR c.ready_at <= $N) AND $NL"
q scheduled "SELECT COUNT(*) FROM $T c WHERE $UNF AND c.ready_at > $N AND $NL"
q in-work   "SELECT COUNT(*) FROM $T c WHERE $UNF AND (c.locked_until > $N AND c.locked_until <= $L)"
q dead      "SELECT COUNT(*) FROM $T c WHERE c.dead_at IS NOT NULL"
q done      "SELECT COUNT(*) FROM $T c WHERE c.done_at IS NOT NULL AND c.dead_at IS NULL"
q oldest    "SELECT c.ready_at FROM $T c WHERE $UNF AND (c.ready_at IS NULL OR c.ready_at <= $N) AND $NL AND c.ready_at IS NOT NULL ORDER BY c.ready_at LIMIT 1"
echo "### sqlxbroker stats"
for i in 1 2 3; do /usr/bin/time -f "%e s" "$BIN" stats --driver postgres --dsn "$PG_DSN" "${DESC[@]}" 2>&1; done
psql -q "$PG_DSN" -c "DROP TABLE $T"

echo "## MariaDB"
MYARGS=(-h 127.0.0.1 -u root test)
"$BIN" ddl --driver mysql "${DESC[@]}" --payload body:text | mysql "${MYARGS[@]}"
mysql "${MYARGS[@]}" <<SQL
INSERT INTO $T (attempt, ready_at, dead_at, done_at, last_error, locked_until, body)
SELECT IF(seq > 900000 AND seq <= 920000, 3, 1),
  IF(seq > 920000 AND seq <= 950000, '$NOW' + INTERVAL (seq - 920000) SECOND, '$NOW' - INTERVAL (1000001 - seq) SECOND),
  IF(seq > 900000 AND seq <= 920000, '$NOW' - INTERVAL 1 HOUR, NULL),
  IF(seq <= 900000, '$NOW' - INTERVAL (1000001 - seq) SECOND, NULL),
  IF(seq > 900000 AND seq <= 920000, 'boom', NULL),
  IF(seq > 999000, '$NOW' + INTERVAL 20 SECOND, NULL),
  CONCAT('payload ', seq)
FROM seq_1_to_1000000;
ANALYZE TABLE $T;
SQL
# The table has the counts' column (sqlxbroker_state: 0 unfinished, 1 done,
# 2 dead), so Counts reads it instead of the state columns (the dialect's
# StateMarks), in one snapshot, and counts the unfinished rows in place of
# the rows in work.
mq() {
  echo "### $1"; echo '```'; mysql "${MYARGS[@]}" -t -e "ANALYZE $2"
  # The statement's own time (the JSON's second r_total_time_ms; the first is the optimizer's).
  mysql "${MYARGS[@]}" -N -r -e "ANALYZE FORMAT=JSON $2" | grep -o '"r_total_time_ms": [0-9.]*' | sed -n 2p
  echo '```'
}
MUNF="c.sqlxbroker_state = 0"
mq ready     "SELECT COUNT(*) FROM $T c WHERE $MUNF AND (c.ready_at IS NULL OR c.ready_at <= $N) AND $NL"
mq scheduled "SELECT COUNT(*) FROM $T c WHERE $MUNF AND c.ready_at > $N AND $NL"
mq unfinished "SELECT COUNT(*) FROM $T c WHERE $MUNF"   # in work: these less ready and scheduled
mq dead      "SELECT COUNT(*) FROM $T c WHERE c.sqlxbroker_state = 2"
mq done      "SELECT COUNT(*) FROM $T c WHERE c.sqlxbroker_state = 1"
mq oldest    "SELECT c.ready_at FROM $T c WHERE $MUNF AND (c.ready_at IS NULL OR c.ready_at <= $N) AND $NL AND c.ready_at IS NOT NULL ORDER BY c.ready_at LIMIT 1"
echo "### sqlxbroker stats"
for i in 1 2 3; do /usr/bin/time -f "%e s" "$BIN" stats --driver mysql --dsn "$MY_DSN" "${DESC[@]}" 2>&1; done
echo "### sqlxbroker stats without the counts' column (table scans, as on a table made by other DDL)"
mysql "${MYARGS[@]}" -e "ALTER TABLE $T DROP COLUMN sqlxbroker_state"
for i in 1 2 3; do /usr/bin/time -f "%e s" "$BIN" stats --driver mysql --dsn "$MY_DSN" "${DESC[@]}" 2>&1; done
mysql "${MYARGS[@]}" -e "DROP TABLE $T"
