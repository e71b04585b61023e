#!/usr/bin/env bash
# Retention soak (issue 9): does disk use level off under size retention with bookie garbage
# collection and compaction running, and what do GC and compaction cost tail writes?
#
# Usage: perf/retention-soak.sh [SECONDS] [RATE]        (defaults 600, 500)
#
# Two sandboxes run side by side in one window, so that both see the same (shared, noisy)
# machine: "gc" collects garbage every GC_SECS (10) seconds with minor and major compaction due
# every 30 / 120 s, "nogc" has garbage collection off (--gc-interval-secs 0). Both have the same
# size retention RETENTION_BYTES (16 MiB) per stream as the cluster default, 2 MiB segments, 4 MiB
# entry logs and 16 MiB journal files, so that retention deletes segments all the time and only
# the bookies' GC differs. One `quire-perf --workloads tail-write` per sandbox writes RATE
# records/s of 1 KiB over STREAMS (2) streams for SECONDS (after a 10 s warm-up); both start
# together. Every SAMPLE_SECS (5) seconds the script records, per sandbox, the bytes of the
# bookies' ledger directories (entry logs, index, tombstones) and of their journal directories
# (allocated KiB, `du -sk`), plus the 1-minute load average.
#
# Output in OUT_DIR (default perf/results/retention-soak-<date>): disk.csv (the samples),
# disk.png (disk use over time, gnuplot), gc.json / nogc.json (quire-perf reports),
# summary.txt (the verdicts: ledger-directory bytes in the second half of the run against
# STREAMS × RETENTION_BYTES × Qw (3) × 1.5, and the gc run's tail-write p99 against the nogc
# run's, target within 25 %). Exit status 0 when both targets are met, 1 otherwise, 2 on a setup
# error.
#
# Needs release builds: cargo build --release -p quire -p quire-perf; and gnuplot.
set -euo pipefail

SECONDS_RUN=${1:-600}
RATE=${2:-500}
STREAMS=${STREAMS:-2}
RETENTION_BYTES=${RETENTION_BYTES:-16777216}
GC_SECS=${GC_SECS:-10}
SAMPLE_SECS=${SAMPLE_SECS:-5}
BIN=${BIN:-./target/release}
DATA_ROOT=${DATA_ROOT:-/var/tmp/quire-retention-soak}
OUT_DIR=${OUT_DIR:-perf/results/retention-soak-$(date -u +%Y%m%d)}
WARMUP=10
QW=3

[ -x "$BIN/quire" ] && [ -x "$BIN/quire-perf" ] || { echo "build first: $BIN/quire and $BIN/quire-perf" >&2; exit 2; }
command -v gnuplot >/dev/null || { echo "gnuplot is needed for the plot" >&2; exit 2; }
mkdir -p "$OUT_DIR"
rm -rf "$DATA_ROOT"
mkdir -p "$DATA_ROOT"

pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$DATA_ROOT"
}
trap cleanup EXIT

COMMON=(--segment-size-bytes 2097152 --entry-size-bytes 65536
        --journal-file-size-bytes 16777216 --entry-log-size-bytes 4194304
        --retention-size-bytes "$RETENTION_BYTES")

# start_sandbox NAME FLAGS...: starts it, records its pid, sets proxy_addr to its address.
start_sandbox() {
    local name=$1; shift
    "$BIN/quire" sandbox --data-dir "$DATA_ROOT/$name" --listen 127.0.0.1:0 "${COMMON[@]}" "$@" \
        > "$DATA_ROOT/$name.log" 2>&1 &
    pids+=($!)
    local proxy=""
    for _ in $(seq 1 300); do
        proxy=$(grep -o 'proxy listening on [0-9.:]*' "$DATA_ROOT/$name.log" | awk '{print $4}' || true)
        [ -n "$proxy" ] && break
        sleep 0.1
    done
    [ -n "$proxy" ] || { echo "sandbox $name did not start:" >&2; cat "$DATA_ROOT/$name.log" >&2; exit 2; }
    proxy_addr=$proxy
}

start_sandbox gc --gc-interval-secs "$GC_SECS" \
    --minor-compaction-interval-secs 30 --major-compaction-interval-secs 120
gc_proxy=$proxy_addr
start_sandbox nogc --gc-interval-secs 0
nogc_proxy=$proxy_addr
echo "gc sandbox on $gc_proxy (pid ${pids[0]}), nogc sandbox on $nogc_proxy (pid ${pids[1]})"

# KiB allocated under the bookies' ledger or journal directories of sandbox $1.
kib() { du -sk "$DATA_ROOT/$1"/bookie-*/"$2" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }

echo "t_s,gc_ledger_kib,gc_journal_kib,nogc_ledger_kib,nogc_journal_kib,load1" > "$OUT_DIR/disk.csv"
start=$(date +%s)
PERF=(--workloads tail-write --rate "$RATE" --streams "$STREAMS" --record-bytes 1024
      --seconds "$SECONDS_RUN" --warmup-seconds "$WARMUP" --quiet)
"$BIN/quire-perf" --proxy "$gc_proxy" "${PERF[@]}" --stream-prefix soak-gc \
    --json "$OUT_DIR/gc.json" --plot "$DATA_ROOT/gc.svg" > "$OUT_DIR/gc-perf.txt" 2>&1 &
gc_perf=$!
"$BIN/quire-perf" --proxy "$nogc_proxy" "${PERF[@]}" --stream-prefix soak-nogc \
    --json "$OUT_DIR/nogc.json" --plot "$DATA_ROOT/nogc.svg" > "$OUT_DIR/nogc-perf.txt" 2>&1 &
nogc_perf=$!
while kill -0 "$gc_perf" 2>/dev/null || kill -0 "$nogc_perf" 2>/dev/null; do
    echo "$(( $(date +%s) - start )),$(kib gc ledgers),$(kib gc journal),$(kib nogc ledgers),$(kib nogc journal),$(cut -d' ' -f1 /proc/loadavg)" >> "$OUT_DIR/disk.csv"
    sleep "$SAMPLE_SECS"
done
wait "$gc_perf" || true
wait "$nogc_perf" || true
# A few more samples: GC catching up after the writes stop.
for _ in 1 2 3 4 5 6; do
    sleep "$SAMPLE_SECS"
    echo "$(( $(date +%s) - start )),$(kib gc ledgers),$(kib gc journal),$(kib nogc ledgers),$(kib nogc journal),$(cut -d' ' -f1 /proc/loadavg)" >> "$OUT_DIR/disk.csv"
done
grep -h 'garbage collection run' "$DATA_ROOT/gc.log" | tail -3 | sed 's/\x1b\[[0-9;]*m//g' > "$OUT_DIR/gc-last-runs.txt" || true

bound_kib=$(( STREAMS * RETENTION_BYTES * QW * 3 / 2 / 1024 ))
p99() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['results']['tail_write']['latency']['p99_ms'])" "$1"; }
field() { python3 -c "import json,sys; l=json.load(open(sys.argv[1]))['results']['tail_write']['latency']; print(' '.join(f'{k}={l[k]:.2f}' if isinstance(l[k], float) else f'{k}={l[k]}' for k in ('count','p50_ms','p99_ms','p999_ms','max_ms')))" "$1"; }
gc_p99=$(p99 "$OUT_DIR/gc.json")
nogc_p99=$(p99 "$OUT_DIR/nogc.json")
python3 - "$OUT_DIR/disk.csv" "$bound_kib" "$WARMUP" "$SECONDS_RUN" "$gc_p99" "$nogc_p99" > "$OUT_DIR/summary.txt" <<'EOF'
import csv, sys
path, bound, warm, secs, gc_p99, nogc_p99 = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(open(path))]
half = [r for r in rows if warm + secs / 2 <= r["t_s"] <= warm + secs]
mib = lambda k: k / 1024
gc_max = max(r["gc_ledger_kib"] for r in half)
gc_j = max(r["gc_journal_kib"] for r in half)
nogc_end = rows[-1]["nogc_ledger_kib"]
loads = [r["load1"] for r in rows]
ratio = gc_p99 / nogc_p99
print(f"samples: {len(rows)}, second half of the measured run: {len(half)}")
print(f"load average (1 min) during the run: min {min(loads):.1f}, mean {sum(loads)/len(loads):.1f}, max {max(loads):.1f}")
print(f"gc: ledger dirs max in the second half {mib(gc_max):.1f} MiB (bound {mib(bound):.1f} MiB), journals max {mib(gc_j):.1f} MiB, at the end {mib(rows[-1]['gc_ledger_kib']):.1f} MiB")
print(f"nogc: ledger dirs at the end {mib(nogc_end):.1f} MiB, journals at the end {mib(rows[-1]['nogc_journal_kib']):.1f} MiB")
print(f"level-off target (gc ledger dirs <= streams x R x Qw x 1.5): {'MET' if gc_max <= bound else 'MISSED'}")
print(f"tail-write p99: gc {gc_p99:.2f} ms, nogc {nogc_p99:.2f} ms, ratio {ratio:.3f}: {'MET' if ratio <= 1.25 else 'MISSED'} (target <= 1.25)")
EOF
{
    echo "gc   tail-write: $(field "$OUT_DIR/gc.json")"
    echo "nogc tail-write: $(field "$OUT_DIR/nogc.json")"
} >> "$OUT_DIR/summary.txt"

gnuplot <<EOF
set terminal pngcairo size 1000,600 noenhanced
set output "$OUT_DIR/disk.png"
set datafile separator ","
set key top left
set title "Retention soak: ${RATE} rec/s x 1 KiB over ${STREAMS} streams, size retention $((RETENTION_BYTES / 1048576)) MiB per stream, Qw 3"
set xlabel "seconds since the writers started"
set ylabel "MiB on disk (du, all 3 bookies)"
set grid
bound = $bound_kib / 1024.0
plot "$OUT_DIR/disk.csv" every ::1 using 1:(\$2/1024) with lines lw 2 title "GC on: ledger dirs", \
     "" every ::1 using 1:(\$3/1024) with lines dt 2 title "GC on: journals", \
     "" every ::1 using 1:(\$4/1024) with lines lw 2 title "GC off: ledger dirs", \
     "" every ::1 using 1:(\$5/1024) with lines dt 2 title "GC off: journals", \
     bound with lines lc rgb "red" dt 3 title "streams x R x Qw x 1.5"
EOF
cat "$OUT_DIR/summary.txt"
grep -q "MISSED" "$OUT_DIR/summary.txt" && exit 1
exit 0
