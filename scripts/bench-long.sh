#!/usr/bin/env bash
# The runs behind docs/performance.md's sections on latency under load and
# on long runs, against the local servers. Each writes one JSON line per
# run to $OUT/long.jsonl (default /var/tmp/sqlxbroker-bench) and its
# progress to $OUT/long.log; `sqlxbroker bench --from $OUT/long.jsonl --svg
# F` draws the sampled runs over time.
#
#   bash scripts/bench-long.sh latency   # PostgreSQL, every form: 1,000/s
#                                        # while 100,000 older rows drain
#   bash scripts/bench-long.sh postgres  # 30 min: PostgreSQL lease, rows deleted
#   bash scripts/bench-long.sh mariadb   # 30 min: MariaDB lease, rows deleted
#   bash scripts/bench-long.sh done      # 30 min: PostgreSQL lease, DoneAt
#                                        # table pruned every 10 s by Prune
#   bash scripts/bench-long.sh hold      # 30 min: PostgreSQL lease, rows
#                                        # deleted, at HOLD_RATE, with a
#                                        # transaction held open
#
# Run them one at a time: a transaction holding a transaction id (as
# --hold-tx's does) is in every snapshot the server takes, in every
# database, so it holds back the vacuum of every table, not only its own
# database's.
#
# LABEL is added to the PostgreSQL run's label. PG_SETUP, when set, is run
# on the PostgreSQL tables once created
# (--setup: per-table autovacuum settings, say). On a server whose
# autovacuum is off nothing removes the dead rows: docs/performance.md
# shows both.
#
# DURATION (default 30m), INTERVAL (10s), CONC (64), PG_RATE, MY_RATE and
# HOLD_RATE (messages/s; PG_RATE and MY_RATE half the lease drain's rate
# at CONC handlers, measured just before) override the defaults. DSNs as
# scripts/bench-sweep.sh sets them.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:?usage: bench-long.sh latency|postgres|mariadb|done|hold}
OUT=${OUT:-/var/tmp/sqlxbroker-bench}
DURATION=${DURATION:-30m}
INTERVAL=${INTERVAL:-10s}
CONC=${CONC:-64}
PG_RATE=${PG_RATE:-13200}
MY_RATE=${MY_RATE:-7500}
HOLD_RATE=${HOLD_RATE:-1000}
mkdir -p "$OUT"
PG=${SQLXBROKER_POSTGRES_DSN:-postgres://root@127.0.0.1:5432/test?sslmode=disable}
MY=${SQLXBROKER_MYSQL_DSN:-root@tcp(127.0.0.1:3306)/test}
case "$PG" in *\?*) PG="$PG&binary_parameters=yes" ;; *) PG="$PG?binary_parameters=yes" ;; esac
case "$MY" in *\?*) MY="$MY&interpolateParams=true&tx_isolation=%27READ-COMMITTED%27" ;; *) MY="$MY?interpolateParams=true&tx_isolation=%27READ-COMMITTED%27" ;; esac
bin="$OUT/sqlxbroker"
go build -o "$bin" ./cmd/sqlxbroker
log="$OUT/long.log"
jsonl="$OUT/long.jsonl"
steady() { "$bin" bench --mode steady --json --commit-duration -1s --interval "$INTERVAL" "$@" >>"$jsonl" 2>>"$log"; }
case "$what" in
latency)
	for f in lease:100 advisory:32 advisory:16 row-lock:8 row-lock:32; do
		steady --driver postgres --dsn "$PG" --form "${f%:*}" --concurrency "${f#*:}" --rate 1000 \
			--duration 15s --interval 1s --backlog 100000 --prioritized --table sxb_latency \
			--label "latency ${f%:*} ${f#*:} handlers, 100,000 backlog, prioritized"
	done
	;;
postgres)
	steady --driver postgres --dsn "$PG" --form lease --concurrency "$CONC" --rate "$PG_RATE" --duration "$DURATION" \
		--table sxb_long_pg --label "PostgreSQL lease, rows deleted, $PG_RATE/s${LABEL:+, $LABEL}" ${PG_SETUP:+--setup "$PG_SETUP"}
	;;
mariadb)
	steady --driver mysql --dsn "$MY" --form lease --concurrency "$CONC" --rate "$MY_RATE" --duration "$DURATION" \
		--table sxb_long_my --label "MariaDB lease, rows deleted, $MY_RATE/s"
	;;
done)
	steady --driver postgres --dsn "$PG" --form lease --concurrency "$CONC" --rate "$PG_RATE" --duration "$DURATION" \
		--done-at --prune-every 10s --prune-age 10s --table sxb_long_done ${PG_SETUP:+--setup "$PG_SETUP"} \
		--label "PostgreSQL lease, DoneAt pruned every 10 s, $PG_RATE/s${LABEL:+, $LABEL}"
	;;
hold)
	steady --driver postgres --dsn "$PG" --form lease --concurrency "$CONC" --rate "$HOLD_RATE" --duration "$DURATION" \
		--hold-tx --table sxb_long_hold ${PG_SETUP:+--setup "$PG_SETUP"} \
		--label "PostgreSQL lease, rows deleted, a transaction held open, $HOLD_RATE/s${LABEL:+, $LABEL}"
	;;
*)
	echo "bench-long.sh: unknown run $what (latency, postgres, mariadb, done or hold)" >&2
	exit 2
	;;
esac
echo "runs appended to $jsonl"
