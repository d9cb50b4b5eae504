#!/usr/bin/env bash
# Instructions per request of one or more leafd builds under callgrind: repeatable where time is
# not, so two builds can be compared on a busy machine. For each binary, for INCR segment:bench
# and SNOWFLAKE at pipeline depth 1 and 32: warm up, zero the counters (callgrind_control -z),
# run redis-benchmark, dump (-d) and divide the instructions of all the server's threads by the
# requests. Loopback only; stops by itself.
#   bench/instructions.sh [REQUESTS=100000] LEAFD_BIN...
# Needs valgrind (Debian: valgrind) and redis-benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
requests=100000
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then requests=$1; shift; fi
[ $# -ge 1 ] || { echo "usage: bench/instructions.sh [REQUESTS] LEAFD_BIN..." >&2; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind not found (Debian: valgrind)" >&2; exit 1; }
command -v redis-benchmark >/dev/null || { echo "redis-benchmark not found (Debian: redis-tools)" >&2; exit 1; }

source bench/common.sh
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT

printf '%-28s %-20s %4s %12s\n' binary command -P instructions
for bin in "$@"; do
  port=$(free_port)
  # A fresh directory per binary: the database and, beside it, the state directory (the marks
  # of the last run would refuse a new database).
  run_dir=$(mktemp -d -p "$work")
  valgrind --tool=callgrind --collect-atstart=yes --callgrind-out-file="$run_dir/callgrind.out.%p" \
    "$bin" --bind "127.0.0.1:$port" --http-bind "127.0.0.1:$(free_port)" \
    --storage-url "sqlite://$run_dir/leafd.db" >"$run_dir/leafd.log" 2>&1 &
  pid=$!
  # Under valgrind the start takes seconds.
  PING_TRIES=600 wait_for_ping "$port"
  redis-cli -p "$port" LEAF.TAG CREATE bench 100000 >/dev/null
  for cmd in "INCR segment:bench" SNOWFLAKE; do
    for depth in 1 32; do
      # shellcheck disable=SC2086
      redis-benchmark -p "$port" -c 50 -P "$depth" -n 20000 $cmd >/dev/null
      callgrind_control -z "$pid" >/dev/null 2>&1
      # shellcheck disable=SC2086
      redis-benchmark -p "$port" -c 50 -P "$depth" -n "$requests" $cmd >/dev/null
      rm -f "$run_dir"/callgrind.out.*.[0-9]*
      callgrind_control -d "$pid" >/dev/null 2>&1
      total=$(cat "$run_dir"/callgrind.out.* | awk '/^summary:/ {s += $2} END {print s + 0}')
      rm -f "$run_dir"/callgrind.out.*
      printf '%-28s %-20s %4s %12d\n' "$(basename "$bin")" "$cmd" "$depth" $((total / requests))
    done
  done
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
done
