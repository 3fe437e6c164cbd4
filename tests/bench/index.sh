#!/usr/bin/env bash
# The index: BENCH.md W1 at 1x, 4x and 16x (w1, w1x4, w1x16), each in both
# protocols -- cold (a fresh process per run, first touch of every page
# included) and warm (apply, remove, apply again in one process; the second
# pass measured) -- next to the floor (an open-addressing u64 table: one
# insert per (block, worker) pair, 128 lookups per query) measured in the
# same run, pinned to one CPU. Per size and protocol: one discarded run, then
# $runs runs of the tree and of the floor, alternating; medians (min-max).
#
# Columns: the tree's median (min-max); the floor's median; tree / floor of
# this run (rates: >= 0.5 is within 2x of the floor; latencies: <= 2); the
# anchor, Dynamo's compressed-edge tree (049a8f48) from BENCH.md -- another
# run, on another machine of this kind -- and tree / anchor. Wall time on a
# shared machine is inflated by others: the "CPU" rows use the thread's CPU
# time of the whole phase instead (building each event from the workload
# arrays included, about a tenth of a warm apply phase: reading the CPU
# clock per call is a system call here and disturbs what it measures), and
# the page-fault rows say how much of a cold run is the kernel's first
# touch. A run whose checksum or score sum differs from
# BENCH.md's fails the script.
#
# Then the service (when nats-server is installed): query latency of a
# kvo-indexer (CPU 1) idle, while KVO_BENCH_INDEX_SERVICE_SIZE's (w1x4)
# stores stream in over NATS as fast as they can be published, and after
# (kvo-bench-index service; the client and nats-server on CPU 0).
#
# Env: KVO_BENCH_INDEX_SIZES (default "w1 w1x4 w1x16"; also w1-1m,
# one-worker-1m), KVO_BENCH_INDEX_PROTOCOLS ("cold warm"),
# KVO_BENCH_INDEX_RUNS (3), KVO_BENCH_INDEX_SERVICE_SIZE (w1x4; "none"
# skips the service).
set -euo pipefail
bin="${KVO_BENCH_BIN:?run through scripts/bench}/kvo-bench-index"
pin=()
if command -v taskset >/dev/null; then pin=(taskset -c 1); fi
sizes=${KVO_BENCH_INDEX_SIZES:-w1 w1x4 w1x16}
protocols=${KVO_BENCH_INDEX_PROTOCOLS:-cold warm}
runs=${KVO_BENCH_INDEX_RUNS:-3}
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# One run into $tmp/NAME; a failed run (wrong sums, error) stops everything.
run1() {
  local out=$1
  shift
  if ! "${pin[@]}" "$bin" "$@" >"$out" 2>&1; then
    echo "FAILED: ${pin[*]} $bin $*" >&2
    cat "$out" >&2
    exit 1
  fi
}

# median of metric NAME over files matching GLOB ("?" when none)
med() {
  cat $1 2>/dev/null | awk -v n="$2" '$1 == "metric" && $2 == n {print $3}' |
    sort -g | awk '{v[NR] = $1} END { if (NR == 0) print "?"; else print v[int((NR + 1) / 2)] }'
}
span() {
  cat $1 2>/dev/null | awk -v n="$2" '$1 == "metric" && $2 == n {print $3}' |
    sort -g | awk -v f="$3" '{v[NR] = $1} END {
      if (NR == 0) { print "?"; exit }
      printf(f " (" f "-" f ")", v[int((NR + 1) / 2)], v[1], v[NR]) }'
}
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (a == "?" || b == "?" || b == "-" || b + 0 == 0) print "-"; else printf("%.2f", a / b) }'
}
fmt() { awk -v v="$1" -v f="$2" 'BEGIN { if (v == "?" || v == "-") print v; else printf(f, v) }'; }

# anchor SIZE PROTOCOL METRIC: Dynamo compressed (049a8f48), BENCH.md
anchor() {
  case "$1/$2/$3" in
    w1/cold/apply_mops) echo 3.58 ;;      w1/warm/apply_mops) echo 21.9 ;;
    w1/cold/hit_p50_us) echo 1.14 ;;      w1/cold/hit_p99_us) echo 1.8 ;;
    w1/cold/queries_kps) echo 1377 ;;     w1/warm/queries_kps) echo 1160 ;;
    w1/cold/remove_mbps) echo 12.1 ;;     w1/cold/bytes_per_pair) echo 64.6 ;;
    w1/cold/peak_rss_mb) echo 65 ;;
    w1x4/cold/apply_mops) echo 2.23 ;;    w1x4/warm/apply_mops) echo 19.7 ;;
    w1x4/cold/hit_p50_us) echo 1.65 ;;    w1x4/cold/hit_p99_us) echo 2.8 ;;
    w1x4/cold/queries_kps) echo 907 ;;
    w1x16/cold/apply_mops) echo 2.41 ;;   w1x16/warm/apply_mops) echo 13.9 ;;
    w1x16/cold/hit_p50_us) echo 1.73 ;;   w1x16/cold/hit_p99_us) echo 8.4 ;;
    w1x16/cold/queries_kps) echo 872 ;;
    *) echo - ;;
  esac
}

# goal vs the anchor, BENCH.md: apply >= 1.5x, hit p99 <= 1x, q/s >= 1.5x,
# remove >= 2x, bytes per pair <= 32
goal() {
  local a
  a=$(anchor "$1" "$2" "$3")
  case "$3" in
    apply_mops|queries_kps) [ "$a" = - ] && echo - || fmt "$(awk -v a="$a" 'BEGIN{print a*1.5}')" ">= %g" ;;
    hit_p99_us) [ "$a" = - ] && echo - || echo "<= $a" ;;
    remove_mbps) [ "$a" = - ] && echo - || fmt "$(awk -v a="$a" 'BEGIN{print a*2}')" ">= %g" ;;
    bytes_per_pair) echo "<= 32" ;;
    *) echo - ;;
  esac
}

row() { printf '  %-26s %-24s %-9s %-8s %-10s %-9s %s\n' "$@"; }

for size in $sizes; do
  for proto in $protocols; do
    echo "+ ${pin[*]} $bin $size $proto [floor]   (1 discarded + $runs runs each, alternating)"
    run1 "$tmp/discard" "$size" "$proto"
    for i in $(seq "$runs"); do
      run1 "$tmp/$size.$proto.tree.$i" "$size" "$proto"
      run1 "$tmp/$size.$proto.floor.$i" "$size" "$proto" floor
    done
    grep -E '^workload checksum|^queries:' "$tmp/$size.$proto.tree.1" | sed 's/^/  /'
    T="$tmp/$size.$proto.tree.*" F="$tmp/$size.$proto.floor.*"
    echo
    row "$size $proto" "tree: median (min-max)" "floor" "/floor" "anchor" "/anchor" "goal (anchor: Dynamo compressed, another run)"
    for m in apply_mops apply_cpu_mops apply_max_us hit_p50_us hit_p99_us prefix_p50_us prefix_p99_us \
             random_p50_us random_p99_us queries_kps remove_mbps remove_cpu_mbps \
             bytes_per_pair peak_rss_mb apply_faults query_faults remove_faults; do
      if [ "$proto" = warm ]; then
        case $m in bytes_per_pair|peak_rss_mb) continue ;; esac
      fi
      t=$(med "$T" "$m") f=$(med "$F" "$m") a=$(anchor "$size" "$proto" "$m")
      case $m in
        *_us|bytes_per_pair|*faults|peak_rss_mb) f2=%.2f ;;
        queries_kps) f2=%.0f ;;
        *) f2=%.2f ;;
      esac
      case $m in *faults) f2=%.0f ;; esac
      label=$m
      case $m in
        apply_mops) label="apply, M block-ops/s" ;;
        apply_cpu_mops) label="  by CPU time" ;;
        apply_max_us) label="  longest event, us" ;;
        hit_p50_us) label="hit p50, us" ;;
        hit_p99_us) label="hit p99, us" ;;
        prefix_p50_us) label="prefix p50, us" ;;
        prefix_p99_us) label="prefix p99, us" ;;
        random_p50_us) label="random p50, us" ;;
        random_p99_us) label="random p99, us" ;;
        queries_kps) label="queries/s, k" ;;
        remove_mbps) label="remove, M blocks/s" ;;
        remove_cpu_mbps) label="  by CPU time" ;;
        bytes_per_pair) label="bytes per pair" ;;
        peak_rss_mb) label="peak RSS, MB" ;;
        apply_faults) label="page faults in apply" ;;
        query_faults) label="page faults in queries" ;;
        remove_faults) label="page faults in remove" ;;
      esac
      fr=$(ratio "$t" "$f")
      case $m in remove_*|peak_rss_mb) f="-"; fr="-" ;; esac
      row "$label" "$(span "$T" "$m" "$f2")" "$(fmt "$f" "$f2")" "$fr" "$a" "$(ratio "$t" "$a")" "$(goal "$size" "$proto" "$m")"
    done
    echo
  done
done

# ---- The service under a streaming apply ---------------------------------
svc_size=${KVO_BENCH_INDEX_SERVICE_SIZE:-w1x4}
if [ "$svc_size" = none ]; then exit 0; fi
if ! command -v nats-server >/dev/null; then
  echo "(service: nats-server not installed, skipped)"
  exit 0
fi
on0=() on1=()
if command -v taskset >/dev/null; then on0=(taskset -c 0) on1=(taskset -c 1); fi
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 30000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
wait_port() {
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "port $1 never opened" >&2
  return 1
}
np=$(free_port) hp=$(free_port)
"${on0[@]}" nats-server -a 127.0.0.1 -p "$np" >"$tmp/nats.log" 2>&1 &
pids+=($!)
wait_port "$np"
"${on1[@]}" "${KVO_BENCH_BIN}/kvo-indexer" --nats "nats://127.0.0.1:$np" \
  --http "127.0.0.1:$hp" >"$tmp/indexer.log" 2>&1 &
pids+=($!)
wait_port "$hp"
echo "+ ${on0[*]} $bin service $svc_size nats://127.0.0.1:$np http://127.0.0.1:$hp   (indexer on CPU 1)"
if ! "${on0[@]}" "$bin" service "$svc_size" "nats://127.0.0.1:$np" \
     "http://127.0.0.1:$hp" >"$tmp/service" 2>&1; then
  cat "$tmp/service" "$tmp/indexer.log" >&2
  exit 1
fi
grep -v '^metric' "$tmp/service" | sed 's/^/  /'
echo "  (the loop serves HTTP when a request waits, looked for every 50 us of apply, or after --apply-budget-us of apply; between two events of an envelope too)"
