#!/usr/bin/env bash
# Start (or stop) a three-node MariaDB Galera cluster on loopback, for the
# MySQL dialect's Galera tests (dialects/mysql/galera_test.go).
#
#   eval "$(bash scripts/galera.sh)"     # start, export SQLXBROKER_GALERA_DSNS
#   bash scripts/galera.sh stop          # stop the nodes, remove their data
#
# Nodes n1..n3: SQL on 127.0.0.1:3311..3313, group communication on
# 14571..14573, IST on 14581..14583, SST (rsync) on 14591..14593 (below
# the kernel's ephemeral range, 32768-60999 here: a client connection's
# source port there can hold a node's port, and the joiner's rsync daemon
# then fails to bind it, as it once did), sockets, data and logs under $SQLXBROKER_GALERA_DIR (default /tmp/sqlxbroker-galera).
# n1 bootstraps the cluster (--wsrep-new-cluster); n2 and n3 join it by SST.
# The server is the system's mariadbd (wsrep built in); the provider is
# Debian's galera-4, installed with apt-get when missing, as is rsync.
#
# Idempotent: a cluster already running with three nodes is reused. A
# stopped or partial one is stopped and started afresh (its data is test
# data). Only the `export` line goes to stdout; progress goes to stderr.
# Nothing touches another server (the system MariaDB on 3306 and its
# datadir are left alone).
set -euo pipefail

DIR=${SQLXBROKER_GALERA_DIR:-/tmp/sqlxbroker-galera}
MARIADBD=${MARIADBD:-/usr/sbin/mariadbd}
PROVIDER=/usr/lib/galera/libgalera_smm.so
NODES=(1 2 3)
# The nodes run as the mysql user: run as root, the joiner's rsync daemon
# (rsync SST) would write as nobody and fail.
RUNAS=${SQLXBROKER_GALERA_USER:-mysql}
DSNS="root@tcp(127.0.0.1:3311)/test,root@tcp(127.0.0.1:3312)/test,root@tcp(127.0.0.1:3313)/test"
GCOMM="gcomm://127.0.0.1:14571,127.0.0.1:14572,127.0.0.1:14573"

log() { echo "galera: $*" >&2; }
die() { log "error: $*"; exit 1; }

sqlport() { echo $((3310 + $1)); }
sock() { echo "$DIR/n$1/mysqld.sock"; }
# q N SQL: run SQL on node N through its socket, tab-separated, no header.
q() { mariadb --no-defaults -uroot -S "$(sock "$1")" -N -B -e "$2" 2>/dev/null; }
size() { q "$1" "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'WSREP_CLUSTER_SIZE'" || echo 0; }
synced() { [ "$(q "$1" "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'WSREP_LOCAL_STATE_COMMENT'" || true)" = Synced ]; }

stop_node() {
  local pidf="$DIR/n$1/mysqld.pid" pid
  [ -f "$pidf" ] || return 0
  pid=$(cat "$pidf" 2>/dev/null || true)
  [ -n "$pid" ] || return 0
  if kill -0 "$pid" 2>/dev/null && grep -q mariadbd "/proc/$pid/cmdline" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then log "n$1 (pid $pid) did not stop in 30 s: killing it"; kill -9 "$pid"; fi
  fi
  rm -f "$pidf"
}

stop_all() {
  # Joiners first, the bootstrap node last.
  for n in 3 2 1; do stop_node "$n"; done
  rm -rf "$DIR"
}

if [ "${1:-}" = stop ]; then
  stop_all
  log "stopped"
  exit 0
fi
[ $# -eq 0 ] || die "usage: $0 [stop]"

if [ "$(size 1)" = 3 ] && synced 1 && synced 2 && synced 3; then
  log "cluster already running (3 nodes)"
  echo "export SQLXBROKER_GALERA_DSNS=\"$DSNS\""
  exit 0
fi

start=$(date +%s.%N)
missing=()
[ -f "$PROVIDER" ] || missing+=(galera-4)
command -v rsync >/dev/null || missing+=(rsync)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi
[ -x "$MARIADBD" ] || die "$MARIADBD not found"
"$MARIADBD" --no-defaults --help --verbose 2>/dev/null | grep -q '^wsrep-on' || die "$MARIADBD has no wsrep support"

stop_all
id "$RUNAS" >/dev/null 2>&1 || die "no user $RUNAS to run the nodes as (set SQLXBROKER_GALERA_USER)"

config() {
  local n=$1 d="$DIR/n$1"
  cat >"$d/my.cnf" <<EOF
[mysqld]
user=$RUNAS
datadir=$d/data
socket=$d/mysqld.sock
pid-file=$d/mysqld.pid
log-error=$d/error.log
port=$(sqlport "$n")
bind-address=127.0.0.1
skip-name-resolve
skip-log-bin
binlog_format=ROW
default_storage_engine=InnoDB
innodb_autoinc_lock_mode=2
innodb_buffer_pool_size=128M
innodb_log_file_size=64M
innodb_flush_log_at_trx_commit=2
max_connections=300
wsrep_on=ON
wsrep_provider=$PROVIDER
wsrep_cluster_name=sqlxbroker
wsrep_cluster_address=$GCOMM
wsrep_node_name=n$n
wsrep_node_address=127.0.0.1
wsrep_node_incoming_address=127.0.0.1:$(sqlport "$n")
wsrep_provider_options="base_host=127.0.0.1;base_port=$((14570 + n));gmcast.listen_addr=tcp://127.0.0.1:$((14570 + n));ist.recv_addr=127.0.0.1:$((14580 + n));gcache.size=64M"
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:$((14590 + n))
wsrep_slave_threads=2
EOF
}

# wait_for N WHAT CHECK...: wait up to 120 s for CHECK to succeed while
# node N runs.
wait_for() {
  local n=$1 what=$2 pid
  shift 2
  pid=$(cat "$DIR/n$n/launch.pid")
  for _ in $(seq 1 1200); do
    if "$@"; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$DIR/n$n/error.log" >&2 || true
      die "n$n exited while waiting for $what (log: $DIR/n$n/error.log)"
    fi
    sleep 0.1
  done
  tail -n 30 "$DIR/n$n/error.log" >&2 || true
  die "n$n: timed out waiting for $what (log: $DIR/n$n/error.log)"
}
size3() { [ "$(size 1)" = 3 ]; }

launch() {
  local n=$1
  shift
  # setsid: the node outlives this script and its terminal.
  setsid "$MARIADBD" --defaults-file="$DIR/n$n/my.cnf" "$@" </dev/null >>"$DIR/n$n/stdout.log" 2>&1 &
  echo $! >"$DIR/n$n/launch.pid"
}

for n in "${NODES[@]}"; do
  mkdir -p "$DIR/n$n/data"
  config "$n"
done
[ "$(id -u)" != 0 ] || chown -R "$RUNAS" "$DIR"

log "initialising n1"
mariadb-install-db --defaults-file="$DIR/n1/my.cnf" --user="$RUNAS" --auth-root-authentication-method=normal \
  --skip-test-db --wsrep-on=OFF >"$DIR/n1/install.log" 2>&1 || { cat "$DIR/n1/install.log" >&2; die "mariadb-install-db failed"; }

log "bootstrapping n1"
launch 1 --wsrep-new-cluster
wait_for 1 "Synced" synced 1
q 1 "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
CREATE DATABASE IF NOT EXISTS test;" || die "creating root@127.0.0.1 and database test failed"

for n in 2 3; do
  log "starting n$n (SST from the cluster)"
  launch "$n"
  wait_for "$n" "Synced" synced "$n"
done
wait_for 1 "cluster size 3" size3

log "cluster of 3 nodes up in $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }') s"
echo "export SQLXBROKER_GALERA_DSNS=\"$DSNS\""
