#!/bin/bash
# Sandbox RSS before and after its proxy acquires K streams (each written at 1 rec/s by
# quire-perf's tail-write over K streams), then after 20 s idle.
set -u
# Usage: perf/many-streams-memory.sh K   (QUIRE, QUIRE_PERF, DATA_DIR override the defaults)
K=$1
D=${DATA_DIR:-/var/tmp/quire-many-streams}; rm -rf $D; mkdir -p $D
${QUIRE:-./target/release/quire} sandbox --data-dir $D --listen 127.0.0.1:0 > $D.out 2> $D.err &
SB=$!
for i in $(seq 300); do grep -q "proxy listening on" $D.out $D.err && break; sleep 1; done
ADDR=$(grep -ho "proxy listening on [0-9.:]*" $D.out $D.err | head -1 | awk '{print $4}')
sleep 15
rss() { awk '/VmRSS/{print $2}' /proc/$SB/status; }
R0=$(rss); echo "K=$K rss_before_kib=$R0"
${QUIRE_PERF:-./target/release/quire-perf} --proxy $ADDR --workloads tail-write --streams $K --rate $K --seconds 10 --warmup-seconds 2 --quiet > $D-perf.out 2>&1
grep "tail-write " $D-perf.out
R1=$(rss); echo "K=$K rss_after_writes_kib=$R1 per_stream_kib=$(( (R1-R0)/K ))"
sleep 20
R2=$(rss); echo "K=$K rss_idle_kib=$R2 per_stream_idle_kib=$(( (R2-R0)/K ))"
${QUIRE:-./target/release/quire} stream list --proxy $ADDR | wc -l
kill $SB; wait $SB
