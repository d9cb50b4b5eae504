#!/usr/bin/env bash
# Starts a standalone ZooKeeper for tests on 127.0.0.1 with its own data dir, installing
# Debian's `zookeeper` package if needed. Prints the connect string; stops it on `stop DIR`.
#   scripts/zookeeper.sh start DIR [PORT]  -> prints 127.0.0.1:PORT, runs until `stop`
#   scripts/zookeeper.sh stop DIR           (SIGTERM, waits for the process to exit)
# Starting again on the same DIR and PORT is a restart: the data (sessions, nodes) is kept.
set -euo pipefail
cmd=${1:?start|stop}
dir=${2:?directory}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

case "$cmd" in
start)
  if [ ! -f /usr/share/java/zookeeper.jar ] || ! command -v java >/dev/null; then
    echo "installing zookeeper (Debian package)" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zookeeper >&2
  fi
  mkdir -p "$dir/data"
  port=${3:-}
  for candidate in $([ -n "$port" ] || seq 21810 21850); do
    if ! port_open "$candidate"; then port=$candidate; break; fi
  done
  [ -n "$port" ] || { echo "no free port for ZooKeeper" >&2; exit 1; }
  cat > "$dir/zoo.cfg" <<CFG
tickTime=500
dataDir=$dir/data
clientPort=$port
clientPortAddress=127.0.0.1
minSessionTimeout=1000
maxSessionTimeout=60000
admin.enableServer=false
CFG
  nohup java -Xmx256m -Dzookeeper.4lw.commands.whitelist=ruok \
    -cp "/etc/zookeeper/conf_example:/usr/share/java/zookeeper.jar" \
    org.apache.zookeeper.server.ZooKeeperServerMain "$dir/zoo.cfg" > "$dir/zookeeper.log" 2>&1 &
  echo $! > "$dir/pid"
  for _ in $(seq 1 60); do
    if reply=$( (exec 3<>"/dev/tcp/127.0.0.1/$port"; echo ruok >&3; timeout 2 cat <&3) 2>/dev/null ) && [ "$reply" = imok ]; then
      echo "127.0.0.1:$port"
      exit 0
    fi
    sleep 0.5
  done
  echo "ZooKeeper did not start; log:" >&2
  tail -20 "$dir/zookeeper.log" >&2
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
