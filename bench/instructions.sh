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
  http_port=$(free_port)
  # A fresh database and state directory per binary (marks of the last run would refuse it).
  rm -rf "$work"/leafd.db* "$work"/state "$work"/callgrind.out.*
  printf '[server]\nbind = "127.0.0.1:%s"\n[http]\nbind = "127.0.0.1:%s"\n[storage]\nurl = "sqlite://%s/leafd.db"\nstate_dir = "%s/state"\n' \
    "$port" "$http_port" "$work" "$work" > "$work/leafd.toml"
  valgrind --tool=callgrind --collect-atstart=yes --callgrind-out-file="$work/callgrind.out.%p" \
    "$bin" --config "$work/leafd.toml" >"$work/leafd.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    redis-cli -p "$port" PING >/dev/null 2>&1 && break
    sleep 0.1
  done
  redis-cli -p "$port" LEAF.TAG CREATE bench 100000 >/dev/null
  for cmd in "INCR segment:bench" SNOWFLAKE; do
    for depth in 1 32; do
      # shellcheck disable=SC2086
      redis-benchmark -p "$port" -c 50 -P "$depth" -n 20000 $cmd >/dev/null
      callgrind_control -z "$pid" >/dev/null 2>&1
      # shellcheck disable=SC2086
      redis-benchmark -p "$port" -c 50 -P "$depth" -n "$requests" $cmd >/dev/null
      rm -f "$work"/callgrind.out.*.[0-9]*
      callgrind_control -d "$pid" >/dev/null 2>&1
      total=$(cat "$work"/callgrind.out.* | awk '/^summary:/ {s += $2} END {print s + 0}')
      rm -f "$work"/callgrind.out.*
      printf '%-28s %-20s %4s %12d\n' "$(basename "$bin")" "$cmd" "$depth" $((total / requests))
    done
  done
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
done
