#!/usr/bin/env bash
# Cold (empty cache) and warm (cache filled) time-to-ready of `python -m seq2seq.prepare`,
# three runs each. Usage: scripts/time_to_ready.sh [data_dir] [extra overrides...]
set -euo pipefail
data_dir=${1:-../shared/data}
shift || true
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for run in 1 2 3; do
  for kind in cold warm; do
    [ "$kind" = cold ] && rm -rf "$work/cache"
    start=$(date +%s.%N)
    out=$(python -m seq2seq.prepare "paths.data_dir=$(realpath "$data_dir")" \
      "paths.cache_dir=$work/cache" "hydra.run.dir=$work/run" "$@" 2>/dev/null)
    end=$(date +%s.%N)
    ready=$(grep -o 'ready in [0-9.]*s' <<<"$out")
    printf '%s run %d: %s (data), %.1fs process wall time\n' "$kind" "$run" "$ready" \
      "$(echo "$end - $start" | bc)"
  done
done
