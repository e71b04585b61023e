#!/bin/bash
# Interleaved common-workload A/B: base (c420438) vs new (3d9147c), fresh sandbox each run.
set -u
OUT=/tmp/ab-results.jsonl; : > $OUT
for round in 1 2; do
  for v in base new; do
    if [ $v = base ]; then B=/work/wt-base/target/release; else B=/work/main/target/release; fi
    D=$(mktemp -d /var/tmp/ab-XXXX)
    $B/quire sandbox --data-dir $D/sb --listen 127.0.0.1:0 > $D/sb.out 2>&1 &
    SPID=$!
    for i in $(seq 1 100); do grep -q "proxy listening on" $D/sb.out && break; sleep 0.2; done
    P=$(grep -o "proxy listening on [0-9.:]*" $D/sb.out | awk '{print $4}')
    /work/main/target/release/quire-perf workload --proxy $P --cpu-pid $SPID --sandbox-dir $D/sb \
      --modes latency-open,throughput --label "$v round $round" --out $OUT > $D/perf.out 2>&1
    echo "$v round $round rc $?"
    kill $SPID; wait $SPID 2>/dev/null
    rm -rf $D
  done
done
echo done
