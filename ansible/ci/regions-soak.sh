#!/usr/bin/env bash
# The fault soak of the multi-region test bed (issue 30, "How it is checked"), as root:
#
# 1. regions-bed.sh up: regions a, b, c (a ZooKeeper voter, two bookies and a proxy each),
#    20 ms +- 2 ms round trips between regions; site.yml deploys the cluster.
# 2. A writer with a tailing reader in region a (the load driver in px-a's namespace, writing
#    through px-a, reading through px-a; both fail over to the other proxies), and a tailing
#    reader in region c (a second driver process in px-c's namespace, reading through px-c
#    first). The load driver is the quire command's integration-test binary
#    (tools/tests/it/proxy_drain_and_rolling_load.rs, deployed_regions_soak), QUIRE_LOAD_BIN.
# 3. Region b cut off entirely (all its links down) for QUIRE_SOAK_FAULT_S (60) seconds, then
#    back; 30 s to settle; region c partitioned from a and b (both directions) for the same
#    time, then healed; 30 s to settle.
# 4. The writer stops; the shared history checker reads the stream back (every acknowledged
#    record exactly once, in order, identical replicas), both tailing readers' views must be
#    that sequence up to the last acknowledgement. For each fault: the longest gap between
#    two acknowledgements from its start to 30 s after its end, which must stay within
#    QUIRE_SOAK_RESUME_BOUND_S (default: the design's bound below, 60 s).
# 5. Every ledger fragment whose ensemble holds an ack quorum (Qa) of bookies inside one
#    region is listed, and any fails the soak: the bed runs region-aware placement with
#    min_regions_for_durability = 2 (inventories/regions/group_vars/all.yml), which rules
#    them out (with random placement they happen).
# The history check holds closed ledgers to BookKeeper's promise after recovery: every entry
# on at least Qa bookies of its write set (not all of it: a bookie cut off misses the entries
# acknowledged without it up to the LAC its writer replaced it at, and only autorecovery
# copies those; see Replicas::AckQuorum in tools/testkit/src/harness/checker.rs). It prints
# how many entries are short of their whole write set.
# Everything is torn down on exit (regions-bed.sh down: by pid and namespace), also on failure.
#
# Needs what regions-bed.sh needs, and the load driver (QUIRE_LOAD_BIN, else found with
# ci/locate-load-bin.sh). Takes 11-19 min (session 23: 4.5-12 min deploy, 3.5 min of faults, ~2.5 min check).
set -eu
cd "$(dirname "$0")/../.."
ROOT=$PWD
BED=$ROOT/ansible/ci/regions-bed.sh
START=$(date +%s)
export QUIRE_BED_STATE=${QUIRE_BED_STATE:-/tmp/quire-regions-soak}
ST=$QUIRE_BED_STATE
FAULT_S=${QUIRE_SOAK_FAULT_S:-60}
SETTLE_S=30
LOGS=${QUIRE_SOAK_LOGS:-/tmp/quire-regions-soak-logs}
# The bound on a write gap the design gives, from the timeouts in play (defaults of
# quire_client::ClientConfig and quire_ledger::ClientConfig). The worst case is a fault that
# takes the stream's owner (the proxy of the region cut off or partitioned) out of the
# writer's reach: its answer cannot cross, so the writer learns nothing until
# - CLIENT_REQUEST_S (30 s), the client's request timeout; by then the owner's ZooKeeper
#   session (10 s in the bed) has expired and its lease is free;
# - PROXY_CONNECT_S (5 s): the failover may first try a proxy it cannot reach (the client's
#   connect timeout; a proxy that exited refuses at once);
# - RECOVERY_STEPS x BOOKIE_REQUEST_S (4 x 5 s): the new owner recovers the ledger, and each
#   step that asks the unreachable region's bookie waits for the ledger client's request
#   timeout (BookKeeper addEntryTimeoutSec/readTimeout): fencing and the forward read wait for
#   every answer, the read of the LAC entry may try it first, the re-add to it fails before
#   its position is replaced;
# - SLACK_S (5 s): ZooKeeper and metadata round trips across the 20 ms delay, the new
#   segment's ledger, a loaded 2-core machine.
# A fault that leaves the owner reachable costs one bookie request timeout and an ensemble
# change (~5-6 s). Seen with random placement (run 4): 55.9 s = 30 + ~5 + ~21.
CLIENT_REQUEST_S=30 PROXY_CONNECT_S=5 BOOKIE_REQUEST_S=5 RECOVERY_STEPS=4 SLACK_S=5
BOUND_S=${QUIRE_SOAK_RESUME_BOUND_S:-$((CLIENT_REQUEST_S + PROXY_CONNECT_S + RECOVERY_STEPS * BOOKIE_REQUEST_S + SLACK_S))}
WRITER_PID=
READER_PID=
log() { echo "regions-soak: [$(( $(date +%s) - START )) s] $*"; }
now_ms() { date +%s%3N; }

[ "$(id -u)" = 0 ] || { echo "regions-soak: must run as root" >&2; exit 1; }
[ -e "$ST" ] && { echo "regions-soak: $ST exists (a bed is up?): '$BED down' with QUIRE_BED_STATE=$ST first" >&2; exit 1; }

cleanup() {
    rc=$?
    set +e
    for p in $WRITER_PID $READER_PID; do
        kill -0 "$p" 2> /dev/null && kill "$p" && wait "$p" 2> /dev/null
    done
    # The logs outlive the bed: the load driver's, the services', the playbook's.
    mkdir -p "$LOGS"
    for f in "$ST"/*.log "$ST"/control/acks "$ST"/hosts/*/var/log/quire/*.log; do
        [ -f "$f" ] || continue
        case $f in "$ST"/hosts/*) cp "$f" "$LOGS/$(echo "${f#"$ST"/hosts/}" | cut -d/ -f1)-$(basename "$f")" ;; *) cp "$f" "$LOGS/" ;; esac
    done
    if [ "$rc" != 0 ]; then
        echo "regions-soak: FAILED (exit $rc); all logs in $LOGS" >&2
        for f in "$ST"/load-*.log "$ST"/hosts/*/var/log/quire/*.log; do
            [ -f "$f" ] || continue
            echo "----- $f (last 20 lines)" >&2
            tail -n 20 "$f" >&2
        done
    fi
    "$BED" down
    log "torn down"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

LOAD_BIN=${QUIRE_LOAD_BIN:-$("$ROOT/ansible/ci/locate-load-bin.sh")}
[ -x "$LOAD_BIN" ] || { echo "regions-soak: load driver binary not found" >&2; exit 1; }

log "bringing the bed up and deploying"
"$BED" up
"$BED" rtt
eval "$("$BED" env)"
A=10.210.1.31:4181 B=10.210.2.31:4181 C=10.210.3.31:4181
CONTROL=$ST/control
mkdir -p "$CONTROL"
export QUIRE_LOAD_CONTROL=$CONTROL QUIRE_LOAD_STREAM=regions-soak-$$ QUIRE_LOAD_ZOOKEEPER=$QUIRE_BED_ZOOKEEPER
export QUIRE_LOAD_ZK_ROOT=/quire QUIRE_LOGHUB_DIR=${QUIRE_LOGHUB_DIR:-$ROOT/tools/testkit/data/loghub}
export QUIRE_LOAD_RATE=${QUIRE_LOAD_RATE:-100}
TEST=(--ignored --exact proxy_drain_and_rolling_load::deployed_regions_soak --nocapture --test-threads 1)

# The tailing readers start at the LAST proxy of their list.
ip netns exec quirer-px-a env QUIRE_LOAD_PROXIES="$A,$B,$C" QUIRE_LOAD_READ_PROXIES="$B,$C,$A" \
    QUIRE_LOAD_REMOTE_READERS=c "$LOAD_BIN" "${TEST[@]}" > "$ST/load-writer.log" 2>&1 &
WRITER_PID=$!
ip netns exec quirer-px-c env QUIRE_LOAD_ROLE=reader QUIRE_LOAD_READER_NAME=c QUIRE_LOAD_PROXIES="$C,$A,$B" \
    QUIRE_LOAD_READ_PROXIES="$A,$B,$C" "$LOAD_BIN" "${TEST[@]}" > "$ST/load-reader-c.log" 2>&1 &
READER_PID=$!
for _ in $(seq 1 1200); do
    [ -e "$CONTROL/ready" ] && break
    kill -0 "$WRITER_PID" 2> /dev/null || { echo "regions-soak: the writer ended early" >&2; exit 1; }
    sleep 0.1
done
[ -e "$CONTROL/ready" ] || { echo "regions-soak: the writer is not writing after 120 s" >&2; exit 1; }
log "writer (region a) and tailing readers (regions a and c) running"
sleep 10

FAULTS=
t0=$(now_ms)
"$BED" cut b
sleep "$FAULT_S"
t1=$(now_ms)
"$BED" heal b
FAULTS="$FAULTS cut-b:$t0:$t1"
log "region b was cut off for $FAULT_S s; settling $SETTLE_S s"
sleep "$SETTLE_S"

t0=$(now_ms)
"$BED" partition c
sleep "$FAULT_S"
t1=$(now_ms)
"$BED" heal c
FAULTS="$FAULTS partition-c:$t0:$t1"
log "region c was partitioned from a and b for $FAULT_S s; settling $SETTLE_S s"
sleep "$SETTLE_S"

touch "$CONTROL/stop"
log "writer stopped; checking the history"
wait "$WRITER_PID" && wrc=0 || wrc=$?
WRITER_PID=
wait "$READER_PID" && rrc=0 || rrc=$?
READER_PID=
grep -E -A1 "regions-soak:|test result|panicked" "$ST/load-writer.log" "$ST/load-reader-c.log" || true

# Writes after each fault: the longest gap between acknowledgements from the fault's start to
# SETTLE_S after its end (how long writes took to resume), and when it ended.
echo "regions-soak: faults (name:start unix ms:end unix ms):$FAULTS"
gaps_rc=0
# shellcheck disable=SC2086
python3 - "$CONTROL/acks" "$SETTLE_S" "$BOUND_S" $FAULTS << 'PY' || gaps_rc=$?
import sys
acks = [int(x) for x in open(sys.argv[1]).read().split()]
settle, bound = int(sys.argv[2]) * 1000, float(sys.argv[3])
bad = []
for fault in sys.argv[4:]:
    name, start, end = fault.split(":")
    start, end = int(start), int(end)
    inside = [a for a in acks if start <= a <= end + settle]
    prev = max([a for a in acks if a < start], default=start)
    gap, gap_end = 0, start
    # The window's end closes an open gap: no acknowledgement after it means writes never
    # resumed within the window.
    resumed = any(a > end for a in acks)
    for a in inside + [end + settle]:
        if a - prev > gap:
            gap, gap_end = a - prev, a
        prev = a
    if not resumed:
        print(f"regions-soak: {name}: writes did not resume within {settle / 1e3:.0f} s of the fault's end")
    during = len([a for a in acks if start <= a <= end])
    print(f"regions-soak: {name}: {during} writes acknowledged during the {(end - start) / 1e3:.0f} s fault; "
          f"longest gap between acknowledgements {gap / 1e3:.2f} s, ending "
          f"{(gap_end - start) / 1e3:.2f} s after the fault began")
    if gap / 1e3 > bound:
        bad.append(name)
if bad:
    sys.exit(f"regions-soak: writes stalled longer than {bound} s after: {', '.join(bad)}")
PY

# Finding: ledgers with an ack quorum inside one region (address 10.210.R.x is region R).
"$ROOT/target/release/quire" ledger list --json --zookeeper "$QUIRE_BED_ZOOKEEPER" > "$ST/ledgers.json"
placement_rc=0
python3 - "$ROOT/target/release/quire" "$QUIRE_BED_ZOOKEEPER" "$ST/ledgers.json" << 'PY' || placement_rc=$?
import json, subprocess, sys
quire, zk, listing = sys.argv[1:]
ids = json.load(open(listing))
region = {"1": "a", "2": "b", "3": "c"}
inside, fragments = [], 0
for lid in ids:
    meta = json.loads(subprocess.check_output([quire, "ledger", "show", str(lid), "--json", "--zookeeper", zk]))["metadata"]
    qa = meta["ack_quorum"]
    for frag in meta["fragments"]:
        fragments += 1
        per = {}
        for b in frag["bookies"]:
            r = region.get(b.split(".")[2], "?")
            per[r] = per.get(r, 0) + 1
        full = [r for r, n in per.items() if n >= qa]
        if full:
            inside.append(f"ledger {lid} from entry {frag['first_entry']}: {frag['bookies']} "
                          f"(Qa {qa} inside region {full[0]})")
print(f"regions-soak: {len(inside)} of {fragments} ledger fragments ({len(ids)} ledgers) had an ack "
      "quorum inside one region (region-aware placement rules it out)")
for line in inside:
    print(f"regions-soak:   {line}")
sys.exit(1 if inside else 0)
PY
# The verdicts come last, so that the figures above are printed either way.
[ "$wrc" = 0 ] || { echo "regions-soak: the writer's history check failed (exit $wrc)" >&2; exit 1; }
[ "$rrc" = 0 ] || { echo "regions-soak: the region c reader failed (exit $rrc)" >&2; exit 1; }
[ "$gaps_rc" = 0 ] || exit 1
[ "$placement_rc" = 0 ] || { echo "regions-soak: a ledger had an ack quorum inside one region" >&2; exit 1; }
log "passed: every acknowledged record once and in order for the writer and both readers; writes resumed within $BOUND_S s"
