#!/bin/bash
# Interleaved common-workload A/B: base (c420438) vs new (3d9147c), fresh sandbox each run.
set -u
# BASE_BIN and NEW_BIN: the two builds' target/release directories.
: "${BASE_BIN:?set BASE_BIN to the base build's target/release}" "${NEW_BIN:?set NEW_BIN to the new build's target/release}"
OUT=/tmp/ab-results.jsonl; : > $OUT
for round in 1 2; do
  for v in base new; do
    if [ $v = base ]; then B=$BASE_BIN; else B=$NEW_BIN; fi
    D=$(mktemp -d /var/tmp/ab-XXXX)
    $B/quire sandbox --data-dir $D/sb --listen 127.0.0.1:0 > $D/sb.out 2>&1 &
    SPID=$!
    for i in $(seq 1 100); do grep -q "proxy listening on" $D/sb.out && break; sleep 0.2; done
    P=$(grep -o "proxy listening on [0-9.:]*" $D/sb.out | awk '{print $4}')
    $NEW_BIN/quire-perf workload --proxy $P --cpu-pid $SPID --sandbox-dir $D/sb \
      --modes latency-open,throughput --label "$v round $round" --out $OUT > $D/perf.out 2>&1
    echo "$v round $round rc $?"
    kill $SPID; wait $SPID 2>/dev/null
    rm -rf $D
  done
done
echo done
