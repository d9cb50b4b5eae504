#!/usr/bin/env bash
# Side-by-side throughput of leafd and the local redis-server at serving IDs, with
# redis-benchmark: leafd `INCR segment:bench` and `SNOWFLAKE` against Redis `INCR bench`, at
# pipeline depth 1 and 32, alternating targets, ROUNDS rounds; prints the median of each row and
# the ratio leafd/redis, and each server's own CPU time per request (its threads' run time from
# /proc/<pid>/task/*/schedstat around each run, best round) with the ratio. Loopback only; stops by itself.
#   bench/compare.sh [REQUESTS=1000000] [ROUNDS=3] [CLIENTS=50]
# Env: LEAFD_BIN (default target/release/leafd, built if missing), REDIS_PORT (default 6379).
# TLS=1: both over TLS instead (a throw-away certificate from openssl; leafd's tls.bind against
# a private redis-server started with --tls-port, since the machine's Redis has no TLS port).
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-1000000}
rounds=${2:-3}
clients=${3:-50}
redis_port=${REDIS_PORT:-6379}
leafd_bin=${LEAFD_BIN:-target/release/leafd}

command -v redis-benchmark >/dev/null || { echo "redis-benchmark not found (Debian: redis-tools)" >&2; exit 1; }
[ -x "$leafd_bin" ] || cargo build --release --quiet

source bench/common.sh
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null; rm -rf "$work"' EXIT
leafd_port=$(free_port)
http_port=$(free_port)
cat > "$work/leafd.toml" <<TOML
[server]
bind = "127.0.0.1:$leafd_port"
[http]
bind = "127.0.0.1:$http_port"
[storage]
url = "sqlite://$work/leafd.db"
TOML
tls=()
leafd_bench_port=$leafd_port
if [ "${TLS:-0}" = 1 ]; then
  self_signed_cert "$work"
  tls=(--tls --cacert "$work/cert.pem")
  leafd_bench_port=$(free_port)
  tls_section "$leafd_bench_port" "$work" >> "$work/leafd.toml"
  redis_port=$(free_port)
  redis-server --port 0 --tls-port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --tls-cert-file "$work/cert.pem" --tls-key-file "$work/key.pem" --tls-auth-clients no \
    > "$work/redis.log" 2>&1 &
  pids+=($!)
  wait_for_ping "$redis_port" "${tls[@]}"
fi
if ! redis-cli "${tls[@]}" -p "$redis_port" PING >/dev/null 2>&1; then
  echo "no redis-server on 127.0.0.1:$redis_port" >&2; exit 1
fi
"$leafd_bin" --config "$work/leafd.toml" > "$work/leafd.log" 2>&1 &
pids+=($!)
wait_for_ping "$leafd_port"
redis-cli -p "$leafd_port" LEAF.TAG CREATE bench 100000 >/dev/null
redis-cli "${tls[@]}" -p "$redis_port" DEL bench >/dev/null

# CPU time a process has used so far, in ns: the sum over its threads of /proc/.../schedstat
# (nanosecond resolution; /proc/<pid>/stat counts 10 ms ticks, too coarse for short runs).
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}'; }
leafd_pid=${pids[-1]}
redis_pid=$(redis-cli "${tls[@]}" -p "$redis_port" INFO server | tr -d '\r' | awk -F: '/^process_id/ {print $2}')
[ -r "/proc/$redis_pid/schedstat" ] || { echo "cannot read the CPU time of redis-server (pid $redis_pid)" >&2; exit 1; }

# Runs one redis-benchmark against the server PID listening on PORT; appends
# "rps p50 p99 cpu_ns_per_request" to $3 and fails on any error reply.
run() {
  local port=$1 pid=$2 out=$3 pipeline=$4; shift 4
  local csv before after
  before=$(cpu_ns "$pid")
  csv=$(redis-benchmark "${tls[@]}" -h 127.0.0.1 -p "$port" -c "$clients" -n "$requests" -P "$pipeline" --csv "$@" 2>"$work/stderr")
  if grep -qi "error" "$work/stderr" <(echo "$csv"); then
    echo "error replies from port $port running $*:" >&2; cat "$work/stderr" >&2; exit 1
  fi
  after=$(cpu_ns "$pid")
  # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
  echo "$csv" | tail -n 1 | tr -d '"' | awk -F, -v t=$((after - before)) -v n="$requests" \
    '{printf "%s %s %s %.0f\n", $2, $5, $7, t / n}' >> "$out"
}

median() { sort -n -k1,1 "$1" | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}'; }

rows=("INCR segment:bench|1" "INCR segment:bench|32" "SNOWFLAKE|1" "SNOWFLAKE|32")
for round in $(seq 1 "$rounds"); do
  for row in "${rows[@]}"; do
    cmd=${row%|*}; pipeline=${row#*|}
    key=$(echo "$cmd-$pipeline" | tr ' :' '__')
    # shellcheck disable=SC2086
    run "$leafd_bench_port" "$leafd_pid" "$work/leafd-$key" "$pipeline" $cmd
    run "$redis_port" "$redis_pid" "$work/redis-$key" "$pipeline" INCR bench
  done
done

# Every reply was an integer: the IDs still increase after the run.
last=$(redis-cli "${tls[@]}" -p "$leafd_bench_port" INCR segment:bench)
[[ "$last" =~ ^[0-9]+$ ]] || { echo "leafd did not answer with an integer: $last" >&2; exit 1; }

echo
echo "leafd vs redis-server $(redis-server --version | awk '{print $3}' | tr -d 'v=')${tls:+ over TLS}, $requests requests, $clients clients, median of $rounds rounds"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr)"
echo "cpu ns: the server's own CPU time per request (all its threads), best round; ratios leafd/redis"
printf '%-20s %3s | %12s %8s %8s %7s | %12s %8s %8s %7s | %6s %6s\n' "leafd command" "-P" "leafd rps" "p50 ms" "p99 ms" "cpu ns" "redis rps" "p50 ms" "p99 ms" "cpu ns" "rps" "cpu"
best_cpu() { sort -n -k4,4 "$1" | head -n 1 | awk '{print $4}'; }
for row in "${rows[@]}"; do
  cmd=${row%|*}; pipeline=${row#*|}
  key=$(echo "$cmd-$pipeline" | tr ' :' '__')
  read -r l_rps l_p50 l_p99 _ < <(median "$work/leafd-$key")
  read -r r_rps r_p50 r_p99 _ < <(median "$work/redis-$key")
  l_cpu=$(best_cpu "$work/leafd-$key"); r_cpu=$(best_cpu "$work/redis-$key")
  ratio=$(awk -v a="$l_rps" -v b="$r_rps" 'BEGIN {printf "%.2f", a/b}')
  cpu_ratio=$(awk -v a="$l_cpu" -v b="$r_cpu" 'BEGIN {printf "%.2f", (b > 0 ? a/b : 0)}')
  printf '%-20s %3s | %12s %8s %8s %7s | %12s %8s %8s %7s | %6s %6s\n' "$cmd" "$pipeline" "$l_rps" "$l_p50" "$l_p99" "$l_cpu" "$r_rps" "$r_p50" "$r_p99" "$r_cpu" "$ratio" "$cpu_ratio"
done
