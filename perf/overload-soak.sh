#!/usr/bin/env bash
# Overload soak: looks for bookie shards that stop for good under overload (perf/README.md,
# "A shard that waited on its journal writes").
#
# Usage: perf/overload-soak.sh [ROUNDS] [RUNS_PER_ROUND] [RATE]     (defaults 2, 3, 140000)
#
# Each round starts a fresh `quire sandbox` in $DATA_DIR (default /var/tmp/quire-soak; the data
# directory is deleted between rounds, because a 20 s run at 140k records/s leaves about 8 GB of
# entry logs) and runs `quire-perf --workloads tail-write` RUNS_PER_ROUND times at RATE
# records/s. A watcher compares the newest journal modification time of the three bookies every
# second; a bookie whose journal has not moved for 10 s while another's moved in the last 3 s,
# at six checks in a row, counts as stalled (if none moved in the last 3 s, nothing is judged;
# one such check alone happened between two runs, with no add timed out). On a stall it writes
# the kernel stacks of the sandbox's shard and io-wq threads, the block layer's in-flight counts
# and the io_uring fdinfo (overflow list included) to $OUT_DIR/stall-dump.txt and stops. Exit
# status: 0 without a stall, 1 with one, 2 on a setup error.
# Needs release builds: cargo build --release -p quire -p quire-perf.
set -euo pipefail

ROUNDS=${1:-2}
RUNS=${2:-3}
RATE=${3:-140000}
DATA_DIR=${DATA_DIR:-/var/tmp/quire-soak}
OUT_DIR=${OUT_DIR:-/tmp/quire-soak}
BIN=${BIN:-./target/release}
mkdir -p "$OUT_DIR"
[ -x "$BIN/quire" ] && [ -x "$BIN/quire-perf" ] || { echo "build first: $BIN/quire and $BIN/quire-perf" >&2; exit 2; }

sandbox_pid=""
cleanup() {
    [ -n "$sandbox_pid" ] && kill "$sandbox_pid" 2>/dev/null && wait "$sandbox_pid" 2>/dev/null
    rm -rf "$DATA_DIR"
}
trap cleanup EXIT

# Newest journal modification time of bookie $1, in whole seconds since the epoch.
newest_journal() {
    find "$DATA_DIR/bookie-$1/journal" -type f -name '*.qj*' -printf '%T@\n' 2>/dev/null \
        | sort -n | tail -1 | cut -d. -f1
}

# Prints the stalled bookie numbers, or nothing.
stalled_bookies() {
    local now fresh=0 stuck="" b t
    now=$(date +%s)
    for b in 1 2 3; do
        t=$(newest_journal "$b")
        [ -z "$t" ] && continue
        [ $((now - t)) -gt 10 ] && stuck="$stuck $b"
        [ $((now - t)) -lt 3 ] && fresh=1
    done
    # Always succeed: under `set -e` a false test here ended the whole soak with status 1 (and
    # no dump) whenever no journal at all had moved in the last 3 s.
    if [ "$fresh" = 1 ]; then echo "$stuck"; fi
    return 0
}

dump() {
    local t
    {
        echo "stalled bookie(s):$1 at $(date +%T)"
        echo "block layer in flight (reads writes): $(cat /sys/block/*/inflight 2>/dev/null | tr '\n' ' ')"
        for t in /proc/"$sandbox_pid"/task/*; do
            case $(cat "$t/comm") in
                quire-shard*|iou-wrk*)
                    echo "== $(cat "$t/comm") ${t##*/} state $(awk '{print $3}' "$t/stat")"
                    cat "$t/stack" 2>/dev/null;;
            esac
        done
        for t in /proc/"$sandbox_pid"/fd/*; do
            if [[ $(readlink "$t") == *io_uring* ]]; then
                echo "-- io_uring fd ${t##*/}: $(grep -E 'SqHead|SqTail|CqHead|CqTail' "/proc/$sandbox_pid/fdinfo/${t##*/}" | tr '\n' ' ')"
                sed -n '/PollList/,$p' "/proc/$sandbox_pid/fdinfo/${t##*/}"
            fi
        done
    } > "$OUT_DIR/stall-dump.txt"
}

for round in $(seq 1 "$ROUNDS"); do
    rm -rf "$DATA_DIR"
    "$BIN/quire" sandbox --data-dir "$DATA_DIR" --listen 127.0.0.1:0 > "$OUT_DIR/sandbox-$round.log" 2>&1 &
    sandbox_pid=$!
    proxy=""
    for _ in $(seq 1 100); do
        proxy=$(grep -o 'proxy listening on [0-9.:]*' "$OUT_DIR/sandbox-$round.log" | awk '{print $4}' || true)
        [ -n "$proxy" ] && break
        sleep 0.1
    done
    [ -n "$proxy" ] || { echo "the sandbox did not start; see $OUT_DIR/sandbox-$round.log" >&2; exit 2; }
    for run in $(seq 1 "$RUNS"); do
        echo "round $round run $run: tail-write at $RATE records/s"
        "$BIN/quire-perf" --proxy "$proxy" --data-dir "$DATA_DIR" --workloads tail-write \
            --rate "$RATE" --streams 4 --batch 64 --seconds 20 --quiet \
            --json "$OUT_DIR/run.json" --plot "$OUT_DIR/run.svg" > "$OUT_DIR/perf.log" 2>&1 &
        perf_pid=$!
        suspect=0
        while kill -0 "$perf_pid" 2>/dev/null; do
            stuck=$(stalled_bookies)
            # A stall must last 5 more checks: in the quiet gap between two runs a bookie still
            # pre-creating a journal looks fresh while the others look stale for a moment.
            if [ -n "$stuck" ]; then suspect=$((suspect + 1)); else suspect=0; fi
            if [ "$suspect" -ge 6 ]; then
                dump "$stuck"
                kill "$perf_pid" 2>/dev/null || true
                echo "STALL of bookie(s)$stuck; dump in $OUT_DIR/stall-dump.txt"
                exit 1
            fi
            sleep 1
        done
        wait "$perf_pid" || true
        grep -E '^  tail-write ' "$OUT_DIR/perf.log" || true
    done
    kill "$sandbox_pid" 2>/dev/null && wait "$sandbox_pid" 2>/dev/null || true
    sandbox_pid=""
    grep -hE 'slow journal' "$OUT_DIR/sandbox-$round.log" | sed 's/\x1b\[[0-9;]*m//g' || true
    echo "round $round: $(grep -c 'did not answer within' "$OUT_DIR/sandbox-$round.log" || true) adds timed out by the ledger client"
done
echo "no stall in $ROUNDS x $RUNS runs"
