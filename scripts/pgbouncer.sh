#!/usr/bin/env bash
# Start two PgBouncer instances on loopback in front of the local
# PostgreSQL (127.0.0.1:5432, database test, user root, trust auth), for
# the pooler tests of dialects/postgres:
#
#   session mode      127.0.0.1:6432  SQLXBROKER_PGBOUNCER_SESSION_DSN
#   transaction mode  127.0.0.1:6433  SQLXBROKER_PGBOUNCER_TX_DSN
#
# Debian's pgbouncer package is installed when absent (apt-get). PgBouncer
# refuses to run as root, so as root each instance runs as the system user
# sqlxpgb (created when missing). Configuration, pid and log files live
# under SQLXBROKER_PGBOUNCER_DIR (default /tmp/sqlxbroker-pgbouncer), one
# directory per mode.
#
#   eval "$(bash scripts/pgbouncer.sh)"       # start (or reuse) both
#   bash scripts/pgbouncer.sh stop            # stop both
#
# Idempotent: an instance already running with the same configuration is
# reused; one whose configuration changed is restarted. Only
# `export NAME=value` lines go to stdout; everything else goes to stderr.
#
# The transaction-mode DSN carries binary_parameters=yes: without it lib/pq
# sends a statement with arguments in two round trips (parse, then bind),
# and a transaction-mode pooler may run the second on another server.
#
# Environment:
#   SQLXBROKER_PGBOUNCER_DIR           state directory (default /tmp/sqlxbroker-pgbouncer)
#   SQLXBROKER_PGBOUNCER_SESSION_PORT  session-mode port (default 6432)
#   SQLXBROKER_PGBOUNCER_TX_PORT       transaction-mode port (default 6433)
#   SQLXBROKER_PGBOUNCER_UPSTREAM      upstream host:port (default 127.0.0.1:5432)
set -euo pipefail

DIR=${SQLXBROKER_PGBOUNCER_DIR:-/tmp/sqlxbroker-pgbouncer}
SESSION_PORT=${SQLXBROKER_PGBOUNCER_SESSION_PORT:-6432}
TX_PORT=${SQLXBROKER_PGBOUNCER_TX_PORT:-6433}
UPSTREAM=${SQLXBROKER_PGBOUNCER_UPSTREAM:-127.0.0.1:5432}
UP_HOST=${UPSTREAM%:*} UP_PORT=${UPSTREAM##*:}
OSUSER=sqlxpgb
PSQL=${PSQL:-psql}

PATH=$PATH:/usr/sbin:/sbin # Debian installs pgbouncer in /usr/sbin
log() { echo "pgbouncer.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

# pidof_mode MODE prints the pid of the mode's running instance, if any.
pidof_mode() {
  local pf="$DIR/$1/pgbouncer.pid" pid
  [ -f "$pf" ] || return 0
  pid=$(cat "$pf" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q pgbouncer "/proc/$pid/cmdline" 2>/dev/null; then
    echo "$pid"
  fi
}

stop_mode() {
  local pid
  pid=$(pidof_mode "$1")
  [ -n "$pid" ] || return 0
  log "$1: stopping pid $pid"
  kill "$pid"
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

if [ "${1:-}" = stop ]; then
  stop_mode session
  stop_mode transaction
  exit 0
fi
[ $# -eq 0 ] || die "unknown argument \"$1\" (none, or stop)"

if ! command -v pgbouncer >/dev/null; then
  [ "$(id -u)" -eq 0 ] || die "pgbouncer is not installed and installing it needs root"
  log "installing pgbouncer (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >&2 \
    || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >&2; } \
    || die "apt-get install pgbouncer failed"
fi
command -v "$PSQL" >/dev/null || die "psql client not found"

RUNAS=()
if [ "$(id -u)" -eq 0 ]; then
  if ! id "$OSUSER" >/dev/null 2>&1; then
    log "creating system user $OSUSER"
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$OSUSER" >&2
  fi
  RUNAS=(-u "$OSUSER") # pgbouncer switches to the user itself
fi

# config MODE PORT POOL prints an instance's pgbouncer.ini. auth_type any:
# no authentication, every client logs in upstream as root (the test
# server trusts loopback). Pool sizes leave room for the conformance
# suite's brokers (in either mode a row-lock delivery in work holds a server
# connection, and the suite holds up to about 70 at once in session mode,
# 40 in transaction mode); idle server connections close after 5 s, so the
# shared server's connection slots come back between test runs, and a
# client waits at most 30 s for a server connection.
config() {
  local mode=$1 port=$2 pool=$3 d="$DIR/$1"
  cat <<EOF
[databases]
* = host=$UP_HOST port=$UP_PORT user=root

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
pidfile = $d/pgbouncer.pid
logfile = $d/pgbouncer.log
auth_type = any
pool_mode = $mode
max_client_conn = 1000
default_pool_size = $pool
max_db_connections = $pool
server_idle_timeout = 5
query_wait_timeout = 30
ignore_startup_parameters = extra_float_digits,search_path
log_connections = 0
log_disconnections = 0
admin_users = root
stats_users = root
EOF
}

ready() { # PORT
  "$PSQL" -h 127.0.0.1 -p "$1" -U root -d test -tAc 'SELECT 1' >/dev/null 2>&1
}

# start MODE PORT POOL PORTVAR starts the mode's instance unless it already
# runs with this configuration (PORTVAR: the variable that sets PORT).
start() {
  local mode=$1 port=$2 pool=$3 portvar=$4 d="$DIR/$1" pid
  mkdir -p "$d"
  local want
  want=$(config "$mode" "$port" "$pool")
  pid=$(pidof_mode "$mode")
  if [ -n "$pid" ] && [ "$(cat "$d/pgbouncer.ini" 2>/dev/null)" = "$want" ] && ready "$port"; then
    log "$mode mode: already running on port $port (pid $pid)"
    return
  fi
  stop_mode "$mode"
  rm -f "$d/pgbouncer.pid" # a hard-killed instance's
  printf '%s\n' "$want" >"$d/pgbouncer.ini"
  touch "$d/pgbouncer.log"
  [ ${#RUNAS[@]} -eq 0 ] || chown -R "$OSUSER" "$d"
  if ss -ltn "sport = :$port" 2>/dev/null | grep -q LISTEN; then
    die "port $port is taken by another process (set $portvar)"
  fi
  log "$mode mode: starting on port $port (log $d/pgbouncer.log)"
  pgbouncer -d "${RUNAS[@]}" "$d/pgbouncer.ini" >&2 || { tail -n 20 "$d/pgbouncer.log" >&2; die "$mode mode did not start"; }
  for _ in $(seq 1 100); do ready "$port" && break; sleep 0.1; done
  ready "$port" || { tail -n 20 "$d/pgbouncer.log" >&2; die "$mode mode: no answer on port $port"; }
  log "$mode mode: $("$PSQL" -h 127.0.0.1 -p "$port" -U root -d pgbouncer -tAc 'SHOW VERSION' 2>/dev/null | head -n1)"
}

ready_upstream() { "$PSQL" -h "$UP_HOST" -p "$UP_PORT" -U root -d test -tAc 'SELECT 1' >/dev/null 2>&1; }
ready_upstream || die "PostgreSQL is not reachable at $UPSTREAM (user root, database test)"

start session "$SESSION_PORT" 80 SQLXBROKER_PGBOUNCER_SESSION_PORT
start transaction "$TX_PORT" 50 SQLXBROKER_PGBOUNCER_TX_PORT
echo "export SQLXBROKER_PGBOUNCER_SESSION_DSN=postgres://root@127.0.0.1:$SESSION_PORT/test?sslmode=disable"
echo "export SQLXBROKER_PGBOUNCER_TX_DSN='postgres://root@127.0.0.1:$TX_PORT/test?sslmode=disable&binary_parameters=yes'"
