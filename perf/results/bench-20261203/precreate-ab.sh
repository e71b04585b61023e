#!/bin/bash
# Default 64 MiB journal files against 1 GiB ones (big: QUIRE_BIN is a wrapper that execs quire
# with --journal-file-size-bytes 1073741824), peerbench quire all, 2 rounds; ran 13:33-13:41 UTC.
export PEERBENCH_DIR=/var/tmp/pb
B="${BENCH_DIR:?set BENCH_DIR to the shared bench directory (../shared/bench)}"
for r in 1 2; do for v in default big; do
  if [ $v = big ]; then export QUIRE_BIN=/var/tmp/ab/big/quire-wrap; else export QUIRE_BIN=/var/tmp/qnew/quire; fi
  $B/quire/start.sh >/dev/null 2>&1 || { echo "start $v failed"; continue; }
  /var/tmp/pb/target/release/peerbench quire all --label "$v r$r" --out /var/tmp/ab/pre.jsonl 2>&1 | grep -E "^\[quire (latency-open|throughput)" | sed "s/^/$v r$r /"
  $B/quire/stop.sh >/dev/null 2>&1
done; done
