#!/usr/bin/env bash
# BENCH.md W2 -- relay throughput. A kvo-mocker capture of the Mooncake
# conversation trace is replayed into kvo-relay by a publisher that sends as
# fast as the socket takes it (XPUB, no drops), and the same bytes into a raw
# pass-through (SUB -> NATS publish of the payload, no decoding), in the same
# run against the same nats-server. Throughput: 3 rounds each, median (min-max).
# Latency: the first 2000 batches in lockstep (send one, wait for it on NATS);
# added latency = relay - pass-through. The targets run on CPU 1, the driver and
# nats-server on CPU 0 (when taskset exists). Because the CPUs are shared, the
# CPU time each target used (user + sys, all its threads, from /proc) is shown
# per batch next to the rates, and at the end the relay's pipeline alone
# (kvo-bench-relay pipe: thread CPU time, no sockets) on the same capture.
#
# Needs ~1.2 GB in $TMPDIR for the capture and as much RAM for the driver.
# Env: KVO_BENCH_RELAY_CAPTURE=FILE reuses a capture; KVO_BENCH_RELAY_ROUNDS.
set -euo pipefail
bin="${KVO_BENCH_BIN:?run through scripts/bench}"
cd "$(dirname "$0")/../.."
rounds=${KVO_BENCH_RELAY_ROUNDS:-3}
lockstep=2000
trace=traces/mooncake_conversation.jsonl
work=$(mktemp -d "${TMPDIR:-/tmp}/kvo-bench-relay.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

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

jget() { sed -n "s/.*\"$1\": *\([0-9.]*\).*/\1/p" <<<"$2"; }

median() { sort -g | awk '{a[NR]=$1} END {m=a[int((NR+1)/2)]; printf "%s %s %s\n", m, a[1], a[NR]}'; }

# ---- the capture
cap=${KVO_BENCH_RELAY_CAPTURE:-}
if [ -z "$cap" ]; then
  cap=$work/mooncake.kvocap
  if [ -x "$bin/kvo-mocker" ]; then
    echo "+ kvo-mocker --trace $trace --speedup 0 --block-size 16 --record $cap"
    "${on1[@]}" "$bin/kvo-mocker" --trace "$trace" --speedup 0 --block-size 16 \
      --record "$cap" >"$work/mocker.out" 2>"$work/mocker.log" || {
        tail -20 "$work/mocker.log" >&2; exit 1; }
  else
    echo "+ kvo-mocker not built: synthetic capture (kvo-bench-relay synth)"
    "$bin/kvo-bench-relay" synth --out "$cap" --batches 50000
  fi
fi
echo "capture: $cap ($(du -h "$cap" | cut -f1))"

# ---- nats-server
natsd=$(command -v nats-server || echo /usr/sbin/nats-server)
nport=$(free_port)
"${on0[@]}" "$natsd" -a 127.0.0.1 -p "$nport" >"$work/nats.log" 2>&1 &
pids+=($!)
wait_port "$nport"
nats=nats://127.0.0.1:$nport
subject=namespace.dynamo.component.backend.kv-events

# run MODE(raw|relay) LOCKSTEP(0|n) -> one JSON line
run() {
  local mode=$1 ls=$2 zport target
  zport=$(free_port)
  if [ "$mode" = raw ]; then
    local asap=(); [ "$ls" -gt 0 ] && asap=(--send-asap)
    "${on1[@]}" "$bin/kvo-bench-relay" passthrough --zmq "tcp://127.0.0.1:$zport" \
      --nats "$nats" --subject "$subject" "${asap[@]}" 2>>"$work/target.log" &
  else
    "${on1[@]}" "$bin/kvo-relay" --zmq "tcp://127.0.0.1:$zport" --nats "$nats" \
      --publisher-id 1 --stats-interval-ms 0 --log-level warn \
      --stats-json "$work/relay-exit.json" 2>>"$work/target.log" &
  fi
  target=$!
  local args=(drive --capture "$cap" --bind "tcp://127.0.0.1:$zport" --nats "$nats"
              --subject "$subject" --expect "$mode")
  [ "$ls" -gt 0 ] && args+=(--lockstep "$ls")
  local out
  out=$("${on0[@]}" "$bin/kvo-bench-relay" "${args[@]}") || {
    kill "$target"; tail -20 "$work/target.log" >&2; exit 1; }
  local cpu
  cpu=$(awk -v t="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / t}' \
          "/proc/$target/stat" 2>/dev/null || echo 0)
  kill -TERM "$target"
  wait "$target" || { echo "$mode exited badly" >&2; tail -20 "$work/target.log" >&2; exit 1; }
  if [ "$mode" = relay ] && [ "$ls" -eq 0 ]; then
    local ex; ex=$(cat "$work/relay-exit.json")
    for k in decode_errors_total rejects_total gaps publish_dropped; do
      [ "$(jget "$k" "$ex")" = 0 ] || { echo "relay $k = $(jget "$k" "$ex")" >&2; exit 1; }
    done
  fi
  echo "${out%\}}, \"target_cpu_s\": $cpu}"
}

declare -A tp
for r in $(seq 1 "$rounds"); do
  for mode in raw relay; do
    out=$(run "$mode" 0)
    echo "  round $r $mode: $out"
    [ "$r" = 1 ] && [ "$mode" = raw ] && first=$out
    for k in batches_per_s events_per_s blocks_per_s mb_per_s; do
      tp[$mode.$k]+="$(jget "$k" "$out") "
    done
    tp[$mode.cpu_us_per_batch]+="$(awk -v c="$(jget target_cpu_s "$out")" \
      -v n="$(jget batches "$out")" 'BEGIN{printf "%.2f", c * 1e6 / n}') "
  done
done
lat_raw=$(run raw "$lockstep"); echo "  lockstep raw: $lat_raw"
lat_rel=$(run relay "$lockstep"); echo "  lockstep relay: $lat_rel"

echo
echo "W2 relay throughput: $(jget batches "$first") batches, $(jget events "$first") events," \
     "$(jget blocks "$first") blocks, $(jget bytes "$first") payload bytes; median of $rounds (min-max)"
printf "%-14s %26s %26s %8s\n" metric pass-through kvo-relay ratio
for k in batches_per_s events_per_s blocks_per_s mb_per_s cpu_us_per_batch; do
  read -r rm rlo rhi < <(tr ' ' '\n' <<<"${tp[raw.$k]}" | grep . | median)
  read -r lm llo lhi < <(tr ' ' '\n' <<<"${tp[relay.$k]}" | grep . | median)
  printf "%-14s %26s %26s %8.2f\n" "$k" "$rm ($rlo-$rhi)" "$lm ($llo-$lhi)" \
    "$(awk -v a="$lm" -v b="$rm" 'BEGIN{print a/b}')"
done
rp50=$(jget lat_p50_us "$lat_raw"); rp99=$(jget lat_p99_us "$lat_raw")
lp50=$(jget lat_p50_us "$lat_rel"); lp99=$(jget lat_p99_us "$lat_rel")
printf "%-14s %26s %26s %8s\n" "lat p50 us" "$rp50" "$lp50" \
  "+$(awk -v a="$lp50" -v b="$rp50" 'BEGIN{printf "%.1f", a-b}')"
printf "%-14s %26s %26s %8s\n" "lat p99 us" "$rp99" "$lp99" \
  "+$(awk -v a="$lp99" -v b="$rp99" 'BEGIN{printf "%.1f", a-b}')"
echo "(goal: ratio >= 0.8; lockstep latency over the first $lockstep batches, ZMQ -> NATS subscriber;"
echo " cpu_us_per_batch: CPU time of the target process, all threads, user + sys)"
echo
echo "+ ${on1[*]} kvo-bench-relay pipe --capture $cap --rounds 3"
"${on1[@]}" "$bin/kvo-bench-relay" pipe --capture "$cap" --rounds 3
