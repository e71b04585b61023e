#!/bin/bash
# Ran 13:15-13:23 UTC as: OUT=ab-journal-buffer-proxy-threads.jsonl ROUNDS=3 PERF_FLAGS="--duration 12 --warmup 2"
#   MODES=latency-open,throughput ./ab.sh "base2|BASE sandbox" "base1|BASE sandbox --proxy-threads 1"
#   "new2|NEW sandbox" "new1|NEW sandbox --proxy-threads 1"   (BASE: e6736fd, NEW: 7046968; show.py prints the rows)
# Interleaved variants: each arg is "label|binary sandbox-extra-flags"; env ROUNDS, MODES.
set -u
OUT=${OUT:-/var/tmp/ab/out.jsonl}
ROUNDS=${ROUNDS:-2}; MODES=${MODES:-latency-open,throughput}
for round in $(seq 1 $ROUNDS); do
  for spec in "$@"; do
    label=${spec%%|*}; cmd=${spec#*|}
    D=$(mktemp -d /var/tmp/abrun-XXXX)
    $cmd --data-dir $D/sb --listen 127.0.0.1:0 > $D/sb.out 2>&1 &
    SPID=$!
    for i in $(seq 1 100); do grep -q "proxy listening on" $D/sb.out && break; sleep 0.2; done
    P=$(grep -o "proxy listening on [0-9.:]*" $D/sb.out | awk '{print $4}')
    /var/tmp/ab/quire-perf workload --proxy $P --cpu-pid $SPID --sandbox-dir $D/sb \
      --modes $MODES ${PERF_FLAGS:-} --label "$label r$round" --out $OUT > $D/perf.out 2>&1
    echo "$label round $round rc $? io=$(grep some /proc/pressure/io | cut -d' ' -f2)"
    kill $SPID; wait $SPID 2>/dev/null
    rm -rf $D
  done
done
