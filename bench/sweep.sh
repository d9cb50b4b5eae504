#!/usr/bin/env bash
# What the periodic read of the tag list costs a node that knows many tags: one SQLite file of
# N tags (t000000000000 …, no rule recorded), each binary started on it in turn with
# segment.refresh_interval_secs = 5; its CPU time (user + system, in seconds) and RSS sampled
# every 2 s for 22 s after /ready, while no request arrives. Prints, per binary, the CPU spent
# after start (about four refreshes) and the lowest and highest RSS seen.
# Loopback only; stops every process it started; removes its directory.
#   bench/sweep.sh N BIN [BIN...]      e.g. bench/sweep.sh 1000000 /tmp/leafd-old target/release/leafd
set -euo pipefail
n=${1:?tag count}
shift
[ $# -ge 1 ] || { echo "usage: bench/sweep.sh N BIN [BIN...]" >&2; exit 2; }
dir=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
# The schema comes from the first binary's own migrations; the rows are inserted directly.
"$1" --storage-url "sqlite://$dir/l.db" migrate >/dev/null
python3 - "$dir/l.db" "$n" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rows = ((f"t{i:012d}",) for i in range(int(sys.argv[2])))
db.executemany("INSERT INTO leaf_alloc (biz_tag, max_id, step) VALUES (?, 0, 1000)", rows)
db.commit()
PY
printf '[segment]\nmax_tags = %d\nrefresh_interval_secs = 5\n' $((n + 10)) > "$dir/leafd.toml"
ticks=$(getconf CLK_TCK)
printf '%-40s %10s %12s %12s\n' binary cpu_s rss_min_mb rss_max_mb
for bin in "$@"; do
  "$bin" -c "$dir/leafd.toml" --storage-url "sqlite://$dir/l.db" --bind 127.0.0.1:26479 \
    --http-bind 127.0.0.1:28179 > "$dir/leafd.log" 2>&1 &
  pid=$!
  until curl -sf http://127.0.0.1:28179/ready >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || { echo "$bin exited:"; cat "$dir/leafd.log"; exit 1; }
    sleep 0.1
  done
  cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
  rss() { awk '/VmRSS/ {print $2}' "/proc/$pid/status"; }
  start=$(cpu); lo=$(rss); hi=$lo
  for _ in $(seq 11); do
    sleep 2
    r=$(rss); [ "$r" -lt "$lo" ] && lo=$r; [ "$r" -gt "$hi" ] && hi=$r
  done
  used=$(( $(cpu) - start ))
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  printf '%-40s %10s %12s %12s\n' "$bin" "$(echo "scale=2; $used / $ticks" | bc)" $((lo / 1024)) $((hi / 1024))
done
