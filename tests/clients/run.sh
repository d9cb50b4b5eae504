#!/usr/bin/env bash
# Runs leafd (the debug build) and checks it with the Redis clients people use: redis-cli
# (interactive, --pipe, -3), redis-py, ioredis and node-redis, go-redis and rueidis, Jedis,
# Lettuce, Redisson and Spring Data Redis (tests/clients/java), and redis-benchmark. Installs
# redis-py into a venv and the node clients into a temp dir. Loopback only; bounded.
#   tests/clients/run.sh [LEAFD_BIN]
set -uo pipefail
cd "$(dirname "$0")/../.."
leafd_bin=${1:-target/debug/leafd}
[ -x "$leafd_bin" ] || cargo build --quiet
work=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
# One tag hands out opaque IDs (redis-py checks them); everything else is the default.
cat > "$work/leafd.toml" <<'TOML'
[segment]
opaque_key = "client tests key, 16+ characters"
[[segment.opaque]]
tag = "py-opaque"
digits = 8
TOML
"$leafd_bin" --config "$work/leafd.toml" --bind "127.0.0.1:$port" --http-bind "127.0.0.1:$(free_port)" \
  --storage-url "sqlite://$work/leafd.db" > "$work/leafd.log" 2>&1 &
leafd_pid=$!
trap 'kill $leafd_pid 2>/dev/null; wait $leafd_pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done

passed=0
failed=0
check() {
  local name=$1; shift
  if output=$("$@" 2>&1); then
    passed=$((passed + 1)); echo "ok   $name${output:+: $(echo "$output" | tail -n 1)}"
  else
    failed=$((failed + 1)); echo "FAIL $name"; echo "$output" | tail -n 30 | sed 's/^/     /'
  fi
}

redis_cli_interactive() {
  # A real terminal (tmux gives redis-cli a pty): its start-up (COMMAND DOCS for hints) and
  # the commands typed must produce no error.
  command -v tmux >/dev/null || { echo "tmux not installed"; return 1; }
  local session="leafd-cli-$$" out
  tmux new-session -d -s "$session" -x 160 -y 40 "redis-cli -p $port"
  sleep 1
  for line in "LEAF.TAG CREATE cli 10" "INCR segment:cli" "SNOWFLAKE"; do
    tmux send-keys -t "$session" "$line" Enter
    sleep 0.3
  done
  out=$(tmux capture-pane -p -t "$session")
  tmux kill-session -t "$session" 2>/dev/null
  echo "$out" | grep -q '(integer) 1' || { echo "no (integer) 1 in: $out"; return 1; }
  if echo "$out" | grep -Eiq '\(error\)|unknown|ERR'; then echo "$out"; return 1; fi
  echo "interactive session clean"
}

redis_cli_pipe() {
  local out
  redis-cli -p "$port" LEAF.TAG CREATE pipe 1000 >/dev/null
  out=$(python3 -c '
import sys
cmd = b"*2\r\n$4\r\nINCR\r\n$12\r\nsegment:pipe\r\n"
sys.stdout.buffer.write(cmd * 10000)' | timeout 60 redis-cli -p "$port" --pipe)
  echo "$out" | grep -q "errors: 0, replies: 10000" || { echo "$out"; return 1; }
  echo "--pipe: errors 0, replies 10000"
}

redis_cli_resp3() {
  local id
  id=$(redis-cli -3 -p "$port" SNOWFLAKE)
  [[ "$id" =~ ^[0-9]+$ ]] || { echo "not an integer: $id"; return 1; }
  redis-cli -3 -p "$port" HELLO 3 | grep -q proto || return 1
  echo "RESP3 SNOWFLAKE $id"
}

redis_py() {
  python3 -m venv "$work/venv" >/dev/null && "$work/venv/bin/pip" install -q redis >/dev/null \
    && "$work/venv/bin/python" tests/clients/redis_py_client.py "$port"
}

node_clients() {
  (cd "$work" && npm init -y >/dev/null && npm install --silent --no-audit --no-fund ioredis@5 redis@5 >/dev/null) \
    && cp tests/clients/node_clients.mjs "$work/" && node "$work/node_clients.mjs" "$port"
}

# A second leafd with a password, for the Java and Go clients (AUTH in their handshakes).
auth_port=$(free_port)
"$leafd_bin" --bind "127.0.0.1:$auth_port" --http-bind "127.0.0.1:$(free_port)" \
  --storage-url "sqlite://$work/auth/leafd.db" --requirepass "s3cret-pw" > "$work/leafd-auth.log" 2>&1 &
auth_pid=$!
trap 'kill $leafd_pid $auth_pid 2>/dev/null; wait $leafd_pid $auth_pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do redis-cli -p "$auth_port" -a s3cret-pw --no-auth-warning PING >/dev/null 2>&1 && break; sleep 0.1; done

go_clients() {
  command -v go >/dev/null || { echo "go not installed"; return 1; }
  (cd tests/clients/go && LEAFD_ADDR="127.0.0.1:$auth_port" LEAFD_PASSWORD=s3cret-pw timeout 300 go run .)
}

java_clients() {
  command -v mvn >/dev/null || { echo "mvn not installed"; return 1; }
  local out
  out=$(cd tests/clients/java && LEAFD_HOST=127.0.0.1 LEAFD_PORT="$auth_port" LEAFD_PASSWORD=s3cret-pw \
    timeout 900 mvn -B -q test 2>&1) || { echo "$out" | grep -v "^\[INFO\]" | tail -n 60; return 1; }
  echo "$out" | grep "java clients:" | tail -n 1
}

redis_py_features() {
  # A second node with the ID features configured (see redis_py_features.py).
  local features_port features_http features_pid rc
  features_port=$(free_port)
  features_http=$(free_port)
  cat > "$work/features.toml" <<'TOML'
[segment]
auto_create = true
auto_create_pattern = "auto-*"
id_delta = 2
id_remainder = 1
opaque_key = "client tests key, 16+ characters"
[[segment.opaque]]
tag = "auto-opaque"
digits = 9
[snowflake]
timestamp_bits = 41
worker_id_bits = 4
sequence_bits = 8
time_unit_ms = 10
TOML
  mkdir -p "$work/features"
  "$leafd_bin" --config "$work/features.toml" --bind "127.0.0.1:$features_port" \
    --http-bind "127.0.0.1:$features_http" --storage-url "sqlite://$work/features/leafd.db" \
    > "$work/features.log" 2>&1 &
  features_pid=$!
  for _ in $(seq 1 100); do redis-cli -p "$features_port" PING >/dev/null 2>&1 && break; sleep 0.1; done
  "$work/venv/bin/python" tests/clients/redis_py_features.py "$features_port" "$features_http"
  rc=$?
  kill "$features_pid"; wait "$features_pid" 2>/dev/null
  [ "$rc" -eq 0 ] || tail -n 20 "$work/features.log"
  return "$rc"
}

redis_benchmark() {
  local out
  redis-cli -p "$port" LEAF.TAG CREATE bench 1000 >/dev/null
  for pipeline in 1 32; do
    out=$(redis-benchmark -p "$port" -c 20 -n 20000 -P "$pipeline" -q INCR segment:bench 2>&1) || return 1
    if echo "$out" | grep -qi error; then echo "$out"; return 1; fi
    out=$(redis-benchmark -p "$port" -c 20 -n 20000 -P "$pipeline" -q SNOWFLAKE 2>&1) || return 1
    if echo "$out" | grep -qi error; then echo "$out"; return 1; fi
  done
  echo "INCR segment:bench and SNOWFLAKE at -P 1 and -P 32 without error replies"
}

check "redis-cli interactive" redis_cli_interactive
check "redis-cli --pipe" redis_cli_pipe
check "redis-cli -3" redis_cli_resp3
check "redis-py" redis_py
check "redis-py: layouts, auto-create, delta, opaque" redis_py_features
check "ioredis + node-redis" node_clients
check "go-redis + rueidis" go_clients
check "Jedis + Lettuce + Redisson + Spring Data Redis" java_clients
check "redis-benchmark" redis_benchmark
echo "clients: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
