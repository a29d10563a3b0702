#!/usr/bin/env bash
# The runs behind docs/performance.md's sections on many processes and on
# each form against its own statements, against the local servers: for
# PostgreSQL and MariaDB, one process against four on one table
# (--procs-compare 4: lease and advisory 1 x 1,000 handlers against
# 4 x 250, row lock 1 x 32 against 4 x 8; with --procs-apart, the four
# processes also on a table each, which splits the ratio into what the
# processes cost and what sharing the table costs), then the lease and advisory
# forms against their floors (--floor) at 64 and 1,000 handlers. Each
# comparison runs ROUNDS times (--rounds: alternating which side runs
# first, the median printed); the process comparisons run twice, with each
# worker on Go's default GOMAXPROCS and with --share-cpus. The output is
# kept in $OUT/scale.log (default /var/tmp/sqlxbroker-bench).
#
#   bash scripts/bench-scale.sh            # both databases, ROUNDS=3
#   bash scripts/bench-scale.sh postgres   # one of them
#
# SCALE multiplies the rows of every drain (default 1): on a machine that
# drains a set's rows in under a second, SCALE=4 keeps each run long
# enough that starting and ending the processes weigh little.
#
# DSNs as scripts/bench-sweep.sh sets them.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
ROUNDS=${ROUNDS:-3}
SCALE=${SCALE:-1}
OUT=${OUT:-/var/tmp/sqlxbroker-bench}
mkdir -p "$OUT"
PG=${SQLXBROKER_POSTGRES_DSN:-postgres://root@127.0.0.1:5432/test?sslmode=disable}
MY=${SQLXBROKER_MYSQL_DSN:-root@tcp(127.0.0.1:3306)/test}
case "$PG" in *\?*) PG="$PG&binary_parameters=yes" ;; *) PG="$PG?binary_parameters=yes" ;; esac
case "$MY" in *\?*) MY="$MY&interpolateParams=true&tx_isolation=%27READ-COMMITTED%27" ;; *) MY="$MY?interpolateParams=true&tx_isolation=%27READ-COMMITTED%27" ;; esac

bin="$OUT/sqlxbroker"
go build -o "$bin" ./cmd/sqlxbroker
log="$OUT/scale.log"

run() { # label, then bench flags
	echo "== $1 $(date -u +%H:%M:%S)" | tee -a "$log"
	shift
	"$bin" bench --table perf_scale "$@" 2>&1 | tee -a "$log"
}

for db in postgres mysql; do
	[ "$what" = all ] || [ "$what" = "$db" ] || continue
	case $db in
	postgres) dsn=$PG; big=100000; adv=50000; rl=20000 ;;
	mysql) dsn=$MY; big=50000; adv=50000; rl=10000 ;;
	esac
	big=$((big * SCALE)) adv=$((adv * SCALE)) rl=$((rl * SCALE))
	for share in "" --share-cpus; do
		run "$db procs lease $share" --driver $db --dsn "$dsn" --form lease --concurrency 1000 --rows $big --procs-compare 4 --procs-apart --rounds "$ROUNDS" $share
		run "$db procs row-lock $share" --driver $db --dsn "$dsn" --form row-lock --concurrency 32 --rows $rl --procs-compare 4 --procs-apart --rounds "$ROUNDS" $share
		run "$db procs advisory $share" --driver $db --dsn "$dsn" --form advisory --concurrency 1000 --rows $adv --procs-compare 4 --procs-apart --rounds "$ROUNDS" $share
	done
	run "$db floors" --driver $db --dsn "$dsn" --form lease,advisory --concurrency 64,1000 --rows $adv --floor --rounds $((ROUNDS + 2)) --commit-duration -1s
done
