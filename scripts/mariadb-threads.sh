#!/usr/bin/env bash
# Start (or stop) a second MariaDB server on 127.0.0.1:3307 with the thread
# handling asked for, for the runs of docs/performance.md that compare a
# server running every session's statement on a thread of its own with one
# running them on a pool of threads about one per CPU:
#
#   eval "$(bash scripts/mariadb-threads.sh pool)"  # thread_handling=pool-of-threads
#   eval "$(bash scripts/mariadb-threads.sh one)"   # one-thread-per-connection
#   bash scripts/mariadb-threads.sh stop            # stop it, remove its data
#
# then, for example, `bash scripts/bench-scale.sh mysql`. The server is the
# system's mariadbd with no option file (--no-defaults) and the buffer pool
# and redo log sizes of the system server on 3306 (128 MiB, 96 MiB), so
# that the two settings are compared on the same server; EXTRA_ARGS adds
# options (e.g. EXTRA_ARGS=--thread-pool-size=4). Data, socket and log live
# under $SQLXBROKER_MARIADB_THREADS_DIR (default /var/tmp/sqlxbroker-mariadb-threads)
# and are test data: a server already running with another thread handling
# is stopped and started afresh. Only the `export` line goes to stdout;
# progress goes to stderr. The system MariaDB on 3306 is left alone.
set -euo pipefail

DIR=${SQLXBROKER_MARIADB_THREADS_DIR:-/var/tmp/sqlxbroker-mariadb-threads}
PORT=3307
DSN="root@tcp(127.0.0.1:$PORT)/test"

log() { echo "mariadb-threads: $*" >&2; }
die() { log "error: $*"; exit 1; }
q() { mariadb --no-defaults -uroot -S "$DIR/mysqld.sock" -N -B -e "$1" 2>/dev/null; }

stop() {
  local pid
  pid=$(cat "$DIR/mysqld.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    log "stopping the server on $PORT"
    kill "$pid"
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  fi
  rm -rf "$DIR"
}

case ${1:-} in
  stop) stop; exit 0 ;;
  pool) want=pool-of-threads ;;
  one) want=one-thread-per-connection ;;
  *) die "usage: $0 pool|one|stop" ;;
esac

if [ "$(q 'SELECT @@thread_handling' || true)" = "$want" ] && [ "${EXTRA_ARGS:-}" = "$(cat "$DIR/extra" 2>/dev/null)" ]; then
  log "reusing the server on $PORT ($want)"
  echo "export SQLXBROKER_MYSQL_DSN='$DSN'"
  exit 0
fi
stop
mkdir -p "$DIR"
chown mysql:mysql "$DIR"
printf '%s' "${EXTRA_ARGS:-}" >"$DIR/extra"
mariadb-install-db --no-defaults --datadir="$DIR/data" --user=mysql --auth-root-authentication-method=normal \
  --skip-test-db >"$DIR/install.log" 2>&1 || { cat "$DIR/install.log" >&2; die "mariadb-install-db failed"; }
log "starting mariadbd on 127.0.0.1:$PORT with thread_handling=$want"
# shellcheck disable=SC2086 # EXTRA_ARGS is a list of options
start-stop-daemon --start --background --name mariadbd --pidfile "$DIR/mysqld.pid" --chuid mysql \
  --startas /usr/sbin/mariadbd -- --no-defaults --datadir="$DIR/data" --port=$PORT --bind-address=127.0.0.1 \
  --socket="$DIR/mysqld.sock" --pid-file="$DIR/mysqld.pid" --log-error="$DIR/error.log" --skip-log-bin \
  --innodb-buffer-pool-size=128M --innodb-log-file-size=96M --thread-handling=$want ${EXTRA_ARGS:-}
for _ in $(seq 60); do q 'SELECT 1' >/dev/null && break; sleep 1; done
got=$(q 'SELECT @@thread_handling') || { cat "$DIR/error.log" >&2; die "the server on $PORT did not start"; }
[ "$got" = "$want" ] || die "the server runs thread_handling=$got, not $want"
q 'CREATE DATABASE IF NOT EXISTS test'
echo "export SQLXBROKER_MYSQL_DSN='$DSN'"
