#!/usr/bin/env bash
# The CI deployment test of ansible/ (issue 10): as root, on one machine.
#
# 1. Builds throw-away hosts: one network namespace per host (zk1, bk1-3, px1-2), each with
#    its own UTS namespace (hostname), its own sshd and its own address on a bridge, and no
#    default route (nothing can leave the machine). Every host gets its own directory
#    (the namespaces share the filesystem).
# 2. Lints the playbooks, deploys with `ansible-playbook site.yml` over SSH, and runs site.yml
#    again on one host of each role (zk1 with monitoring, bk1, px1), which must report
#    changed=0 on each.
# 3. Checks the security that is on as in production: a client without TLS is refused (TLS
#    with client certificates), a client without a token is refused (UNAUTHENTICATED), the
#    read-only token the CI inventory declares cannot write (REQUEST_DENIED), and a ZooKeeper
#    session without the cluster's digest identity gets NoAuth when it tries to change Quire's
#    znodes (zkCli of Debian's zookeeper package) while one with it can read them. Then writes
#    every loghub sample through proxy px1 with `quire write` and reads it back through px2
#    with `quire read` (admin token); the output must equal the file.
# 4. Starts the load driver (tools/tests/it/proxy_drain_and_rolling_load.rs,
#    deployed_cluster_under_rolling_restart: a writer and a tailing reader over both proxies),
#    runs rolling-restart.yml under it, then upgrade.yml to a "new build" (the binary with a
#    marker appended; each bookie and proxy must be a new process running it, the old one kept
#    as quire.prev), then lets the driver check with the shared history
#    checker that every acknowledged record is there exactly once and in order, and print the
#    writer's p99 and longest gap during the restart.
# 5. Monitoring (site.yml's monitoring role: Prometheus on zk1's host): through Prometheus's
#    HTTP API, every bookie and proxy is scraped (up); a bookie stopped fires QuireBookieDown
#    and started again resolves it. Then add-bookie.yml adds the spare bk4 (registered and
#    scraped), and decommission-bookie.yml retires it (unregistered, no longer scraped).
# 6. Runs stop.yml and checks nothing the playbooks started is left.
# Everything started is stopped by pid and every namespace and the bridge are removed, also
# on failure (EXIT trap).
#
# Needs: ansible-playbook, ansible-lint, sshd (openssh-server), ip (iproute2), unshare
# (util-linux), java + Debian's zookeeper package (zkCli.sh); .ci/run installs them. The quire
# binary and test binaries must be built (scripts/test does); unless QUIRE_LOAD_BIN names the
# load driver, this script runs the workspace build command again (then a no-op) to find it.
set -eu
cd "$(dirname "$0")/../.."
ROOT=$PWD
ANSIBLE_DIR=$ROOT/ansible
START=$(date +%s)
# shellcheck source=lib/nshosts.sh
. "$ANSIBLE_DIR/ci/lib/nshosts.sh"

[ "$(id -u)" = 0 ] || { echo "deploy-test: must run as root (namespaces, sshd)" >&2; exit 1; }
ZKCLI=/usr/share/zookeeper/bin/zkCli.sh
for tool in ansible-playbook ansible-lint ip unshare ssh-keygen /usr/sbin/sshd python3 "$ZKCLI"; do
    command -v "$tool" > /dev/null || { echo "deploy-test: $tool not found (see .ci/run)" >&2; exit 1; }
done

# State on the ext4 disk (O_DIRECT journals), never tmpfs.
ST=$(mktemp -d "${TMPDIR:-/tmp}/quire-deploy.XXXXXX")
export QUIRE_CI_STATE=$ST QUIRE_CI_HOSTS_ROOT=$ST/hosts
mkdir -p "$ST/keys" "$ST/hosts" "$ST/control" /run/sshd
BR=quiredbr0
NET=10.200.0
HOSTS="zk1:11 bk1:21 bk2:22 bk3:23 bk4:24 px1:31 px2:32"
ns() { echo "quire-$1"; }
LOAD_PID=

log() { echo "deploy-test: [$(( $(date +%s) - START )) s] $*"; }

cleanup() {
    rc=$?
    set +e
    if [ -n "$LOAD_PID" ] && kill -0 "$LOAD_PID" 2> /dev/null; then
        kill "$LOAD_PID"; wait "$LOAD_PID" 2> /dev/null
    fi
    teardown=
    for h in $HOSTS; do teardown="$teardown ${h%%:*}:$(ns "${h%%:*}")"; done
    nshosts_teardown "$teardown"
    ip link show "$BR" > /dev/null 2>&1 && ip link del "$BR"
    if [ "$rc" != 0 ]; then
        echo "deploy-test: FAILED (exit $rc); logs of the hosts:" >&2
        for f in "$ST"/hosts/*/var/log/quire/*.log "$ST"/load.log; do
            [ -f "$f" ] || continue
            echo "----- $f (last 30 lines)" >&2
            tail -n 30 "$f" >&2
        done
    fi
    rm -rf "$ST"
    log "cleaned up (namespaces, bridge, processes, $ST)"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Leftovers of an earlier run would make the addresses ambiguous.
for h in $HOSTS; do
    if nshosts_exists "$(ns "${h%%:*}")"; then
        echo "deploy-test: namespace $(ns "${h%%:*}") exists already (an earlier run?); remove it first" >&2
        HOSTS= BR=none-of-ours  # leave what is not ours alone
        exit 1
    fi
done
if ip link show "$BR" > /dev/null 2>&1; then
    echo "deploy-test: bridge $BR exists already; remove it first" >&2
    BR=none-of-ours
    HOSTS=
    exit 1
fi

# The binaries: the load driver is the quire command's test binary (ci/locate-load-bin.sh asks
# the workspace build command of scripts/test, a no-op once that has run; .ci/run passes it in
# QUIRE_LOAD_BIN).
log "locating the quire binary and the load driver"
LOAD_BIN=${QUIRE_LOAD_BIN:-$("$ANSIBLE_DIR/ci/locate-load-bin.sh")}
[ -x "$LOAD_BIN" ] || { echo "deploy-test: load driver binary not found" >&2; exit 1; }
export QUIRE_BIN=${QUIRE_BIN:-$ROOT/target/release/quire}
[ -x "$QUIRE_BIN" ] || { echo "deploy-test: $QUIRE_BIN not built" >&2; exit 1; }

# Hosts: keys, one sshd config, the bridge, a namespace + veth + sshd per host
# (ci/lib/nshosts.sh).
nshosts_init "$ST"
nshosts_bridge "$BR" "$NET.1/24"
addrs=
for h in $HOSTS; do
    n=${h%%:*}
    nshosts_add "$(ns "$n")" "$n" "$NET.${h##*:}/24" "$BR" "vq-$n"
    addrs="$addrs $NET.${h##*:}"
done
# shellcheck disable=SC2086
nshosts_wait_ssh $addrs
log "7 hosts up (namespaces with sshd on $NET.0/24)"

cd "$ANSIBLE_DIR"
export ANSIBLE_CONFIG=$ANSIBLE_DIR/ansible.cfg
# ansible-lint runs ansible-playbook --syntax-check on every playbook itself.
t0=$(date +%s)
ANSIBLE_LINT_NODEPS=1 ansible-lint --offline -q
log "ansible-lint (offline, profile production) passed in $(( $(date +%s) - t0 )) s"

# LOG HOSTS: the PLAY RECAP of LOG names exactly HOSTS (comma-separated), each with changed=0
# and failed=0.
recap_unchanged() {
    python3 - "$1" "$2" << 'PY'
import re, sys
text = open(sys.argv[1]).read().split("PLAY RECAP", 1)[-1]
rows = re.findall(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", text, re.M)
bad = [r for r in rows if r[2] != "0" or r[3] != "0" or r[4] != "0"]
if sorted(r[0] for r in rows) != sorted(sys.argv[2].split(",")):
    print("PLAY RECAP hosts:", [r[0] for r in rows], "expected:", sys.argv[2], file=sys.stderr)
    sys.exit(1)
if not rows or bad:
    print("not idempotent or failed:", bad or "no recap", file=sys.stderr)
    sys.exit(1)
print(f"{len(rows)} hosts, changed=0 on each")
PY
}

t0=$(date +%s)
ansible-playbook -i inventories/ci site.yml > "$ST/site-1.log" || { tail -n 60 "$ST/site-1.log"; exit 1; }
grep -A10 "PLAY RECAP" "$ST/site-1.log"
log "site.yml deployed the cluster in $(( $(date +%s) - t0 )) s"
# The idempotency run on one host of each role (zk1 also holds monitoring; every play and
# task of site.yml runs, on 3 hosts instead of 6: the other hosts run the same tasks with
# other variables). It must change nothing. One ansible-playbook per host, all three at once:
# limited to one host, each runs only the plays of that host's groups, and one run over the
# three ran those plays one after the other (187 s in CI beside the tests, against 167 s for
# the first deployment of all six hosts). The controller's tasks find their files made and
# write nothing, so the three do not race on them.
t0=$(date +%s)
idem_hosts=(zk1 bk1 px1)
idem_pids=()
for h in "${idem_hosts[@]}"; do
    ansible-playbook -i inventories/ci site.yml --limit "$h" > "$ST/site-2-$h.log" 2>&1 &
    idem_pids+=("$!")
done
idem_failed=0
for i in "${!idem_hosts[@]}"; do
    wait "${idem_pids[$i]}" && continue
    tail -n 60 "$ST/site-2-${idem_hosts[$i]}.log"
    idem_failed=1
done
[ "$idem_failed" = 0 ] || exit 1
for h in "${idem_hosts[@]}"; do
    grep -B3 -A12 "changed:" "$ST/site-2-$h.log" | head -40 || true
    recap_unchanged "$ST/site-2-$h.log" "$h"
done
log "second site.yml (zk1, bk1, px1) changed nothing ($(( $(date +%s) - t0 )) s)"

# The cluster speaks TLS with client certificates required on every port (quire_tls, on as in
# production): the clients below use the CA and certificate site.yml made on this controller,
# through the variables the quire command reads. A client without them is refused.
TLS=$ST/tls
[ -s "$TLS/node.key" ] || { echo "deploy-test: site.yml made no TLS files in $TLS" >&2; exit 1; }
if "$QUIRE_BIN" stream list --proxy "$NET.31:4181" > /dev/null 2> "$ST/plain.err"; then
    echo "deploy-test: a plaintext client was served by the TLS proxy" >&2; exit 1
fi
grep -q "requires TLS" "$ST/plain.err" || { cat "$ST/plain.err"; echo "deploy-test: unexpected refusal" >&2; exit 1; }
export QUIRE_TLS_CA_FILE=$TLS/ca.pem QUIRE_TLS_CERT_FILE=$TLS/node.pem QUIRE_TLS_KEY_FILE=$TLS/node.key
export QUIRE_BOOKIE_TLS_CA_FILE=$TLS/ca.pem QUIRE_BOOKIE_TLS_CERT_FILE=$TLS/node.pem \
    QUIRE_BOOKIE_TLS_KEY_FILE=$TLS/node.key
log "TLS on: a plaintext client was refused"

# Client tokens (quire_auth_tokens): site.yml made the admin token and the inventory's
# read-only one on this controller; the proxies hold only their digests. A client without a
# token is refused at the handshake; the read-only token reads but cannot write.
SEC=$ST/secrets
for f in zk-auth token-admin token-reader; do
    [ -s "$SEC/$f" ] || { echo "deploy-test: site.yml made no $SEC/$f" >&2; exit 1; }
    [ "$(stat -c %a "$SEC/$f")" = 600 ] || { echo "deploy-test: $SEC/$f is not mode 0600" >&2; exit 1; }
done
if env -u QUIRE_TOKEN "$QUIRE_BIN" stream list --proxy "$NET.31:4181" > /dev/null 2> "$ST/notoken.err"; then
    echo "deploy-test: a client without a token was served" >&2; exit 1
fi
grep -q UNAUTHENTICATED "$ST/notoken.err" || { cat "$ST/notoken.err"; echo "deploy-test: unexpected refusal" >&2; exit 1; }
export QUIRE_TOKEN
QUIRE_TOKEN=$(cat "$SEC/token-admin")
echo "one line" | "$QUIRE_BIN" write deploy-token-check --proxy "$NET.31:4181" > /dev/null
if echo "denied line" | QUIRE_TOKEN=$(cat "$SEC/token-reader") "$QUIRE_BIN" write deploy-token-check \
    --proxy "$NET.32:4181" > /dev/null 2> "$ST/reader.err"; then
    echo "deploy-test: the read-only token could write" >&2; exit 1
fi
grep -q REQUEST_DENIED "$ST/reader.err" || { cat "$ST/reader.err"; echo "deploy-test: unexpected refusal" >&2; exit 1; }
[ "$(QUIRE_TOKEN=$(cat "$SEC/token-reader") "$QUIRE_BIN" read deploy-token-check --proxy "$NET.32:4181")" = "one line" ] \
    || { echo "deploy-test: the read-only token could not read back what the admin token wrote" >&2; exit 1; }
log "tokens on: a client without one was refused, the read-only token read but could not write"

# ZooKeeper ACLs (quire_zk_acl): every znode under /quire is the digest identity's only. A
# session without it may not create, change or delete (zkCli prints NoAuth as "Insufficient
# permission"); one with it reads the layout; the admin command needs the file too.
printf 'create /quire/deploy-test-noauth x\nset /quire/LAYOUT x\ndelete /quire/INSTANCEID\n' \
    | "$ZKCLI" -server "$NET.11:2181" > "$ST/zk-noauth.out" 2>&1 || true
denied=$(grep -c "Insufficient permission" "$ST/zk-noauth.out" || true)
[ "$denied" = 3 ] || { grep -v SLF4J "$ST/zk-noauth.out"; echo "deploy-test: ZooKeeper allowed a change without the digest identity ($denied of 3 refused)" >&2; exit 1; }
printf 'addauth digest %s\nget /quire/LAYOUT\n' "$(cat "$SEC/zk-auth")" \
    | "$ZKCLI" -server "$NET.11:2181" > "$ST/zk-auth.out" 2>&1 || true
grep -q '"layout_version":1' "$ST/zk-auth.out" || { grep -v SLF4J "$ST/zk-auth.out"; echo "deploy-test: the digest identity cannot read /quire/LAYOUT" >&2; exit 1; }
if env -u QUIRE_ZK_AUTH_FILE "$QUIRE_BIN" bookie list --zookeeper "$NET.11:2181" > /dev/null 2> "$ST/zk-list.err"; then
    echo "deploy-test: quire bookie list without --zk-auth-file read the bookies" >&2; exit 1
fi
grep -q "not authorized" "$ST/zk-list.err" || { cat "$ST/zk-list.err"; echo "deploy-test: unexpected error" >&2; exit 1; }
export QUIRE_ZK_AUTH_FILE=$SEC/zk-auth
[ "$("$QUIRE_BIN" bookie list --json --zookeeper "$NET.11:2181" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 3 ] \
    || { echo "deploy-test: quire bookie list --zk-auth-file does not list 3 bookies" >&2; exit 1; }
log "ZooKeeper ACLs on: 3 changes without the identity got NoAuth; with it, reads work"

# The cluster secret (docs/protocol.md §2): made once on the controller, 0600; a bookie answers
# `quire bookie info` only with it (with TLS and a CA-signed certificate, still not without it).
[ "$(stat -c %a "$SEC/cluster-secret")" = 600 ] || { echo "deploy-test: $SEC/cluster-secret is missing or not mode 0600" >&2; exit 1; }
if env -u QUIRE_CLUSTER_SECRET_FILE "$QUIRE_BIN" bookie info "$NET.21:3181" > /dev/null 2> "$ST/nosecret.err"; then
    echo "deploy-test: a bookie answered a client without the cluster secret" >&2; exit 1
fi
grep -q "cluster secret" "$ST/nosecret.err" || { cat "$ST/nosecret.err"; echo "deploy-test: unexpected refusal" >&2; exit 1; }
# The load driver's checker below reads replicas from the bookies with it too.
export QUIRE_CLUSTER_SECRET_FILE=$SEC/cluster-secret
"$QUIRE_BIN" bookie info "$NET.21:3181" > /dev/null \
    || { echo "deploy-test: quire bookie info with the cluster secret failed" >&2; exit 1; }
log "cluster secret on: a bookie refused a client without it and answered one with it"

# A real log through the deployed proxies (admin token): every loghub sample in through px1,
# out through px2.
LOGHUB=${QUIRE_LOGHUB_DIR:-$ROOT/tools/testkit/data/loghub}
n=0
for f in "$LOGHUB"/*.log; do
    s=deploy-$(basename "$f" .log)
    "$QUIRE_BIN" write "$s" "$f" --proxy "$NET.31:4181" > /dev/null
    "$QUIRE_BIN" read "$s" --proxy "$NET.32:4181" > "$ST/readback"
    python3 - "$f" "$ST/readback" << 'PY'
import sys
src, got = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
if src and not src.endswith(b"\n"):
    src += b"\n"
if src != got:
    sys.exit(f"read back of {sys.argv[1]} differs ({len(got)} bytes, expected {len(src)})")
PY
    n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "deploy-test: no loghub samples in $LOGHUB" >&2; exit 1; }
log "$n loghub files written through px1 and read back identical through px2"

# The rolling restart under a writer and a tailing reader (they take the same QUIRE_TLS_*,
# QUIRE_TOKEN and QUIRE_ZK_AUTH_FILE as the quire command).
export QUIRE_LOAD_PROXIES=$NET.31:4181,$NET.32:4181 QUIRE_LOAD_ZOOKEEPER=$NET.11:2181
export QUIRE_LOAD_ZK_ROOT=/quire QUIRE_LOAD_CONTROL=$ST/control QUIRE_LOGHUB_DIR=$LOGHUB
"$LOAD_BIN" --ignored --exact proxy_drain_and_rolling_load::deployed_cluster_under_rolling_restart --nocapture --test-threads 1 \
    > "$ST/load.log" 2>&1 &
LOAD_PID=$!
for i in $(seq 1 1200); do
    [ -e "$ST/control/ready" ] && break
    kill -0 "$LOAD_PID" 2> /dev/null || { cat "$ST/load.log"; echo "deploy-test: load driver ended early" >&2; exit 1; }
    sleep 0.1
done
[ -e "$ST/control/ready" ] || { echo "deploy-test: load driver not writing after 120 s" >&2; exit 1; }
log "writer and tailing reader running; rolling restart"
t0=$(date +%s)
ansible-playbook -i inventories/ci rolling-restart.yml > "$ST/rolling.log" || { tail -n 80 "$ST/rolling.log"; exit 1; }
grep -A10 "PLAY RECAP" "$ST/rolling.log"
log "rolling-restart.yml took $(( $(date +%s) - t0 )) s"

# The upgrade under the same writer and reader (upgrade.yml): the "new build" is the binary
# with a marker appended (it runs the same, but its bytes differ). Every bookie and proxy must
# be a new process (pid changed) running the new file (its executable's inode is the installed
# quire's, and that equals the new build), with the old build kept as quire.prev.
t0=$(date +%s)
NEXT=$ST/quire-next
cp "$QUIRE_BIN" "$NEXT"
printf '\nquire-deploy-test upgrade marker %s\n' "$(date +%s%N)" >> "$NEXT"
"$NEXT" --version > /dev/null || { echo "deploy-test: the marked binary does not run" >&2; exit 1; }
SERVICES="bk1:quire-bookie bk2:quire-bookie bk3:quire-bookie px1:quire-proxy px2:quire-proxy"
declare -A PID_BEFORE
for s in $SERVICES; do PID_BEFORE[$s]=$(cat "$ST/hosts/${s%%:*}/run/quire/${s#*:}.pid"); done
ansible-playbook -i inventories/ci upgrade.yml -e quire_upgrade_binary="$NEXT" > "$ST/upgrade.log" \
    || { tail -n 80 "$ST/upgrade.log"; exit 1; }
grep -A10 "PLAY RECAP" "$ST/upgrade.log"
for s in $SERVICES; do
    h=${s%%:*}; bin=$ST/hosts/$h/opt/quire/bin
    pid=$(cat "$ST/hosts/$h/run/quire/${s#*:}.pid")
    [ "$pid" != "${PID_BEFORE[$s]}" ] || { echo "deploy-test: ${s#*:} on $h was not restarted (pid $pid)" >&2; exit 1; }
    [ "$(stat -L -c %i "/proc/$pid/exe")" = "$(stat -c %i "$bin/quire")" ] \
        || { echo "deploy-test: ${s#*:} on $h (pid $pid) does not run the installed binary" >&2; exit 1; }
    cmp -s "$bin/quire" "$NEXT" || { echo "deploy-test: $h's quire is not the new build" >&2; exit 1; }
    cmp -s "$bin/quire.prev" "$QUIRE_BIN" || { echo "deploy-test: $h's quire.prev is not the old build" >&2; exit 1; }
done
log "upgrade.yml swapped and restarted all 5 processes under load ($(( $(date +%s) - t0 )) s)"
touch "$ST/control/stop"
wait "$LOAD_PID" && load_rc=0 || load_rc=$?
LOAD_PID=
grep -E "rolling-restart:|test result|panicked|FAILED" "$ST/load.log" || true
[ "$load_rc" = 0 ] || { cat "$ST/load.log"; echo "deploy-test: the load check failed" >&2; exit 1; }
log "history checked: every acknowledged record once and in order"

# Monitoring: Prometheus (site.yml, roles/monitoring, on zk1's host; the CI inventory scrapes
# and evaluates every second, alerts after 2 s) scrapes the 3 bookies and 2 proxies; stopping
# bk3 fires QuireBookieDown for it, starting it again resolves it.
t0=$(date +%s)
PROM=http://$NET.11:9090
PROMCHECK=$ANSIBLE_DIR/ci/prom-check.py
bookies_listed() {
    "$QUIRE_BIN" bookie list --json --zookeeper "$NET.11:2181" \
        | python3 -c 'import json,sys; print(len([b for b in json.load(sys.stdin) if not b["read_only"]]))'
}
"$PROMCHECK" "$PROM" targets 5 30
svc() { # HOST start|stop: the host's quire-svc, in its network namespace
    ip netns exec "$(ns "$1")" "$ST/hosts/$1/opt/quire/bin/quire-svc" "$2" "$ST/hosts/$1/run/quire" quire-bookie 30
}
svc bk3 stop
"$PROMCHECK" "$PROM" alert QuireBookieDown "$NET.23:9181" firing 30
svc bk3 start
"$PROMCHECK" "$PROM" alert QuireBookieDown "$NET.23:9181" resolved 30
for _ in $(seq 1 100); do [ "$(bookies_listed)" = 3 ] && break; sleep 0.2; done
[ "$(bookies_listed)" = 3 ] || { echo "deploy-test: bk3 did not register again" >&2; exit 1; }
log "Prometheus scraped all 5 processes; QuireBookieDown fired for a stopped bookie and resolved ($(( $(date +%s) - t0 )) s)"

# Day two: add the spare bk4 (a second inventory puts it in the bookies group), then retire it.
t0=$(date +%s)
printf 'all:\n  children:\n    bookies:\n      hosts:\n        bk4:\n' > "$ST/add-bk4.yml"
ansible-playbook -i inventories/ci -i "$ST/add-bk4.yml" add-bookie.yml -e quire_new_bookies=bk4 \
    > "$ST/add-bookie.log" || { tail -n 60 "$ST/add-bookie.log"; exit 1; }
[ "$(bookies_listed)" = 4 ] || { echo "deploy-test: bk4 is not registered after add-bookie.yml" >&2; exit 1; }
"$PROMCHECK" "$PROM" targets 6 30
log "add-bookie.yml: bk4 registered and scraped ($(( $(date +%s) - t0 )) s)"
t0=$(date +%s)
ansible-playbook -i inventories/ci -i "$ST/add-bk4.yml" decommission-bookie.yml \
    -e quire_decommission_bookie=bk4 -e quire_decommission_timeout_s=60 \
    > "$ST/decommission.log" || { tail -n 60 "$ST/decommission.log"; exit 1; }
grep -q "decommissioned" "$ST/decommission.log" || { tail -n 60 "$ST/decommission.log"; echo "deploy-test: no decommission line" >&2; exit 1; }
[ "$(bookies_listed)" = 3 ] || { echo "deploy-test: bk4 is still registered after decommission-bookie.yml" >&2; exit 1; }
"$PROMCHECK" "$PROM" targets 5 30
log "decommission-bookie.yml: bk4 retired and no longer scraped ($(( $(date +%s) - t0 )) s)"

t0=$(date +%s)
ansible-playbook -i inventories/ci stop.yml > "$ST/stop.log" || { tail -n 60 "$ST/stop.log"; exit 1; }
log "stop.yml took $(( $(date +%s) - t0 )) s"
left=$(ls "$ST"/hosts/*/run/quire/*.pid 2> /dev/null || true)
[ -z "$left" ] || { echo "deploy-test: pid files left after stop.yml: $left" >&2; exit 1; }
for h in $HOSTS; do
    for p in $(ip netns pids "$(ns "${h%%:*}")"); do
        comm=$(cat "/proc/$p/comm" 2> /dev/null || true)
        case $comm in
            sshd|sh|bash|python3|"") ;;
            *) echo "deploy-test: $comm (pid $p) still runs on ${h%%:*} after stop.yml" >&2; exit 1 ;;
        esac
    done
done
log "passed in $(( $(date +%s) - START )) s"
