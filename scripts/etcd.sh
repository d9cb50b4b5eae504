#!/usr/bin/env bash
# Starts a single-member etcd for tests on 127.0.0.1 with its own data dir, installing Debian's
# `etcd-server` package if needed. Prints the client URL; stops it on `stop DIR`.
#   scripts/etcd.sh start DIR [PORT]  -> prints http://127.0.0.1:PORT, runs until `stop`
#   scripts/etcd.sh stop DIR           (SIGTERM, waits for the process to exit)
# Starting again on the same DIR and PORT is a restart: the data (keys, leases) is kept.
set -euo pipefail
cmd=${1:?start|stop}
dir=${2:?directory}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

case "$cmd" in
start)
  if ! command -v etcd >/dev/null; then
    echo "installing etcd-server (Debian package)" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >&2
  fi
  # etcdctl (snapshot save/restore in tests/reliability/store_wipe.py) is a package of its own.
  if ! command -v etcdctl >/dev/null; then
    echo "installing etcd-client (Debian package)" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-client >&2
  fi
  mkdir -p "$dir/data"
  port=${3:-}
  for candidate in $([ -n "$port" ] || seq 23790 2 23830); do
    if ! port_open "$candidate" && ! port_open $((candidate + 1)); then port=$candidate; break; fi
  done
  [ -n "$port" ] || { echo "no free port for etcd" >&2; exit 1; }
  peer=$((port + 1))
  # Debian's unit runs etcd as its own user; a test's private member runs as the caller.
  nohup etcd --name leafd-test --data-dir "$dir/data" \
    --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "leafd-test=http://127.0.0.1:$peer" \
    > "$dir/etcd.log" 2>&1 &
  echo $! > "$dir/pid"
  for _ in $(seq 1 60); do
    if curl -fsS "http://127.0.0.1:$port/health" 2>/dev/null | grep -q '"health":"true"'; then
      echo "http://127.0.0.1:$port"
      exit 0
    fi
    sleep 0.5
  done
  echo "etcd did not start; log:" >&2
  tail -20 "$dir/etcd.log" >&2
  exit 1
  ;;
stop)
  if [ -f "$dir/pid" ]; then
    pid=$(cat "$dir/pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$dir/pid"
  fi
  ;;
esac
