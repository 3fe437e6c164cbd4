#!/usr/bin/env bash
# KVEventBatch decode/encode throughput (DESIGN §4, §11): 32 BlockStored x
# 16 blocks x 16 tokens in the map and array-v0.14 layouts, next to memcpy,
# msgpack-c's own unpack of the same bytes and msgpack-c's packer writing
# them, measured in the same run. Twice: token ids below 151,936 (1-, 2- and
# 4-byte ids at random) and below 32,000 (kvo-mocker's trace prompts).
# Pinned to one CPU when taskset exists, like the other parts.
set -euo pipefail
bin="${KVO_BENCH_BIN:?run through scripts/bench}/kvo-bench-wire"
pin=()
if command -v taskset >/dev/null; then pin=(taskset -c 1); fi
for vocab in 151936 32000; do
  echo "+ ${pin[*]} $bin --vocab $vocab $*"
  "${pin[@]}" "$bin" --vocab "$vocab" "$@"
done
