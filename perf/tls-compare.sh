#!/usr/bin/env bash
# Tail-write p99 and sustained throughput of `quire sandbox` with TLS off and on, measured in
# the same run (perf/README.md, "TLS on and off").
#
# Usage: perf/tls-compare.sh [-n ROUNDS] [-r RATE] [-s SECONDS]
#
# A round runs the plain sandbox, then `quire sandbox --tls` (TLS with required client
# certificates on every bookie port and the proxy port, the proxy presenting its certificate
# to the bookies), each fresh in $DATA_DIR (deleted before and after), so both are measured in
# the same window of this shared machine. Each run: `quire-perf --workloads
# tail-write,throughput` at RATE records/s (1 KiB records, the harness defaults otherwise)
# for SECONDS after a 2 s warm-up, and a throughput search of 3 s steps from 1000/s with a
# 20 ms p99 bound and 2 refinements; the TLS run passes the sandbox's CA and client
# certificate to quire-perf.
# Output: one line per run (mode, tail-write p50/p99/p99.9 ms, errors, sustained records/s),
# then the medians per mode. Reports go to $OUT_DIR. Env: DATA_DIR (/var/tmp/tls-sb), OUT_DIR
# (/tmp/tls-compare), QUIRE (./target/release/quire), PERF_BIN (./target/release/quire-perf).
set -euo pipefail

ROUNDS=2
RATE=2000
SECONDS_RUN=10
while getopts "n:r:s:" opt; do
    case $opt in
        n) ROUNDS=$OPTARG ;;
        r) RATE=$OPTARG ;;
        s) SECONDS_RUN=$OPTARG ;;
        *) sed -n '2,20p' "$0" >&2; exit 2 ;;
    esac
done
DATA_DIR=${DATA_DIR:-/var/tmp/tls-sb}
OUT_DIR=${OUT_DIR:-/tmp/tls-compare}
QUIRE=${QUIRE:-./target/release/quire}
PERF_BIN=${PERF_BIN:-./target/release/quire-perf}
for b in "$QUIRE" "$PERF_BIN"; do
    [ -x "$b" ] || { echo "no $b: cargo build --release -p quire -p quire-perf" >&2; exit 2; }
done
mkdir -p "$OUT_DIR"

sandbox_pid=""
cleanup() {
    if [ -n "$sandbox_pid" ]; then kill -INT "$sandbox_pid" 2>/dev/null || true; wait "$sandbox_pid" 2>/dev/null || true; fi
    rm -rf "$DATA_DIR"
}
trap cleanup EXIT

: > "$OUT_DIR/runs.tsv"
for round in $(seq 1 "$ROUNDS"); do
    for mode in plain tls; do
        rm -rf "$DATA_DIR"
        flags=()
        [ "$mode" = tls ] && flags=(--tls)
        # Emptied here, not only by the redirection of the background job below, which may run
        # after the loop has read the previous sandbox's address.
        : > "$OUT_DIR/sandbox.out"
        "$QUIRE" sandbox --data-dir "$DATA_DIR" --listen 127.0.0.1:0 "${flags[@]}" \
            > "$OUT_DIR/sandbox.out" 2> "$OUT_DIR/sandbox.err" &
        sandbox_pid=$!
        addr=""
        for _ in $(seq 1 600); do
            addr=$(sed -n 's/^quire sandbox: proxy listening on //p' "$OUT_DIR/sandbox.out")
            [ -n "$addr" ] && break
            kill -0 "$sandbox_pid" 2>/dev/null || { cat "$OUT_DIR/sandbox.err" >&2; exit 2; }
            sleep 0.1
        done
        [ -n "$addr" ] || { echo "sandbox did not start" >&2; exit 2; }
        tls_flags=()
        if [ "$mode" = tls ]; then
            tls_flags=(--tls-ca-file "$DATA_DIR/tls/ca.pem" --tls-cert-file "$DATA_DIR/tls/node.pem"
                       --tls-key-file "$DATA_DIR/tls/node.key")
        fi
        sleep 1
        report="$OUT_DIR/report-$round-$mode.json"
        "$PERF_BIN" --proxy "$addr" --workloads tail-write,throughput --rate "$RATE" \
            --seconds "$SECONDS_RUN" --warmup-seconds 2 --throughput-step-seconds 3 \
            --throughput-refine-steps 2 --throughput-p99-ms 20 --quiet \
            --json "$report" --plot "$OUT_DIR/plot-$round-$mode.svg" "${tls_flags[@]}" \
            > "$OUT_DIR/perf-$round-$mode.out" 2>&1 || true
        kill -INT "$sandbox_pid"; wait "$sandbox_pid" 2>/dev/null || true; sandbox_pid=""
        python3 - "$report" "$mode" "$round" >> "$OUT_DIR/runs.tsv" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
tw, tp = r["tail_write"], r["throughput"]
l = tw["latency"]
print(f"{sys.argv[3]}\t{sys.argv[2]}\t{l['p50_ms']:.3f}\t{l['p99_ms']:.3f}\t{l['p999_ms']:.3f}\t{tw['errors']}\t{tp['sustained_records_per_s']:.0f}")
PY
        tail -n 1 "$OUT_DIR/runs.tsv"
    done
done
python3 - "$OUT_DIR/runs.tsv" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
for mode in ("plain", "tls"):
    m = [r for r in rows if r[1] == mode]
    if not m:
        continue
    med = lambda i: statistics.median(float(r[i]) for r in m)
    print(f"median {mode:5}: tail-write p50 {med(2):.3f} ms  p99 {med(3):.3f} ms  p99.9 {med(4):.3f} ms  sustained {med(6):.0f} records/s  ({len(m)} runs)")
PY
