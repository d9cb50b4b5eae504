#!/usr/bin/env bash
# leafd's resident memory (RSS) at rest, with 10,000 idle client connections (plain, then TLS
# when openssl is there to make a certificate), and with 10,000 tags loaded (each with a segment
# in use). Loopback only; stops by itself.
#   bench/memory.sh [CONNECTIONS=10000] [TAGS=10000]
set -euo pipefail
cd "$(dirname "$0")/.."
connections=${1:-10000}
tags=${2:-10000}
leafd_bin=${LEAFD_BIN:-target/release/leafd}
[ -x "$leafd_bin" ] || cargo build --release --quiet
ulimit -n $((connections + 1024))
source bench/common.sh
work=$(mktemp -d)
pid=""
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
# A fresh process for each measurement: memory freed by one phase is not returned to the OS.
# Extra arguments go to leafd (a --config for the TLS phase).
start_leafd() {
  [ -z "$pid" ] || { kill "$pid"; wait "$pid" 2>/dev/null || true; }
  port=$(free_port)
  rm -f "$work"/leafd.db*
  "$leafd_bin" --bind "127.0.0.1:$port" --http-bind "127.0.0.1:$(free_port)" --max-clients $((connections + 100)) \
    --storage-url "sqlite://$work/leafd.db" "$@" > "$work/leafd.log" 2>&1 &
  pid=$!
  wait_for_ping "$port"
}
rss() { awk '/VmRSS/ {printf "%.1f MB", $2/1024}' "/proc/$pid/status"; }
start_leafd
echo "at rest: $(rss)"

# Opens COUNT connections to PORT (over TLS when CA is given), each sends PING and stays idle;
# prints leafd's RSS with them open.
idle_clients() {
  python3 - "$1" "$connections" "$pid" "$2" "${3:-}" <<'PY'
import socket, ssl, sys, time
port, count, pid, label, ca = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
context = ssl.create_default_context(cafile=ca) if ca else None
socks = []
for _ in range(count):
    s = socket.create_connection(("127.0.0.1", port))
    if context:
        s = context.wrap_socket(s, server_hostname="localhost")
    s.sendall(b"PING\r\n")
    socks.append(s)
for s in socks:
    assert s.recv(16) == b"+PONG\r\n"
time.sleep(1)
rss = [l for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")][0].split()[1]
print(f"with {count} idle {label}: {int(rss)/1024:.1f} MB")
for s in socks:
    s.close()
PY
}
idle_clients "$port" "connections"

if command -v openssl >/dev/null; then
  self_signed_cert "$work"
  tls_port=$(free_port)
  tls_section "$tls_port" "$work" > "$work/tls.toml"
  start_leafd --config "$work/tls.toml"
  idle_clients "$tls_port" "TLS connections" "$work/cert.pem"
fi
start_leafd

python3 -c '
import sys
n = int(sys.argv[1])
out = sys.stdout.buffer
for i in range(n):
    tag = f"tag{i:05d}".encode()
    out.write(b"*4\r\n$8\r\nLEAF.TAG\r\n$6\r\nCREATE\r\n$%d\r\n%s\r\n$4\r\n1000\r\n" % (len(tag), tag))
for i in range(n):
    key = f"segment:tag{i:05d}".encode()
    out.write(b"*2\r\n$4\r\nINCR\r\n$%d\r\n%s\r\n" % (len(key), key))
' "$tags" | redis-cli -p "$port" --pipe | tail -n 1
sleep 1
echo "with $tags tags loaded: $(rss) ($(redis-cli -p "$port" INFO leafd | grep segment_tags | tr -d '\r'))"
