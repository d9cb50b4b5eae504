#!/usr/bin/env bash
# What many segment tags cost (issue 43: an allocation should cost what the database's own
# durable commit costs, whether the node serves 1 tag or 1,000,000). For each database and each
# tag count N, on a fresh database whose leaf_alloc holds the tags t000000000000 … t<N-1>:
#   * start_s: from exec until /ready answers 200 and the RESP port answers PING;
#   * rss_bytes: leafd's VmRSS before any request; rss_per_idle_tag = (RSS_N - RSS_1) / N when
#     1 tag is in the list;
#   * metrics_bytes, metrics_render_ms: one GET /metrics before any request (curl's total time);
#   * first-touch load: redis-benchmark -c CLIENTS `INCR segment:t__rand_int__` -r N for
#     SECONDS, as runs of about a second (see bench/tags.py). leafd_req_per_s: INCRs answered
#     (leafd_commands_total{command="incr"}) over that time; p50/p99 ms from the runs that met no
#     error reply; leafd_allocs_per_s: the increase of leafd_segment_loads_total{result="ok"}
#     (every series, whatever its labels) over that time;
#   * direct_allocs_per_s: CLIENTS processes doing leafd's allocation by hand on random rows of
#     the same table for SECONDS (BEGIN [IMMEDIATE]; UPDATE … max_id = max_id + step; SELECT;
#     COMMIT), with leafd stopped; ratio = leafd_allocs_per_s / direct_allocs_per_s (telling
#     only while the load is allocation-bound: with few tags they are all warm within a second);
#   * checks: no error reply during the load (leafd_commands_total{command="incr",result="error"};
#     redis-benchmark also stops at one), then 2,000 INCRs over 200 tags from 4 connections, each
#     an integer, no (tag, ID) twice, a connection's IDs of a tag increasing; leafd still running;
#     no UNAVAILABLE in its log. A failed check is listed after the table, and the exit status is 1.
# Prints a table (and writes it as TSV to $OUT when set). Loopback only; stops by itself (also on
# failure) every process it started and drops every database it created.
#   bench/tags.sh [--quick] [--db "sqlite mysql postgres"] [--seconds S] [--clients C] [N...]
# N: tag counts (default 1 1000 100000; add 1000000 by hand). --quick (CI): sqlite, plus MySQL/
# MariaDB when LEAFD_TEST_MYSQL_URL is set and PostgreSQL when LEAFD_TEST_POSTGRES_URL is set,
# 1 and 1000 tags, 3 s each; the checks fail the run, timings are not judged.
# Env: DATABASES, LOAD_SECONDS (10), CLIENTS (20), DIRECT_CLIENTS (default CLIENTS), OUT, LOGS
# (a directory to keep each run's leafd log in, leafd-<db>-<N>.log),
# LEAFD_BIN (default target/release/leafd, built if missing), LEAFD_TEST_MYSQL_URL (default
# mysql://root@127.0.0.1:3306) and LEAFD_TEST_POSTGRES_URL (default
# postgres://postgres@127.0.0.1:5432): the servers, on which it creates and drops
# leafd_bench_tags_<pid>_<N>. Needs redis-benchmark, redis-cli, curl, python3;
# installs pymysql / psycopg2-binary with pip when a selected database needs them.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
databases=${DATABASES:-}
load_seconds=${LOAD_SECONDS:-}
clients=${CLIENTS:-20}
direct_clients=${DIRECT_CLIENTS:-}
tag_counts=()
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --db|--databases) databases=${2:?--db needs a list}; shift ;;
    --seconds) load_seconds=${2:?--seconds needs a value}; shift ;;
    --clients) clients=${2:?--clients needs a value}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    *) tag_counts+=("$1") ;;
  esac
  shift
done
mysql_base=${LEAFD_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306}
pg_base=${LEAFD_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432}
mysql_base=${mysql_base%/} pg_base=${pg_base%/}
if [ "$quick" = 1 ]; then
  # CI: the servers it has are the ones its test variables name
  if [ -z "$databases" ]; then
    databases=sqlite
    [ -z "${LEAFD_TEST_MYSQL_URL:-}" ] || databases+=" mysql"
    [ -z "${LEAFD_TEST_POSTGRES_URL:-}" ] || databases+=" postgres"
  fi
  [ "${#tag_counts[@]}" -gt 0 ] || tag_counts=(1 1000)
  load_seconds=${load_seconds:-3}
else
  databases=${databases:-sqlite mysql postgres}
  [ "${#tag_counts[@]}" -gt 0 ] || tag_counts=(1 1000 100000)
  load_seconds=${load_seconds:-10}
fi
databases=$(echo "$databases" | tr ',' ' ')
direct_clients=${direct_clients:-$clients}
leafd_bin=${LEAFD_BIN:-target/release/leafd}

for tool in redis-benchmark redis-cli curl python3; do
  command -v "$tool" >/dev/null || { echo "$tool not found (Debian: redis-tools, curl, python3)" >&2; exit 1; }
done
for db in $databases; do
  case $db in sqlite|mysql|postgres) ;; *) echo "unknown database $db (sqlite, mysql, postgres)" >&2; exit 2 ;; esac
done
for n in "${tag_counts[@]}"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] && [ "$n" -le 1000000000000 ] || { echo "not a tag count: $n" >&2; exit 2; }
done
[ -x "$leafd_bin" ] || cargo build --release --quiet
leafd_bin=$(realpath "$leafd_bin")
source bench/common.sh

# The direct client speaks to MariaDB/PostgreSQL through pymysql/psycopg2: installed here when
# missing, so a fresh machine (and CI) needs nothing done by hand.
need_module() { # MODULE PACKAGE
  python3 -c "import $1" 2>/dev/null && return 0
  python3 -m pip install --quiet --root-user-action=ignore --break-system-packages "$2" 2>/dev/null \
    || python3 -m pip install --quiet "$2"
  python3 -c "import $1" || { echo "cannot import $1 after pip install $2" >&2; exit 1; }
}
helper() { python3 bench/tags.py "$@"; }
base_url() { if [ "$1" = mysql ]; then echo "$mysql_base"; else echo "$pg_base"; fi; }
versions=()
for db in $databases; do
  case $db in
    mysql) need_module pymysql pymysql ;;
    postgres) need_module psycopg2 psycopg2-binary ;;
    *) continue ;;
  esac
  version=$(helper info "$db" "$(base_url "$db")" 2>&1) \
    || { echo "no $db server at $(base_url "$db") (scripts/services.sh starts one): $version" >&2; exit 1; }
  versions+=("$version")
done

work=$(mktemp -d /tmp/leafd-tags-bench.XXXXXX)
pids=()     # every process this script started and has not stopped yet
created=()  # "dialect name" of every database this script created and has not dropped yet
stop_pids() { # PID... : SIGTERM, SIGKILL to those left after 10 s
  local pid alive
  for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 100); do
    alive=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "$@"; do kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  local keep=() p
  for p in "${pids[@]}"; do [[ " $* " == *" $p "* ]] || keep+=("$p"); done
  pids=("${keep[@]}")
}
drop_database() { # DIALECT NAME
  helper drop "$1" "$(base_url "$1")" "$2" || echo "could not drop database $2 ($1)" >&2
  local keep=() d
  for d in "${created[@]}"; do [ "$d" = "$1 $2" ] || keep+=("$d"); done
  created=("${keep[@]}")
}
cleanup() {
  set +e
  [ "${#pids[@]}" = 0 ] || stop_pids "${pids[@]}"
  local d
  for d in "${created[@]}"; do drop_database ${d}; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.3f", b - a}'; }
# Runs a helper in the background (so that cleanup can stop it by its pid) and waits for it;
# its stdout goes to FILE, its stderr to FILE.err. Returns the helper's status.
run_helper() { # FILE ARGS...
  local file=$1; shift
  python3 bench/tags.py "$@" > "$file" 2> "$file.err" &
  local pid=$! status=0
  pids+=("$pid")
  wait "$pid" || status=$?
  local keep=() p
  for p in "${pids[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
  pids=("${keep[@]}")
  return "$status"
}

# One GET /metrics into FILE; prints "bytes seconds" (curl's size and total time).
scrape() { # HTTP_PORT FILE
  curl -sf --max-time 300 -o "$2" -w '%{size_download} %{time_total}\n' "http://127.0.0.1:$1/metrics" \
    || { echo "- -"; return 1; }
}
# From a scrape: "loads incr_ok incr_errors": the successful segment loads summed over every
# series of leafd_segment_loads_total{result="ok"} whatever its other labels (a later leafd may
# fold cold tags into one series, tag="_other": summing them all counts it), and INCR's replies.
counters() { # FILE
  awk 'index($0, "leafd_segment_loads_total{") == 1 && index($0, "result=\"ok\"") {loads += $NF}
       index($0, "leafd_commands_total{") == 1 && index($0, "command=\"incr\"") {
         if (index($0, "result=\"ok\"")) ok += $NF; else if (index($0, "result=\"error\"")) errors += $NF}
       END {printf "%.0f %.0f %.0f\n", loads, ok, errors}' "$1"
}

build=""     # leafd_build_info's commit label, from the first scrape
problems=()  # failed checks, printed after the table; any makes the exit status 1
problem() { problems+=("$*"); echo "  PROBLEM: $*" >&2; }
rows=()      # "db|tags|start_s|rss|metrics_bytes|metrics_ms|rps|p50|p99|leafd_allocs|direct_allocs|errors"

# One (database, tag count) cell: see the header for what it measures.
cell() { # DB N
  local db=$1 n=$2 dir="$work/$1-$2" url target name=""
  mkdir -p "$dir"
  case $db in
    sqlite) target="$dir/leafd.db"; url="sqlite://$target" ;;
    mysql|postgres)
      name="leafd_bench_tags_$$_$n"
      helper create "$db" "$(base_url "$db")" "$name"
      created+=("$db $name")
      if [ "$db" = mysql ]; then url="$mysql_base/$name?ssl-mode=disabled"
      else url="$pg_base/$name?sslmode=disable"; fi
      target=$url ;;
  esac
  local port http
  port=$(free_port); http=$(free_port)
  # Snowflake off: this measures segment tags, and the worker-id lease would be one more writer.
  # max_tags bounds only the tags leafd itself creates; raised anyway so no limit is near N.
  # As many database connections as the direct client has: the same N on both sides.
  cat > "$dir/leafd.toml" <<TOML
[server]
bind = "127.0.0.1:$port"
shutdown_timeout_secs = 2
[http]
bind = "127.0.0.1:$http"
[storage]
url = "$url"
state_dir = "$dir"
max_connections = ${direct_clients:-$clients}
[segment]
max_tags = $((n + 10000))
[snowflake]
enabled = false
TOML
  # leafd makes the schema (every migration), the rows go in directly: N LEAF.TAG CREATEs would
  # take as long as the allocations this measures.
  "$leafd_bin" -c "$dir/leafd.toml" migrate > "$dir/migrate.log" 2>&1 \
    || { cat "$dir/migrate.log" >&2; problem "$db $n: leafd migrate failed"; return; }
  local t0; t0=$(now)
  helper fill "$db" "$target" "$n"
  echo "$db, $n tags: filled in $(since "$t0") s" >&2

  t0=$(now)
  (
    cd "$dir"
    for v in $(compgen -e | grep '^LEAFD_' || true); do unset "$v"; done
    export RUST_LOG=${RUST_LOG:-info} NO_COLOR=1
    exec "$leafd_bin" -c leafd.toml > leafd.log 2>&1
  ) &
  local pid=$!
  pids+=("$pid")
  local limit=$((600 + n / 1000)) ready=0
  while awk -v t="$(since "$t0")" -v l="$limit" 'BEGIN {exit !(t < l)}'; do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http/ready")" = 200 ] \
      && [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ]; then ready=1; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.02
  done
  local start_s; start_s=$(since "$t0")
  if [ "$ready" = 0 ]; then
    tail -n 20 "$dir/leafd.log" >&2
    problem "$db $n: leafd not ready after $start_s s"
    stop_pids "$pid"; [ -z "$name" ] || drop_database "$db" "$name"; return
  fi
  # RSS first: rendering /metrics allocates
  local rss metrics_bytes metrics_s loads0 ok0 errors0
  rss=$(awk '/^VmRSS/ {print $2 * 1024}' "/proc/$pid/status")
  # one scrape gives the size, the time and the counters before the load (a million tags'
  # /metrics takes long enough to render that each scrape counts)
  read -r metrics_bytes metrics_s < <(scrape "$http" "$dir/metrics.before")
  read -r loads0 ok0 errors0 < <(counters "$dir/metrics.before")
  # which build this is: the binary may be rebuilt between runs
  [ -n "$build" ] || build=$(grep -m 1 '^leafd_build_info' "$dir/metrics.before" | grep -o 'commit="[^"]*"' || true)
  rm -f "$dir/metrics.before"
  echo "$db, $n tags: ready in $start_s s, RSS $((rss / 1048576)) MiB, /metrics $metrics_bytes bytes in $metrics_s s" >&2

  # requests/s and errors from leafd's own counters: redis-benchmark stops at an error reply,
  # and the requests of a run it stopped are not in its figures
  local rps="" p50="" p99="" wall="" error_runs=0 allocs="" loads1 ok1 errors1 errors=0
  if run_helper "$dir/load.out" load "$port" "$n" "$clients" "$load_seconds"; then
    read -r _ p50 p99 _ wall error_runs < "$dir/load.out"
    if scrape "$http" "$dir/metrics.after" > /dev/null; then
      read -r loads1 ok1 errors1 < <(counters "$dir/metrics.after")
      rps=$(awk -v a="$((ok1 + errors1 - ok0 - errors0))" -v w="$wall" 'BEGIN {printf "%.0f", a / w}')
      allocs=$(awk -v a="$loads1" -v b="$loads0" -v w="$wall" 'BEGIN {r = (a - b) / w; printf (r < 100 ? "%.1f" : "%.0f"), r}')
      errors=$((errors1 - errors0))
      echo "$db, $n tags: $((ok1 + errors1 - ok0 - errors0)) requests in $wall s, $rps/s, p50 $p50 ms, p99 $p99 ms, $((loads1 - loads0)) allocations, $errors error replies" >&2
      [ "$errors" = 0 ] || problem "$db $n: $errors error replies to INCR during the load (redis-benchmark stopped at one $error_runs times; first: $(head -n 1 "$dir/load.out.err" | cut -c 1-300))"
    else
      problem "$db $n: /metrics did not answer after the load"
    fi
    rm -f "$dir/metrics.after"
    [ "$error_runs" = 0 ] || [ "$errors" != 0 ] || problem "$db $n: redis-benchmark stopped at an error reply $error_runs times ($(head -n 1 "$dir/load.out.err" | cut -c 1-300))"
  else
    problem "$db $n: the load did not finish: $(tail -n 1 "$dir/load.out.err" | cut -c 1-300)"
  fi
  local checked
  if checked=$(helper check "$port" "$n" 2000 200 4 2>"$dir/check.err"); then
    :
  else
    problem "$db $n: correctness pass failed ($checked replies/errors/repeats): $(head -n 3 "$dir/check.err" | tr '\n' ';')"
  fi
  kill -0 "$pid" 2>/dev/null || problem "$db $n: leafd exited (log: $(tail -n 2 "$dir/leafd.log" | tr '\n' ' '))"
  local unavailable; unavailable=$(grep -c UNAVAILABLE "$dir/leafd.log" || true)
  [ "$unavailable" = 0 ] || problem "$db $n: $unavailable UNAVAILABLE lines in leafd's log, e.g. $(grep -m 1 UNAVAILABLE "$dir/leafd.log" | cut -c 1-300)"
  local warnings; warnings=$(grep -c -E ' (WARN|ERROR) ' "$dir/leafd.log" || true)
  [ "$warnings" = 0 ] || echo "$db, $n tags: $warnings WARN/ERROR lines in leafd's log, e.g. $(grep -m 1 -E ' (WARN|ERROR) ' "$dir/leafd.log" | cut -c 1-300)" >&2
  stop_pids "$pid"

  # The database alone, leafd stopped: as many clients (DIRECT_CLIENTS) for the same time.
  local direct="" direct_total direct_errors
  if run_helper "$dir/direct.out" direct "$db" "$target" "$n" "$direct_clients" "$load_seconds"; then
    read -r direct direct_total direct_errors < "$dir/direct.out"
    echo "$db, $n tags: direct $direct allocations/s ($direct_total, $direct_errors failed)" >&2
  else
    problem "$db $n: the direct client failed: $(tail -n 1 "$dir/direct.out.err" | cut -c 1-300)"
  fi
  [ -z "$name" ] || drop_database "$db" "$name"
  [ -z "${LOGS:-}" ] || { mkdir -p "$LOGS"; cp "$dir/leafd.log" "$LOGS/leafd-$db-$n.log"; }
  rm -rf "$dir"
  rows+=("$db|$n|$start_s|$rss|$metrics_bytes|$(awk -v s="$metrics_s" 'BEGIN {if (s == "-") print "-"; else printf "%.1f", s * 1000}')|$rps|$p50|$p99|$allocs|$direct|$errors")
}

for db in $databases; do
  for n in "${tag_counts[@]}"; do
    cell "$db" "$n"
  done
done

# --- the table ------------------------------------------------------------------------------

echo
echo "bench/tags.sh$([ "$quick" = 1 ] && echo " --quick"): $clients clients, ${load_seconds} s of load per cell, then ${load_seconds} s of direct allocations from $direct_clients processes"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr); leafd $("$leafd_bin" --version | awk '{print $2}') ${build:-} (binary of $(date -r "$leafd_bin" '+%F %T'))"
for v in "${versions[@]}"; do echo "$v"; done
echo
header="db tags start_s rss_bytes rss_per_idle_tag metrics_bytes metrics_render_ms leafd_req_per_s p50_ms p99_ms leafd_allocs_per_s direct_allocs_per_s ratio error_replies"
tsv=$(echo "$header" | tr ' ' '\t')$'\n'
for row in "${rows[@]}"; do
  IFS='|' read -r db n start_s rss metrics_bytes metrics_ms rps p50 p99 allocs direct errors <<< "$row"
  # RSS per idle tag: against this database's 1-tag run, when there was one
  per_tag=-
  if [ "$n" != 1 ]; then
    for other in "${rows[@]}"; do
      IFS='|' read -r db1 n1 _ rss1 _ <<< "$other"
      [ "$db1" = "$db" ] && [ "$n1" = 1 ] && per_tag=$(awk -v a="$rss" -v b="$rss1" -v n="$n" 'BEGIN {printf "%.0f", (a - b) / n}')
    done
  fi
  ratio=$(awk -v a="$allocs" -v b="$direct" 'BEGIN {if (a == "" || b == "" || b == 0) print "-"; else printf "%.3f", a / b}')
  line="$db $n $start_s $rss $per_tag $metrics_bytes $metrics_ms ${rps:--} ${p50:--} ${p99:--} ${allocs:--} ${direct:--} $ratio $errors"
  tsv+=$(echo "$line" | tr ' ' '\t')$'\n'
done
if command -v column >/dev/null; then printf '%s' "$tsv" | column -t -s $'\t'; else printf '%s' "$tsv"; fi
[ -z "${OUT:-}" ] || printf '%s' "$tsv" > "$OUT"

if [ "${#problems[@]}" -gt 0 ]; then
  echo
  echo "FAILED checks:"
  for p in "${problems[@]}"; do echo "  $p"; done
  exit 1
fi
echo
echo "checks: no error reply, no repeated ID in the correctness pass, leafd running, no UNAVAILABLE in its log"
