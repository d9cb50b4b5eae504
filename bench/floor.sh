#!/usr/bin/env bash
# How little CPU a request can cost on this machine at all: redis-server, leafd and two servers
# that do nothing but answer (bench/floor/*.c: epoll like redis-server's loop, and io_uring),
# under the same redis-benchmark, alternating, ROUNDS rounds; prints each one's own CPU time per
# request (its threads' run time from /proc/<pid>/task/*/schedstat, best round) and its ratio to
# redis-server's. What no server can go below is the kernel's cost of one receive and one send
# on loopback. Needs gcc (and liburing-dev for the io_uring one). Loopback only; stops by itself.
#   bench/floor.sh [REQUESTS=300000] [ROUNDS=3] [CLIENTS=50]
# Env: LEAFD_BIN (default target/release/leafd, built if missing), REDIS_PORT (default 6379).
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-300000}
rounds=${2:-3}
clients=${3:-50}
redis_port=${REDIS_PORT:-6379}
leafd_bin=${LEAFD_BIN:-target/release/leafd}
command -v redis-benchmark >/dev/null || { echo "redis-benchmark not found (Debian: redis-tools)" >&2; exit 1; }
command -v gcc >/dev/null || { echo "gcc not found" >&2; exit 1; }
[ -x "$leafd_bin" ] || cargo build --release --quiet
source bench/common.sh
work=$(mktemp -d)
pids=()
# The servers die of the signal (status 143): that is not this script failing.
trap 'kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT

redis_pid=$(redis-cli -p "$redis_port" INFO server | tr -d '\r' | awk -F: '/^process_id/ {print $2}')
[ -r "/proc/$redis_pid/schedstat" ] || { echo "no redis-server of ours on 127.0.0.1:$redis_port" >&2; exit 1; }
names=(redis-server leafd) ports=("$redis_port") procs=("$redis_pid") commands=("INCR bench" "INCR segment:bench")

leafd_port=$(free_port)
"$leafd_bin" --bind "127.0.0.1:$leafd_port" --http-bind "127.0.0.1:$(free_port)" \
  --storage-url "sqlite://$work/leafd.db" > "$work/leafd.log" 2>&1 &
pids+=($!); ports+=("$leafd_port"); procs+=($!)
wait_for_ping "$leafd_port"
redis-cli -p "$leafd_port" LEAF.TAG CREATE bench 100000 >/dev/null

start_floor() { # NAME SOURCE [LIBS]
  gcc -O2 -o "$work/$1" "bench/floor/$2" "${@:3}" 2>"$work/$1.gcc" || { echo "($1 not built: $(head -n 1 "$work/$1.gcc"))" >&2; return 0; }
  local port; port=$(free_port)
  "$work/$1" "$port" & pids+=($!)
  wait_for_ping "$port"
  names+=("$1"); ports+=("$port"); procs+=($!); commands+=("INCR bench")
}
start_floor epoll-floor epoll_floor.c
[ -r /usr/include/liburing.h ] && start_floor io_uring-floor uring_floor.c -luring

cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}'; }
for round in $(seq 1 "$rounds"); do
  for pipeline in 1 32; do
    n=$requests; [ "$pipeline" = 1 ] || n=$((requests * 10))
    for i in "${!names[@]}"; do
      before=$(cpu_ns "${procs[$i]}")
      # shellcheck disable=SC2086
      rps=$(redis-benchmark -h 127.0.0.1 -p "${ports[$i]}" -c "$clients" -n "$n" -P "$pipeline" --csv ${commands[$i]} 2>/dev/null \
        | tail -n 1 | tr -d '"' | cut -d, -f2)
      after=$(cpu_ns "${procs[$i]}")
      echo "$(( (after - before) / n )) $rps" >> "$work/${names[$i]}-$pipeline"
    done
  done
done

echo
echo "CPU per request: best of $rounds rounds, $clients clients ($requests requests at -P 1, $((requests * 10)) at -P 32)"
echo "machine: $(nproc) cores, $(uname -sr)"
printf '%-16s | %10s %12s %6s | %10s %12s %6s\n' server "-P1 cpu ns" "rps" ratio "-P32 cpu ns" "rps" ratio
best() { sort -n -k1,1 "$work/$1-$2" | head -n 1; }
read -r redis1 _ < <(best redis-server 1); read -r redis32 _ < <(best redis-server 32)
for name in "${names[@]}"; do
  read -r c1 r1 < <(best "$name" 1); read -r c32 r32 < <(best "$name" 32)
  printf '%-16s | %10s %12s %6s | %10s %12s %6s\n' "$name" "$c1" "$r1" "$(awk -v a="$c1" -v b="$redis1" 'BEGIN {printf "%.2f", a/b}')" \
    "$c32" "$r32" "$(awk -v a="$c32" -v b="$redis32" 'BEGIN {printf "%.2f", a/b}')"
done
