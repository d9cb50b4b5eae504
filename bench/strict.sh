#!/usr/bin/env bash
# IDs/s and latency of a strictly increasing tag (order = "strict": every request served from a
# database allocation made after it arrived, the requests waiting on a node batched into one)
# against a trend-increasing tag on the same database: MariaDB/MySQL and PostgreSQL, 1 and 3
# leafd nodes, pipeline depth 1 and 32, with redis-benchmark (`INCR segment:<tag>`, CLIENTS
# clients per node; with 3 nodes one redis-benchmark per node at once, summed), and the local
# redis-server answering `INCR` under the same load as the peer (a private one, no persistence;
# "3 nodes": three redis-benchmarks against it). Each cell: a warm-up that also sizes the run,
# then SECONDS of load. IDs/s is all requests over the wall time of the run; p50/p99 are the
# request latency (a pipelined request's is its batch's) merged over the redis-benchmarks
# (from their printed distributions: an upper bound, never above the largest of their own).
# "DB allocs/s" counts the tag's database allocations during the run (leafd_segment_loads_total
# of all nodes), "IDs/alloc" is a strict tag's IDs per allocation (its batch size). Checks that
# the strict tag handed out exactly one consecutive ID per request. "CPU %": the machine's CPU
# use during the run (all cores, everything on it; 100 = every core busy). Prints a Markdown table and
# the issue-34 goals. Loopback only; stops by itself (and on failure) with every process it
# started and every database it created.
#   bench/strict.sh [SECONDS=6] [CLIENTS=16]
# Env: LEAFD_BIN (default target/release/leafd, built if missing), DATABASES (default
# "mysql postgres"), NODES (default "1 3": the cluster sizes measured). Needs redis-benchmark,
# redis-server, mysql and psql clients, and the servers root@127.0.0.1:3306 and
# postgres@127.0.0.1:5432 (scripts/services.sh starts them); it creates and drops its own
# databases.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-6}
clients=${2:-16}
leafd_bin=${LEAFD_BIN:-target/release/leafd}
databases=${DATABASES:-mysql postgres}
cluster_sizes=${NODES:-1 3}
for tool in redis-benchmark redis-server redis-cli python3; do
  command -v "$tool" >/dev/null || { echo "$tool not found (Debian: redis-tools, redis-server)" >&2; exit 1; }
done
[ -x "$leafd_bin" ] || cargo build --release --quiet
leafd_bin=$(realpath "$leafd_bin")
source bench/common.sh

mysql_sql() { mysql -uroot -h127.0.0.1 -P3306 -N -B -e "$1"; }
pg_sql() { psql -h 127.0.0.1 -p 5432 -U postgres -d postgres -X -q -A -t -v ON_ERROR_STOP=1 -c "$1"; }
sql() { if [ "$1" = mysql ]; then mysql_sql "$2"; else pg_sql "$2"; fi; }
for db in $databases; do
  sql "$db" "SELECT 1" >/dev/null 2>&1 || { echo "no $db server on 127.0.0.1 (scripts/services.sh starts one)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/leafd-strict-bench.XXXXXX)
pids=()     # every process this script started and has not stopped yet
created=()  # "dialect name" of every database this script created and has not dropped yet
stop_pids() { # PID... : SIGTERM, SIGKILL to those left after 5 s
  local pid
  for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 50); do
    local alive=0
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
  if [ "$1" = mysql ]; then mysql_sql "DROP DATABASE IF EXISTS $2" || true
  else pg_sql "DROP DATABASE IF EXISTS $2 WITH (FORCE)" || true; fi
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

# --- the servers ---------------------------------------------------------------------------

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no > "$work/redis.log" 2>&1 &
pids+=($!)
wait_for_ping "$redis_port"
redis-cli -p "$redis_port" PING >/dev/null || { echo "redis-server did not start:" >&2; cat "$work/redis.log" >&2; exit 1; }

node_ports=() node_http=() node_pids=()
# Starts COUNT nodes on database URL with one trend and one strict tag; LABEL names their dirs.
start_nodes() { # LABEL URL COUNT
  node_ports=() node_http=() node_pids=()
  local i dir port http
  for i in $(seq 0 $(($3 - 1))); do
    dir="$work/$1-n$i"; mkdir -p "$dir"
    port=$(free_port); http=$(free_port)
    cat > "$dir/leafd.toml" <<TOML
[server]
shutdown_timeout_secs = 2
[storage]
state_dir = "$dir"
[segment]
adaptive_step = true
[[segment.tags]]
tag = "trend"
step = 1000
[[segment.tags]]
tag = "strict"
step = 1000
order = "strict"
[snowflake]
coordinator = "static"
worker_id = $i
TOML
    (
      cd "$dir"
      for v in $(compgen -e | grep '^LEAFD_' || true); do unset "$v"; done
      export RUST_LOG=${RUST_LOG:-info} NO_COLOR=1
      exec "$leafd_bin" -c leafd.toml --bind "127.0.0.1:$port" --http-bind "127.0.0.1:$http" \
        --storage-url "$2" > leafd.log 2>&1
    ) &
    pids+=($!); node_pids+=($!); node_ports+=("$port"); node_http+=("$http")
  done
  for i in "${!node_ports[@]}"; do
    PING_TRIES=300 wait_for_ping "${node_ports[$i]}"
    if ! redis-cli -p "${node_ports[$i]}" PING >/dev/null 2>&1; then
      echo "leafd node $i ($1) did not start:" >&2; tail -n 20 "$work/$1-n$i/leafd.log" >&2; exit 1
    fi
  done
}

# The tag's successful database allocations so far, summed over the nodes.
allocations() { # TAG
  local http total=0 n
  for http in "${node_http[@]}"; do
    n=$(curl -s "http://127.0.0.1:$http/metrics" | awk -v t="$1" \
      'index($0, "leafd_segment_loads_total{") == 1 && index($0, "tag=\"" t "\"") && index($0, "result=\"ok\"") {print $2}')
    total=$((total + ${n:-0}))
  done
  echo "$total"
}

# --- one cell ------------------------------------------------------------------------------

# Merges redis-benchmark outputs: "IDs/s p50 p99 requests errors" for WALL seconds of them all.
summarize() { # WALL FILE...
  python3 - "$@" <<'PY'
import re, sys
wall, files = float(sys.argv[1]), sys.argv[2:]
total, errors, dists, p50s, p99s = 0, 0, [], [], []
for path in files:
    text = open(path, errors="replace").read()
    done = re.search(r"(\d+) requests completed in ([\d.]+) seconds", text)
    summary = re.search(r"avg\s+min\s+p50\s+p95\s+p99\s+max\s*\n\s*" + r"\s+".join([r"([\d.]+)"] * 6), text)
    if not done or not summary:
        sys.exit(f"no result in {path}: {text[-300:]!r}")
    total += int(done.group(1))
    errors += len(re.findall(r"error", text, re.I))
    p50s.append(float(summary.group(3))); p99s.append(float(summary.group(5)))
    dists.append(sorted((float(l), int(c)) for l, c in
                        re.findall(r"[\d.]+% <= ([\d.]+) milliseconds \(cumulative count (\d+)\)", text)))
def merged(p, own):
    if len(dists) == 1:
        return own[0]
    def below(dist, lat):
        return max([c for l, c in dist if l <= lat], default=0)
    for lat in sorted({l for d in dists for l, _ in d}):
        if sum(below(d, lat) for d in dists) >= p * total:
            return max(min(own), min(lat, max(own)))
    return max(own)
print(f"{total / wall:.0f} {merged(0.5, p50s):.3f} {merged(0.99, p99s):.3f} {total} {errors}")
PY
}

now() { date +%s.%N; }
sent=0  # requests sent to the tag being measured in this cell (warm-ups included)
# Runs N requests per port at once (N: a list, one per port); sets $wall and leaves the
# outputs in $work/out.<i>. A run that outlasts LIMIT seconds is stopped and fails the script.
run_all() { # LIMIT PIPELINE COMMAND "N..." PORT...
  local limit=$1 pipeline=$2 command=$3 counts=($4); shift 4
  local i=0 port start bench=()
  start=$(now)
  for port in "$@"; do
    # shellcheck disable=SC2086
    timeout -k 2 "$limit" redis-benchmark -h 127.0.0.1 -p "$port" -c "$clients" -n "${counts[$i]}" \
      -P "$pipeline" $command > "$work/out.$i" 2>&1 &
    bench+=($!); pids+=($!)
    sent=$((sent + counts[i])); i=$((i + 1))
  done
  local failed=0 pid
  for pid in "${bench[@]}"; do wait "$pid" || failed=1; done
  wall=$(awk -v a="$start" -v b="$(now)" 'BEGIN {print b - a}')
  local keep=() p
  for p in "${pids[@]}"; do [[ " ${bench[*]} " == *" $p "* ]] || keep+=("$p"); done
  pids=("${keep[@]}")
  [ "$failed" = 0 ] || { echo "redis-benchmark failed or ran over ${limit}s ($command -P $pipeline):" >&2; tail -c 600 "$work/out.0" >&2; exit 1; }
}

rows=()
# One table row: warm up (growing until a run lasts 0.5 s, which also sizes the measured run
# to SECONDS per port), then the measured run. Appends "DATABASE|ORDER|NODES|PIPELINE|...".
cell() { # DATABASE ORDER TAG PIPELINE COMMAND PORT...
  local database=$1 order=$2 tag=$3 pipeline=$4 command=$5; shift 5
  local nodes=$# n=$((clients * pipeline * 20)) counts i before after
  while :; do
    counts=$(printf "$n %.0s" "$@")
    run_all 120 "$pipeline" "$command" "$counts" "$@"
    if awk -v w="$wall" 'BEGIN {exit !(w >= 0.5)}'; then break; fi
    n=$(awk -v n="$n" -v w="$wall" -v p="$pipeline" 'BEGIN {f = 1 / w; if (f < 2) f = 2; if (f > 100) f = 100; printf "%d", int(n * f / p) * p}')
  done
  counts=""
  for i in $(seq 0 $((nodes - 1))); do
    # requests/s of this port's warm-up, from redis-benchmark's own elapsed time
    # (a multiple of the depth: redis-benchmark issues whole pipelines, so it sends exactly N)
    counts+="$(awk -v s="$seconds" -v n="$n" -v p="$pipeline" \
      '/requests completed in/ {x = int(n / $5 * s / p + 1) * p; printf "%d ", x}' "$work/out.$i") "
  done
  [ -z "$tag" ] || before=$(allocations "$tag")
  local cpu_before; cpu_before=$(head -n 1 /proc/stat)
  run_all $((seconds * 4 + 20)) "$pipeline" "$command" "$counts" "$@"
  # the machine's CPU use during the run (all cores; 100 = every core busy)
  local busy; busy=$(printf '%s\n%s\n' "$cpu_before" "$(head -n 1 /proc/stat)" | awk \
    '{t = 0; for (i = 2; i <= NF; i++) t += $i; idle = $5 + $6} NR == 1 {t0 = t; i0 = idle} NR == 2 {printf "%.0f", 100 * (1 - (idle - i0) / (t - t0))}')
  local files=()
  for i in $(seq 0 $((nodes - 1))); do files+=("$work/out.$i"); done
  local rate p50 p99 total errors
  read -r rate p50 p99 total errors < <(summarize "$wall" "${files[@]}")
  [ "$errors" = 0 ] || { echo "error replies in $database $order -P $pipeline:" >&2; grep -i error "${files[0]}" | head -n 3 >&2; exit 1; }
  local allocs="" per=""
  if [ -n "$tag" ]; then
    after=$(allocations "$tag")
    allocs=$(awk -v a="$after" -v b="$before" -v w="$wall" 'BEGIN {r = (a - b) / w; printf (r < 10 ? "%.1f" : "%.0f"), r}')
    # a trend tag's segments are loaded ahead and not used up in the run: no meaningful ratio
    [ "$order" != strict ] || per=$(awk -v a="$after" -v b="$before" -v t="$total" 'BEGIN {printf "%.1f", (a > b ? t / (a - b) : 0)}')
  fi
  rows+=("$database|$order|$nodes|$pipeline|$rate|$p50|$p99|$allocs|$per|$busy")
  printf '  %-22s %-6s %s node(s) -P %-2s %10s IDs/s  p50 %s ms  p99 %s ms  (%s requests in %.1f s)\n' \
    "$database" "$order" "$nodes" "$pipeline" "$rate" "$p50" "$p99" "$total" "$wall" >&2
}

# --- the runs ------------------------------------------------------------------------------

versions=()
for db in $databases; do
  if [ "$db" = mysql ]; then
    name="$(mysql_sql "SELECT VERSION()" | sed -E 's/^([0-9.]+)-MariaDB.*/MariaDB \1/; s/^([0-9.]+)$/MySQL \1/')"
    versions+=("$name: innodb_flush_log_at_trx_commit=$(mysql_sql "SELECT @@innodb_flush_log_at_trx_commit"), sync_binlog=$(mysql_sql "SELECT @@sync_binlog"), log_bin=$(mysql_sql "SELECT @@log_bin")")
  else
    name="PostgreSQL $(pg_sql "SHOW server_version" | awk '{print $1}')"
    versions+=("$name: synchronous_commit=$(pg_sql "SHOW synchronous_commit"), fsync=$(pg_sql "SHOW fsync"), commit_delay=$(pg_sql "SHOW commit_delay")")
  fi
  eval "label_$db=\"\$name\""
done

redis_key=strict-bench
checks=() mismatch=0
for nodes in $cluster_sizes; do
  for db in $databases; do
    label_var="label_$db"; label=${!label_var}
    dbname="leafd_strict_bench_$$_${db}_$nodes"
    sql "$db" "CREATE DATABASE $dbname" >/dev/null
    created+=("$db $dbname")
    if [ "$db" = mysql ]; then url="mysql://root@127.0.0.1:3306/$dbname?ssl-mode=disabled"
    else url="postgres://postgres@127.0.0.1:5432/$dbname?sslmode=disable"; fi
    start_nodes "$db-$nodes" "$url" "$nodes"
    sent=0
    for pipeline in 1 32; do
      cell "$label" trend trend "$pipeline" "INCR segment:trend" "${node_ports[@]}"
    done
    trend_last=$(redis-cli -p "${node_ports[0]}" INCR segment:trend)
    [[ "$trend_last" =~ ^[0-9]+$ ]] || { echo "trend tag answered $trend_last" >&2; exit 1; }
    sent=0
    for pipeline in 1 32; do
      cell "$label" strict strict "$pipeline" "INCR segment:strict" "${node_ports[@]}"
    done
    # Strict IDs are consecutive: the next one is the count handed out plus one.
    strict_last=$(redis-cli -p "${node_ports[0]}" INCR segment:strict)
    if [ "$strict_last" = $((sent + 1)) ]; then
      checks+=("$label, $nodes node(s): $sent strict IDs for $sent requests, consecutive")
    else
      checks+=("$label, $nodes node(s): MISMATCH: next strict ID $strict_last after $sent requests")
      mismatch=1
    fi
    stop_pids "${node_pids[@]}"
    drop_database "$db" "$dbname"
  done
  ports=()
  for _ in $(seq 1 "$nodes"); do ports+=("$redis_port"); done
  redis-cli -p "$redis_port" DEL "$redis_key" >/dev/null
  for pipeline in 1 32; do
    cell "redis-server $(redis-server --version | awk '{print $3}' | tr -d 'v=')" INCR "" "$pipeline" "INCR $redis_key" "${ports[@]}"
  done
done

echo
echo "bench/strict.sh $seconds $clients: $clients clients per node, ${seconds} s per cell after a warm-up"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr); leafd $("$leafd_bin" --version | awk '{print $2, $3}')"
for v in "${versions[@]}"; do echo "$v"; done
echo
echo "| database | order | nodes | pipeline | IDs/s | p50 ms | p99 ms | DB allocs/s | IDs/alloc | CPU % |"
echo "|---|---|---|---|---|---|---|---|---|---|"
commas() { echo "$1" | sed -E ':a; s/([0-9])([0-9]{3})($|,)/\1,\2\3/; ta'; }
order_rank() { case $1 in trend) echo 0;; strict) echo 1;; *) echo 2;; esac; }
for row in "${rows[@]}"; do
  IFS='|' read -r database order nodes pipeline _ <<< "$row"
  printf '%s\t%s\t%s\t%s\t%s\n' "$([ "$order" = INCR ] && echo 1 || echo 0)$database" "$nodes" "$pipeline" "$(order_rank "$order")" "$row"
done | sort -t$'\t' -k1,1 -k2,2n -k3,3n -k4,4n | cut -f5 | while IFS='|' read -r database order nodes pipeline rate p50 p99 allocs per busy; do
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$database" "$order" "$nodes" "$pipeline" \
    "$(commas "$rate")" "$p50" "$p99" "$(commas "$allocs")" "$per" "$busy"
done
echo
for db in $databases; do
  label_var="label_$db"; label=${!label_var}
  for row in "${rows[@]}"; do
    IFS='|' read -r database order nodes pipeline rate p50 p99 _ <<< "$row"
    [ "$database" = "$label" ] && [ "$order" = strict ] || continue
    if [ "$nodes" = 3 ] && [ "$pipeline" = 32 ]; then
      echo "goal, $label: strict, 3 nodes, -P 32 >= 100,000 IDs/s: $(commas "$rate") ($(awk -v r="$rate" 'BEGIN {print (r >= 100000 ? "met" : "not met")}'))"
    elif [ "$pipeline" = 1 ]; then
      echo "goal, $label: strict, $nodes node(s), -P 1 p99 < 5 ms: $p99 ms ($(awk -v p="$p99" 'BEGIN {print (p < 5 ? "met" : "not met")}'))"
    fi
  done
done
for c in "${checks[@]}"; do echo "$c"; done
[ "$mismatch" = 0 ] || { echo "strict IDs and requests differ: see above" >&2; exit 1; }
