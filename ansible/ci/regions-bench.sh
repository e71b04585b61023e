#!/usr/bin/env bash
# The benchmarks of the multi-region test bed (issue 30, "How it is checked", third bullet), as
# root: perf/examples/regions_bench.rs run inside the bed's namespaces, at each inter-region
# delay of QUIRE_RB_DELAYS (default "20:2 60:6": round trip and jitter, ms):
#
# 1. Write cost by quorum span, a client in region a (px-a's namespace): per round a ledger of
#    E=Qw=Qa=2 on region a's two bookies ("inside") and one of E=Qw=3 Qa=2 placed region-aware,
#    one bookie per region ("span"), alternated, each written open loop at QUIRE_RB_RATE (200)
#    1 KiB entries/s for QUIRE_RB_SECS (20) s; latency from the scheduled send.
# 2. Remote reader, a client in region c (px-c's namespace) reading the "span" ledgers (closed,
#    written in a): local-first against write-set read order, speculative reads on (50 ms,
#    adaptive) and off; the four in turn per round, QUIRE_RB_READS (300) reads each.
# QUIRE_RB_ROUNDS (3) rounds of each. Every measured ledger is shown by `quire ledger show
# --json` (its bookies), and the figures summarised (median over rounds, same-round ratios;
# `regions-bench.sh summary DIR` prints them again).
#
# The bed comes up (4-6 min) and goes down (by pid, regions-bed.sh down) with the run, also on
# failure; QUIRE_RB_REUSE_BED=1 uses a bed already up at QUIRE_BED_STATE and leaves it up.
# Results: QUIRE_RB_OUT (default perf/results/regions-bench-YYYYMMDD). The example binary:
# QUIRE_RB_BIN, else built (cargo build --release -p quire-perf --example regions_bench).
# Needs what regions-bed.sh needs.
set -eu
cd "$(dirname "$0")/../.."
ROOT=$PWD
BED=$ROOT/ansible/ci/regions-bed.sh
export QUIRE_BED_STATE=${QUIRE_BED_STATE:-/tmp/quire-regions-bench}
DELAYS=${QUIRE_RB_DELAYS:-"20:2 60:6"}
OUT=${QUIRE_RB_OUT:-$ROOT/perf/results/regions-bench-$(date -u +%Y%m%d)}
QUIRE=$ROOT/target/release/quire
START=$(date +%s)
log() { echo "regions-bench: [$(( $(date +%s) - START )) s] $*"; }

summarise() {
    python3 - "$@" << 'PY'
import json, statistics, sys
out, delays = sys.argv[1], sys.argv[2:]
ms = lambda us: f"{us / 1000:.2f}"
def med(xs): return statistics.median(xs)
print("### Write cost by quorum span (client in region a; median over rounds, ms; ratios and differences per round, then the median)\n")
print("| RTT | inside p50 | inside p99 | span p50 | span p99 | span/inside p50 | span/inside p99 | span - inside p50 |")
print("|---|---|---|---|---|---|---|---|")
for d in delays:
    tag = f"rtt-{d.split(':')[0]}ms"
    rows = [json.loads(l) for l in open(f"{out}/write-{tag}.jsonl")]
    by = {arm: [r for r in rows if r["arm"] == arm] for arm in ("inside", "span")}
    rounds = sorted({r["round"] for r in rows})
    # Per round: the span arm's and the inside arm's figure of one key, side by side.
    pair = lambda k, key: tuple(next(r for r in by[arm] if r["round"] == k)[key] for arm in ("span", "inside"))
    r50 = [s / i for s, i in (pair(k, "p50_us") for k in rounds)]
    r99 = [s / i for s, i in (pair(k, "p99_us") for k in rounds)]
    d50 = [s - i for s, i in (pair(k, "p50_us") for k in rounds)]
    i50, i99 = med([r["p50_us"] for r in by["inside"]]), med([r["p99_us"] for r in by["inside"]])
    s50, s99 = med([r["p50_us"] for r in by["span"]]), med([r["p99_us"] for r in by["span"]])
    print(f"| {d.replace(':', ' ± ')} ms | {ms(i50)} | {ms(i99)} | {ms(s50)} | {ms(s99)} | {med(r50):.1f} | {med(r99):.1f} | {ms(med(d50))} |")
print("\n### Remote reader (client in region c, catch-up reads of ledgers written in a; median over rounds, ms)\n")
print("| RTT | order | speculative | p50 | p99 | p99.9 | speculative sent/won (all rounds) | p99 write-set / local-first (same round) |")
print("|---|---|---|---|---|---|---|---|")
for d in delays:
    tag = f"rtt-{d.split(':')[0]}ms"
    rows = [json.loads(l) for l in open(f"{out}/read-{tag}.jsonl")]
    for order in ("local-first", "write-set"):
        for spec in (True, False):
            sel = [r for r in rows if r["order"] == order and r["speculative"] == spec]
            ratio = ""
            if order == "write-set":
                rs = []
                for r in sel:
                    lf = next(x for x in rows if x["order"] == "local-first" and x["speculative"] == spec and x["round"] == r["round"])
                    rs.append(r["p99_us"] / lf["p99_us"])
                ratio = f"{med(rs):.0f}"
            print(f"| {d.replace(':', ' ± ')} ms | {order} | {'on' if spec else 'off'} | {ms(med([r['p50_us'] for r in sel]))} | "
                  f"{ms(med([r['p99_us'] for r in sel]))} | {ms(med([r['p999_us'] for r in sel]))} | "
                  f"{sum(r['speculative_sent'] for r in sel)}/{sum(r['speculative_won'] for r in sel)} | {ratio} |")
PY
}
if [ "${1:-}" = summary ]; then
    # Reprints the tables of a run: regions-bench.sh summary DIR [RTT:JITTER ...]
    shift
    dir=$1
    shift
    # shellcheck disable=SC2086
    summarise "$dir" ${*:-$DELAYS}
    exit 0
fi
[ "$(id -u)" = 0 ] || { echo "regions-bench: must run as root" >&2; exit 1; }
BIN=${QUIRE_RB_BIN:-}
if [ -z "$BIN" ]; then
    cargo build --release -p quire-perf --example regions_bench
    BIN=$ROOT/target/release/examples/regions_bench
fi
[ -x "$BIN" ] || { echo "regions-bench: $BIN not found" >&2; exit 1; }
mkdir -p "$OUT"

cleanup() {
    rc=$?
    set +e
    [ "${QUIRE_RB_REUSE_BED:-0}" = 1 ] || "$BED" down
    [ "$rc" = 0 ] || echo "regions-bench: FAILED (exit $rc); results so far in $OUT" >&2
    exit "$rc"
}
if [ "${QUIRE_RB_REUSE_BED:-0}" = 1 ]; then
    [ -d "$QUIRE_BED_STATE" ] || { echo "regions-bench: no bed at $QUIRE_BED_STATE" >&2; exit 1; }
else
    [ -e "$QUIRE_BED_STATE" ] && { echo "regions-bench: $QUIRE_BED_STATE exists (a bed is up?)" >&2; exit 1; }
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    log "bringing the bed up and deploying"
    "$BED" up
fi
trap cleanup EXIT
eval "$("$BED" env)"
"$QUIRE" bookie list --zookeeper "$QUIRE_BED_ZOOKEEPER" | tee "$OUT/bookies.txt"

for d in $DELAYS; do
    rtt=${d%%:*} jitter=${d##*:}
    tag="rtt-${rtt}ms"
    "$BED" delay "$rtt" "$jitter"
    sleep 2
    { echo "delay $rtt ms +- $jitter ms round trip"; "$BED" rtt; } | tee "$OUT/rtt-$tag.txt"
    echo "write start: $(cat /proc/loadavg)" > "$OUT/loadavg-$tag.txt"
    log "$tag: write cost (region a, inside against span)"
    ip netns exec quirer-px-a env QUIRE_RB_TAG="$tag" QUIRE_RB_REGION=a \
        QUIRE_RB_LEDGERS="$OUT/span-ledgers-$tag.txt" "$BIN" write | tee "$OUT/write-$tag.jsonl"
    echo "read start: $(cat /proc/loadavg)" >> "$OUT/loadavg-$tag.txt"
    log "$tag: remote reader (region c, read order x speculation)"
    ip netns exec quirer-px-c env QUIRE_RB_TAG="$tag" QUIRE_RB_REGION=c \
        QUIRE_RB_LEDGERS="$OUT/span-ledgers-$tag.txt" "$BIN" read | tee "$OUT/read-$tag.jsonl"
    echo "end: $(cat /proc/loadavg)" >> "$OUT/loadavg-$tag.txt"
    # The measured ledgers' bookies, from their metadata.
    for id in $(python3 -c 'import json,sys; print(" ".join(str(json.loads(l)["ledger"]) for l in open(sys.argv[1])))' "$OUT/write-$tag.jsonl"); do
        "$QUIRE" ledger show "$id" --json --zookeeper "$QUIRE_BED_ZOOKEEPER" |
            python3 -c 'import json,sys; m=json.load(sys.stdin)["metadata"]; print(sys.argv[1], "E/Qw/Qa", m["ensemble_size"], m["write_quorum"], m["ack_quorum"], "fragments", [(f["first_entry"], f["bookies"]) for f in m["fragments"]])' "$id"
    done > "$OUT/ledgers-$tag.txt"
done

# shellcheck disable=SC2086
summarise "$OUT" $DELAYS | tee "$OUT/summary.md"
log "done; results in $OUT"
