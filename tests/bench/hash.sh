#!/usr/bin/env bash
# Hash throughput (DESIGN §5): router hash vs raw XXH3-64 and memcpy; engine
# hash ns/block for each algorithm vs the raw digest of the same bytes.
# Pinned to one CPU when taskset exists, like the other parts.
set -euo pipefail
bin="${KVO_BENCH_BIN:?run through scripts/bench}/kvo-bench-hash"
pin=()
if command -v taskset >/dev/null; then pin=(taskset -c 1); fi
echo "+ ${pin[*]} $bin $*"
"${pin[@]}" "$bin" "$@"
