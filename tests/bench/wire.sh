#!/usr/bin/env bash
# KVEventBatch decode/encode throughput (DESIGN §4, §11): 32 BlockStored x
# 16 blocks x 16 tokens in the map and array-v0.14 layouts, next to memcpy
# and msgpack-c's own unpack of the same bytes, measured in the same run.
# Pinned to one CPU when taskset exists, like the other parts.
set -euo pipefail
bin="${KVO_BENCH_BIN:?run through scripts/bench}/kvo-bench-wire"
pin=()
if command -v taskset >/dev/null; then pin=(taskset -c 1); fi
echo "+ ${pin[*]} $bin $*"
"${pin[@]}" "$bin" "$@"
