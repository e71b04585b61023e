#!/usr/bin/env bash
# Open time of an engine whose oldest index segment is damaged (rebuilt from the entry logs
# during open) against a clean open of the same directories, alternated in one run
# (perf/README.md, "Index segment rebuild"; engine/benches/index_rebuild.rs).
#
# Usage: perf/index-rebuild.sh [BYTES [ENTRY_BYTES [ROUNDS]]]
#   BYTES        entry data written first (default 1073741824: 1 GiB of entry logs)
#   ENTRY_BYTES  bytes per entry (default 1024)
#   ROUNDS       clean/damaged open pairs (default 3)
# Output: one line per round and the medians, also written to $OUT_DIR/index-rebuild.txt
# (OUT_DIR defaults to /tmp/index-rebuild). Needs about 2.2 × BYTES free in /tmp (journal and
# entry logs). Exit status 0, or non-zero if the build or a run fails.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-/tmp/index-rebuild}
mkdir -p "$OUT_DIR"
QUIRE_REBUILD_BENCH_BYTES=${1:-1073741824} \
QUIRE_REBUILD_BENCH_ENTRY_BYTES=${2:-1024} \
QUIRE_REBUILD_BENCH_ROUNDS=${3:-3} \
  cargo bench -p quire-engine --bench index_rebuild 2>&1 | tee "$OUT_DIR/index-rebuild.txt"
