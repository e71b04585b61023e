#!/bin/bash
# Many streams over three balanced proxies, then a proxy joining and one drained, on a
# multi-process loopback cluster (perf/examples/many_streams.rs has the method).
# Usage: perf/many-streams-cluster.sh STREAMS [OUT_FILE] [extra many_streams flags...]
#   (the processes' stderr goes to $ERR, default /tmp/many-streams.stderr)
#   e.g. perf/many-streams-cluster.sh 10000 perf/results/many-streams-20261207/10000.txt --join-drain
set -eu
N=$1; OUT=${2:-/dev/stdout}; shift; [ $# -gt 0 ] && shift
export QUIRE_GIT_COMMIT=${QUIRE_GIT_COMMIT:-dev}
# The workspace build of scripts/test plus the example: the same features, so after the tests'
# build this builds only the example (`-p quire` alone resolves other features and rebuilds
# about 30 crates).
cargo build --release -q --workspace --tests --bins --example many_streams
export QUIRE_TEST_BIN=${QUIRE_TEST_BIN:-$PWD/target/release/quire}
{
  echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) nproc $(nproc) loadavg $(cat /proc/loadavg)"
  echo "# ./target/release/examples/many_streams --streams $N $*"
  ./target/release/examples/many_streams --streams "$N" "$@" 2>"${ERR:-/tmp/many-streams.stderr}"
  echo "# end $(date -u +%FT%TZ) loadavg $(cat /proc/loadavg)"
} | tee "$OUT"
