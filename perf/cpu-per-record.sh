#!/usr/bin/env bash
# CPU per acknowledged record of `quire sandbox` at a fixed open-loop rate (perf/README.md,
# "CPU per record").
#
# Usage: perf/cpu-per-record.sh [-n ROUNDS] [-r RATE] [-s SECONDS] [-w WARMUP] [-P] [-t]
#                               BIN [BIN ...]
#
# Each BIN is a `quire` binary, optionally followed (in the same quoted word) by extra
# `quire sandbox` flags, e.g. "/var/tmp/quire-base" "./target/release/quire --cpu-set 0,1";
# "env VAR=VALUE /path/quire" runs it with an environment variable set; "floor /path/floor"
# runs ../shared/bench's floor server instead (proxy on 127.0.0.1:$FLOOR_PORT, default 14391),
# the reference for what the topology alone costs.
# A round runs every BIN once, in the order given (A B A B ... over the rounds), so that a
# baseline is measured in the same window as the change on this shared, noisy machine.
# Each run: a fresh sandbox in $DATA_DIR (deleted before and after), 1 s to settle, then
# `quire-perf --workloads tail-write --rate RATE --seconds SECONDS --warmup-seconds WARMUP`
# (1 KiB records, one stream, 4 connections: the harness defaults). The sandbox's CPU time
# (utime + stime of /proc/PID/stat, which includes its exited threads) is read just before
# quire-perf starts and just after it ends, and divided by the records quire-perf reports
# acknowledged ("completed": warm-up included, the few marker writes not counted).
# Per thread, /proc/PID/task/*/stat is read at the same two moments and summed by thread name
# (digits of io-wq worker names dropped); -t prints that table for every run.
# -P records `perf record -g` of the sandbox for the measured span into $OUT_DIR.
#
# Output: one line per run, then per BIN the median CPU ms per record, median open-loop p99,
# and both as ratios to the first BIN's medians. Raw figures go to $OUT_DIR/runs.tsv.
# Env: DATA_DIR (/var/tmp/cpu-sb), OUT_DIR (/tmp/cpu-per-record), PERF_BIN
# (./target/release/quire-perf). Exit status 0, or 2 on a setup or run failure.
set -euo pipefail

ROUNDS=3
RATE=1000
SECONDS_RUN=20
WARMUP=3
PERF_RECORD=0
THREADS=0
while getopts "n:r:s:w:Pt" opt; do
    case $opt in
        n) ROUNDS=$OPTARG ;;
        r) RATE=$OPTARG ;;
        s) SECONDS_RUN=$OPTARG ;;
        w) WARMUP=$OPTARG ;;
        P) PERF_RECORD=1 ;;
        t) THREADS=1 ;;
        *) sed -n '2,26p' "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,26p' "$0" >&2; exit 2; }
BINS=("$@")
DATA_DIR=${DATA_DIR:-/var/tmp/cpu-sb}
OUT_DIR=${OUT_DIR:-/tmp/cpu-per-record}
PERF_BIN=${PERF_BIN:-./target/release/quire-perf}
FLOOR_PORT=${FLOOR_PORT:-14391}
mkdir -p "$OUT_DIR"
[ -x "$PERF_BIN" ] || { echo "no $PERF_BIN: cargo build --release -p quire-perf" >&2; exit 2; }
for spec in "${BINS[@]}"; do
    read -r bin rest <<< "$spec"
    [ "$bin" = floor ] && read -r bin _ <<< "$rest"
    command -v "$bin" > /dev/null || { echo "not an executable: $bin" >&2; exit 2; }
done

sandbox_pid=""
perf_pid=""
cleanup() {
    if [ -n "$perf_pid" ]; then kill -INT "$perf_pid" 2>/dev/null || true; wait "$perf_pid" 2>/dev/null || true; fi
    if [ -n "$sandbox_pid" ]; then kill -INT "$sandbox_pid" 2>/dev/null || true; wait "$sandbox_pid" 2>/dev/null || true; fi
    rm -rf "$DATA_DIR"
}
trap cleanup EXIT

# Writes "tid name utime stime" (ticks) for every thread of $1, and a "total" line for the
# whole process, to $2. The name is taken between the first "(" and the last ")" of stat.
snapshot() {
    python3 - "$1" "$2" <<'EOF'
import os, re, sys
pid, out = sys.argv[1], sys.argv[2]
def fields(path):
    s = open(path).read()
    name = s[s.index("(") + 1 : s.rindex(")")]
    rest = s[s.rindex(")") + 2 :].split()
    # utime, stime, minflt: fields 14, 15 and 10 of stat
    return name, int(rest[11]), int(rest[12]), int(rest[7])
lines = []
_, u, s, f = fields(f"/proc/{pid}/stat")
lines.append(f"total\tprocess\t{u}\t{s}\t{f}")
for tid in os.listdir(f"/proc/{pid}/task"):
    try:
        name, u, s, f = fields(f"/proc/{pid}/task/{tid}/stat")
    except (FileNotFoundError, ProcessLookupError):
        continue
    lines.append(f"{tid}\t{name}\t{u}\t{s}\t{f}")
open(out, "w").write("\n".join(lines) + "\n")
EOF
}

# Prints "cpu_ms_per_record user_s sys_s records p50_ms p99_ms p999_ms errors" for a run and,
# with THREADS=1, the per-thread-name table on stderr.
evaluate() {
    python3 - "$1" "$2" "$3" "$THREADS" <<'EOF'
import json, os, re, sys
before, after, report, threads = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
hz = os.sysconf("SC_CLK_TCK")
def load(path):
    d = {}
    for line in open(path):
        tid, name, u, s, f = line.rstrip("\n").split("\t")
        d[tid] = (name, int(u), int(s), int(f))
    return d
b, a = load(before), load(after)
tw = json.load(open(report))["results"]["tail_write"]
records = tw["completed"]
du = (a["total"][1] - b["total"][1]) / hz
ds = (a["total"][2] - b["total"][2]) / hz
faults = (a["total"][3] - b["total"][3]) / max(records, 1)
lat = tw["latency"]
print(f"{(du + ds) * 1000 / max(records, 1):.4f} {du:.2f} {ds:.2f} {records} "
      f"{lat['p50_ms']:.3f} {lat['p99_ms']:.3f} {lat['p999_ms']:.3f} {tw['errors']} {faults:.2f}")
if threads:
    by = {}
    for tid, (name, u, s, _) in a.items():
        if tid == "total":
            continue
        _, u0, s0, _ = b.get(tid, (name, 0, 0, 0))
        key = re.sub(r"-\d+$", "", name) if name.startswith("iou-wrk") else name
        pu, ps = by.get(key, (0, 0))
        by[key] = (pu + u - u0, ps + s - s0)
    for key, (u, s) in sorted(by.items(), key=lambda kv: -(kv[1][0] + kv[1][1])):
        if u + s:
            print(f"    {key:<18} user {u / hz:6.2f} s  sys {s / hz:6.2f} s  "
                  f"= {(u + s) * 1000 / hz / max(records, 1):.4f} ms/record", file=sys.stderr)
EOF
}

printf 'round\tbin\tspec\tcpu_ms_per_record\tuser_s\tsys_s\trecords\tp50_ms\tp99_ms\tp999_ms\terrors\tminor_faults_per_record\n' > "$OUT_DIR/runs.tsv"
for round in $(seq 1 "$ROUNDS"); do
    for k in "${!BINS[@]}"; do
        spec=${BINS[$k]}
        read -r -a words <<< "$spec"
        # The command is everything up to the quire binary ("env VAR=VALUE ..." included);
        # the sandbox flags follow it.
        n=1
        if [ "${words[0]}" = env ]; then
            while [[ ${words[$n]} == *=* ]]; do n=$((n + 1)); done
            n=$((n + 1))
        fi
        tag="$round-$k"
        rm -rf "$DATA_DIR"
        proxy=""
        if [ "${words[0]}" = floor ]; then
            # ../shared/bench's floor: the sandbox's topology with no other logic; it listens
            # once its journals are zero-filled.
            mkdir -p "$DATA_DIR"
            "${words[1]}" --data-dir "$DATA_DIR/floor" --listen "127.0.0.1:$FLOOR_PORT" \
                > "$OUT_DIR/sandbox-$tag.log" 2>&1 &
            sandbox_pid=$!
            for _ in $(seq 1 600); do
                if (exec 3<> "/dev/tcp/127.0.0.1/$FLOOR_PORT") 2> /dev/null; then
                    proxy="127.0.0.1:$FLOOR_PORT"
                    break
                fi
                kill -0 "$sandbox_pid" 2>/dev/null || break
                sleep 0.1
            done
        else
            "${words[@]:0:n}" sandbox --data-dir "$DATA_DIR" --listen 127.0.0.1:0 "${words[@]:n}" \
                > "$OUT_DIR/sandbox-$tag.log" 2>&1 &
            sandbox_pid=$!
        fi
        for _ in $(seq 1 200); do
            [ -n "$proxy" ] && break
            proxy=$(grep -o 'proxy listening on [0-9.:]*' "$OUT_DIR/sandbox-$tag.log" | awk '{print $4}' || true)
            [ -n "$proxy" ] && break
            kill -0 "$sandbox_pid" 2>/dev/null || break
            sleep 0.1
        done
        [ -n "$proxy" ] || { echo "sandbox $spec did not start:" >&2; cat "$OUT_DIR/sandbox-$tag.log" >&2; exit 2; }
        sleep 1
        if [ "$PERF_RECORD" = 1 ]; then
            perf record -g -p "$sandbox_pid" -o "$OUT_DIR/perf-$tag.data" > "$OUT_DIR/perf-$tag.log" 2>&1 &
            perf_pid=$!
            sleep 0.5
        fi
        snapshot "$sandbox_pid" "$OUT_DIR/before-$tag.tsv"
        if ! "$PERF_BIN" --proxy "$proxy" --workloads tail-write --rate "$RATE" \
                --seconds "$SECONDS_RUN" --warmup-seconds "$WARMUP" --quiet \
                --json "$OUT_DIR/report-$tag.json" --plot "$OUT_DIR/plot-$tag.svg" \
                > "$OUT_DIR/perf-$tag.out" 2>&1; then
            # Exit status 1 is an SLO verdict, not a harness failure.
            [ -s "$OUT_DIR/report-$tag.json" ] || { echo "quire-perf failed:" >&2; cat "$OUT_DIR/perf-$tag.out" >&2; exit 2; }
        fi
        snapshot "$sandbox_pid" "$OUT_DIR/after-$tag.tsv"
        if [ -n "$perf_pid" ]; then
            kill -INT "$perf_pid"; wait "$perf_pid" || true; perf_pid=""
        fi
        kill -INT "$sandbox_pid"
        wait "$sandbox_pid" || true
        sandbox_pid=""
        evaluate "$OUT_DIR/before-$tag.tsv" "$OUT_DIR/after-$tag.tsv" "$OUT_DIR/report-$tag.json" \
            > "$OUT_DIR/figures-$tag.txt" 2> "$OUT_DIR/threads-$tag.txt"
        read -r cpu us ss n p50 p99 p999 errs faults < "$OUT_DIR/figures-$tag.txt"
        printf 'round %s  bin %s  %s ms CPU/record  (user %s s, sys %s s, %s records, %s minor faults/record)  p50 %s  p99 %s  p99.9 %s ms  errors %s  [%s]\n' \
            "$round" "$k" "$cpu" "$us" "$ss" "$n" "$faults" "$p50" "$p99" "$p999" "$errs" "$spec"
        [ "$THREADS" = 1 ] && cat "$OUT_DIR/threads-$tag.txt"
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$k" "$spec" "$cpu" "$us" "$ss" "$n" "$p50" "$p99" "$p999" "$errs" "$faults" >> "$OUT_DIR/runs.tsv"
    done
done
rm -rf "$DATA_DIR"

python3 - "$OUT_DIR/runs.tsv" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
bins = sorted({int(r["bin"]) for r in rows})
med = {}
for k in bins:
    mine = [r for r in rows if int(r["bin"]) == k]
    cpu = statistics.median(float(r["cpu_ms_per_record"]) for r in mine)
    p99 = statistics.median(float(r["p99_ms"]) for r in mine)
    p50 = statistics.median(float(r["p50_ms"]) for r in mine)
    med[k] = (cpu, p99, p50, mine[0]["spec"])
c0, q0, _, _ = med[bins[0]]
print("median over", len(rows) // len(bins), "rounds:")
for k in bins:
    cpu, p99, p50, spec = med[k]
    print(f"  bin {k}: {cpu:.4f} ms CPU/record ({cpu / c0:.3f} x bin 0)  p99 {p99:.3f} ms "
          f"({p99 / q0:.3f} x bin 0)  p50 {p50:.3f} ms  [{spec}]")
EOF
