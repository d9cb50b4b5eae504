#!/usr/bin/env bash
# Criterion benchmarks of an older commit against the working tree, built once each and run in
# alternating rounds, so both see the same machine. The older commit is checked out in a git
# worktree under /tmp with its own target directory (kept between runs: a second run rebuilds
# nothing). Benchmarks the older commit lacks are simply absent from its rounds.
#   bench/criterion-ab.sh BASE_COMMIT [FILTER] [ROUNDS=2]
# FILTER is criterion's regex, e.g. 'resp/decode_incr|segment/next_id$'.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: bench/criterion-ab.sh BASE_COMMIT [FILTER] [ROUNDS]}
filter=${2:-}
rounds=${3:-2}
short=$(git rev-parse --short "$base")
tree=/tmp/leafd-ab-$short
[ -d "$tree" ] || git worktree add --detach "$tree" "$base" >/dev/null
bench() { # DIR TARGET_DIR
  (cd "$1" && CARGO_TARGET_DIR="$2" cargo bench --quiet --bench engines -- ${filter:+"$filter"} 2>&1) |
    grep -E "^[a-z_]+/|time:" | sed 's/^/  /'
}
(cd "$tree" && CARGO_TARGET_DIR="$tree-target" cargo bench --quiet --bench engines --no-run)
cargo bench --quiet --bench engines --no-run
for round in $(seq 1 "$rounds"); do
  echo "round $round: $short"
  bench "$tree" "$tree-target"
  echo "round $round: working tree ($(git rev-parse --short HEAD)$(git diff --quiet || echo +changes))"
  bench . "$PWD/target"
done
