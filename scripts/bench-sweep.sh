#!/usr/bin/env bash
# Run the benchmarks behind docs/performance.md against the local servers:
# a sweep of every form at several concurrencies on PostgreSQL, MariaDB and
# an SQLite file (one SVG chart per database into docs/), then the runs the
# targets are checked with. Every run prints a JSON line; all of them are
# collected in $OUT/results.jsonl (default /var/tmp/sqlxbroker-bench).
#
#   bash scripts/bench-sweep.sh            # everything (about 15 minutes)
#   bash scripts/bench-sweep.sh sweep      # only the sweep and its charts
#   bash scripts/bench-sweep.sh targets    # only the target runs
#
# DSNs: SQLXBROKER_POSTGRES_DSN, SQLXBROKER_MYSQL_DSN (defaults: the local
# servers). The PostgreSQL DSN gets binary_parameters=yes (one round trip
# per statement) and the MySQL DSN interpolateParams=true and sessions at
# READ COMMITTED, as docs/performance.md recommends; the raw commit loop
# each run compares with uses the same DSN.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
OUT=${OUT:-/var/tmp/sqlxbroker-bench}
mkdir -p "$OUT"
PG=${SQLXBROKER_POSTGRES_DSN:-postgres://root@127.0.0.1:5432/test?sslmode=disable}
MY=${SQLXBROKER_MYSQL_DSN:-root@tcp(127.0.0.1:3306)/test}
case "$PG" in *\?*) PG="$PG&binary_parameters=yes" ;; *) PG="$PG?binary_parameters=yes" ;; esac
case "$MY" in *\?*) MY="$MY&interpolateParams=true&tx_isolation=%27READ-COMMITTED%27" ;; *) MY="$MY?interpolateParams=true&tx_isolation=%27READ-COMMITTED%27" ;; esac
LITE="$OUT/bench.db"

bin="$OUT/sqlxbroker"
go build -o "$bin" ./cmd/sqlxbroker
results="$OUT/results.jsonl"

run() { # label, then bench flags
	local label=$1
	shift
	echo "== $label" >&2
	"$bin" bench --json "$@" | sed "s/^{/{\"label\":\"$label\",/" | tee -a "$results"
}

if [ "$what" = all ] || [ "$what" = sweep ]; then
	: >"$results"
	for db in postgres mysql sqlite; do
		case $db in
		postgres) dsn=$PG ;;
		mysql) dsn=$MY ;;
		sqlite) dsn=$LITE; rm -f "$LITE"* ;;
		esac
		run "sweep-$db" --driver "$db" --dsn "$dsn" --form all --concurrency 1,8,32,64 --rows 20000 \
			--commit-duration 3s --svg "docs/perf-$db.svg"
	done
fi

if [ "$what" = all ] || [ "$what" = targets ]; then
	for i in 1 2 3; do
		run "pg-lease-100k-1000" --driver postgres --dsn "$PG" --form lease --concurrency 1000 --rows 100000 --commit-duration 3s
	done
	for i in 1 2 3; do
		run "pg-ratio-8" --driver postgres --dsn "$PG" --form row-lock,advisory --concurrency 8 --rows 20000 --commit-duration 3s
		run "my-ratio-8" --driver mysql --dsn "$MY" --form row-lock,advisory --concurrency 8 --rows 20000 --commit-duration 3s
	done
	for i in 1 2; do
		run "my-lease-100k-1000" --driver mysql --dsn "$MY" --form lease --concurrency 1000 --rows 100000 --commit-duration 3s
	done
	for i in 1 2 3; do
		rm -f "$LITE"*
		run "lite-lease-100k-1000" --driver sqlite --dsn "$LITE" --form lease --concurrency 1000 --rows 100000 --commit-duration 3s
	done
	run "pg-backlog-10k" --driver postgres --dsn "$PG" --form lease --concurrency 1000 --rows 10000 --commit-duration -1s
	run "pg-backlog-1m" --driver postgres --dsn "$PG" --form lease --concurrency 1000 --rows 1000000 --commit-duration -1s
	run "pg-backlog-10k" --driver postgres --dsn "$PG" --form lease --concurrency 1000 --rows 10000 --commit-duration -1s
	run "pg-steady-200" --driver postgres --dsn "$PG" --mode steady --rate 200 --duration 20s --form all --concurrency 10 --commit-duration -1s
fi
echo "results: $results" >&2
