#!/bin/bash
# Runs perf/proxy-attacks.py's scenarios, each against a fresh sandbox of BINARY (1 bookie,
# E=Qw=Qa=1, default proxy bounds) on loopback, and prints the results (perf/README.md,
# "Issue 24: hostile clients beside a legitimate one").
# usage: perf/proxy-attacks.sh BINARY [tls]
set -u
BIN=$1
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
sandbox() {
  rm -rf "$DIR/sbx"
  "$BIN" sandbox --data-dir "$DIR/sbx" --listen 127.0.0.1:14281 --metrics-listen 127.0.0.1:14290 \
    --bookies 1 --ensemble-size 1 --write-quorum 1 --ack-quorum 1 "$@" > "$DIR/sbx.log" 2>&1 &
  PID=$!
  for _ in $(seq 50); do grep -q "proxy listening" "$DIR/sbx.log" && break; sleep 0.2; done
}
stop() { kill "$PID"; wait "$PID" 2>/dev/null; }
ATTACK="python3 $HERE/proxy-attacks.py"
if [ "${2:-}" = tls ]; then
  sandbox --tls
  TLS="--tls-ca $DIR/sbx/tls/ca.pem --tls-cert $DIR/sbx/tls/node.pem --tls-key $DIR/sbx/tls/node.key"
  $ATTACK tls-cycle 4200 --proxy 127.0.0.1:14281 --pid "$PID" --secs 25 --no-legit & A=$!
  sleep 4; echo "== tls-cycle 4200"; $ATTACK legit --proxy 127.0.0.1:14281 --secs 20 $TLS; wait $A
  stop; exit 0
fi
for n in 1 16 64 256; do
  sandbox; echo "== unread $n"
  $ATTACK unread "$n" --proxy 127.0.0.1:14281 --pid "$PID" --secs 25; stop
done
sandbox; echo "== metrics"; $ATTACK metrics --metrics 127.0.0.1:14290 --proxy 127.0.0.1:14281 --secs 20; stop
sandbox
$ATTACK cycle 4200 --proxy 127.0.0.1:14281 --pid "$PID" --secs 25 --no-legit & A=$!
sleep 4; echo "== cycle 4200"; $ATTACK legit --proxy 127.0.0.1:14281 --secs 20; wait $A
stop
