#!/usr/bin/env bash
# The index (BENCH.md W1, and the 1M-block shapes of issue 3): one
# discarded run, then 3 cold runs (fresh processes) pinned to one CPU;
# medians with min-max, next to Dynamo's radix tree measured on W1.
set -euo pipefail
bin="${KVO_BENCH_BIN:?run through scripts/bench}/kvo-bench-index"
pin=()
if command -v taskset >/dev/null; then pin=(taskset -c 1); fi
runs=3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# shape -> runs in $tmp/<shape>.<i>
measure() {
  local shape=$1
  echo "+ ${pin[*]} $bin $shape   (1 discarded + $runs cold runs)"
  "${pin[@]}" "$bin" "$shape" >/dev/null
  for i in $(seq "$runs"); do "${pin[@]}" "$bin" "$shape" >"$tmp/$shape.$i"; done
  grep -E '^workload|^queries:' "$tmp/$shape.1" | sed 's/^/  /'
}

# median (min-max) of metric NAME over the runs of SHAPE
stat() {
  local shape=$1 name=$2 fmt=${3:-%.2f}
  cat "$tmp/$shape".* | awk -v n="$name" '$1 == "metric" && $2 == n {print $3}' |
    sort -g | awk -v f="$fmt" '{v[NR] = $1} END {
      if (NR == 0) { print "?"; exit }
      printf(f " (" f "-" f ")", v[int((NR + 1) / 2)], v[1], v[NR]) }'
}

measure w1
printf '\n  %-32s %-16s %-12s %s\n' "W1 metric" "Dynamo" "goal" "kvoracle: median (min-max) of $runs"
row() { printf '  %-32s %-16s %-12s %s\n' "$1" "$2" "$3" "$4"; }
row "apply, M block-ops/s" "3.38" ">= 6.8" "$(stat w1 apply_mops)"
row "hit query p50, us" "9.7" "<= 5" "$(stat w1 hit_p50_us)"
row "hit query p99, us" "15.6" "<= 8" "$(stat w1 hit_p99_us)"
row "prefix query p50, us" "0.89" "<= 0.5" "$(stat w1 prefix_p50_us)"
row "prefix query p99, us" "2.85" "<= 1.5" "$(stat w1 prefix_p99_us)"
row "random query p50 / p99, us" "-" "-" "$(stat w1 random_p50_us) / $(stat w1 random_p99_us)"
row "queries/s, k" "185" ">= 370" "$(stat w1 queries_kps %.0f)"
row "remove, M blocks/s" "4.34" ">= 8.7" "$(stat w1 remove_mbps)"
row "bytes per (block, worker) pair" "352" "<= 48" "$(stat w1 bytes_per_pair %.1f)"
row "peak RSS, MB" "292" "<= 60" "$(stat w1 peak_rss_mb %.1f)"
echo

measure w1-1m
row "1M blocks / 8 workers" "" "" ""
row "apply, M block-ops/s" "" ">= 5" "$(stat w1-1m apply_mops)"
row "hit (128-block) p50 / p99, us" "" "p99 <= 10" "$(stat w1-1m hit_p50_us) / $(stat w1-1m hit_p99_us)"
row "bytes per pair" "~65 (own est.)" "<= 48" "$(stat w1-1m bytes_per_pair %.1f)"
echo

measure one-worker-1m
row "1M blocks / 1 worker" "" "" ""
row "apply, M block-ops/s" "" ">= 5" "$(stat one-worker-1m apply_mops)"
row "bytes per pair" "~65 (own est.)" "<= 48" "$(stat one-worker-1m bytes_per_pair %.1f)"
row "hit (128-block) p50 / p99, us" "" "p99 <= 10" "$(stat one-worker-1m hit_p50_us) / $(stat one-worker-1m hit_p99_us)"
