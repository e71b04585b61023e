#!/usr/bin/env bash
# Re-replication rate and the tail-write latency while it runs, against the same tail writer
# with no copy running, alternated in one run (perf/README.md, "Re-replication";
# perf/examples/rereplication.rs says what runs).
#
# Usage: perf/rereplication.sh [MIB [ENTRY_BYTES [ROUNDS [RATE_BYTES]]]]
#   MIB          size of each lost fragment copied (default 128)
#   ENTRY_BYTES  bytes per entry of the copied ledgers (default 16384)
#   ROUNDS       baseline/copy pairs (default 3)
#   RATE_BYTES   the copy's replication_rate_bytes (default 0: unlimited)
# Output: a table and the medians, also written to $OUT_DIR/rereplication.txt (OUT_DIR
# defaults to /tmp/rereplication). Needs ZooKeeper installed (Debian package zookeeper) and
# about 4 × MIB × ROUNDS MiB free under QUIRE_REREP_BENCH_DIR (default /tmp, not tmpfs).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-/tmp/rereplication}
mkdir -p "$OUT_DIR"
cargo build --release -p quire --bin quire
cargo build --release -p quire-perf --example rereplication
QUIRE_BIN="$PWD/target/release/quire" \
QUIRE_REREP_BENCH_MIB=${1:-128} \
QUIRE_REREP_BENCH_ENTRY_BYTES=${2:-16384} \
QUIRE_REREP_BENCH_ROUNDS=${3:-3} \
QUIRE_REREP_BENCH_RATE_BYTES=${4:-0} \
  ./target/release/examples/rereplication 2>&1 | tee "$OUT_DIR/rereplication.txt"
