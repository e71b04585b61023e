#!/usr/bin/env bash
# The multi-region test bed (issue 30): three regions of throw-away hosts on one machine,
# with a wide-area delay between regions and ways to cut a region off or partition it.
#
#   regions-bed.sh up [--no-deploy]   hosts, links, delay line; then site.yml (inventories/regions)
#   regions-bed.sh deploy             site.yml again (e.g. after a rebuild)
#   regions-bed.sh down               stop everything (by pid) and remove namespaces and bridges
#   regions-bed.sh cut REGION         every link of REGION down (its hosts' and its WAN link):
#                                     the data centre is dark, also to the controller
#   regions-bed.sh partition REGION   REGION cannot reach the other regions nor they it (both
#                                     directions); inside it and to the controller all works
#   regions-bed.sh heal REGION        undo cut and partition of REGION
#   regions-bed.sh delay RTT JITTER   the inter-region round trip, ms (default 20 2)
#   regions-bed.sh rtt                measured round trips (TCP connect to sshd, 20 samples)
#   regions-bed.sh env                the variables a client needs (eval "$(... env)")
#   regions-bed.sh status             hosts, links, partitions, the delay line's counters
# REGION is a, b or c. State: QUIRE_BED_STATE (default /tmp/quire-regions-bed, on disk: the
# bookies' O_DIRECT journals live under it).
#
# Layout: region R (a=1, b=2, c=3) is subnet 10.210.R.0/24 on bridge quirer-R in the root
# namespace (the controller is 10.210.R.1 on it: management, no delay). Hosts (inventories/
# regions): zk-R .11, bk-R1 .21, bk-R2 .22, px-R .31, each a namespace quirer-HOST made by
# ci/lib/nshosts.sh, with a route to 10.210.0.0/16 via the WAN router 10.210.R.254. The WAN
# router is the namespace quirer-wan with one link per region (wan-R); policy routing sends
# every packet arriving on a region link into the TUN device qdelay0, where ci/delayline.py
# holds it for the one-way delay and writes it back, and the main table forwards it to the
# destination region. (The kernel here has no sch_netem, so `tc ... netem` is not possible;
# see delayline.py.) Partitions are `ip rule ... blackhole` in the WAN router; a cut sets the
# region's links down.
#
# Needs root, ip, unshare, ssh-keygen, /usr/sbin/sshd, python3; for deploy: ansible-playbook,
# java + Debian's zookeeper package, and the quire binary (QUIRE_BIN, default
# target/release/quire).
set -eu
cd "$(dirname "$0")/../.."
ROOT=$PWD
ANSIBLE_DIR=$ROOT/ansible
# shellcheck source=lib/nshosts.sh
. "$ANSIBLE_DIR/ci/lib/nshosts.sh"

ST=${QUIRE_BED_STATE:-/tmp/quire-regions-bed}
export QUIRE_CI_STATE=$ST QUIRE_CI_HOSTS_ROOT=$ST/hosts
export QUIRE_BIN=${QUIRE_BIN:-$ROOT/target/release/quire}
NSHOSTS_STATE=$ST
NET=10.210
REGIONS="a:1 b:2 c:3"
HOST_SUFFIXES="zk:11 bk1:21 bk2:22 px:31"
WAN=quirer-wan
TUN=qdelay0

die() { echo "regions-bed: $*" >&2; exit 1; }
region_index() {
    case $1 in a) echo 1 ;; b) echo 2 ;; c) echo 3 ;; *) die "unknown region '$1' (a, b or c)" ;; esac
}
# Host names of region R (zk-a bk-a1 bk-a2 px-a), with their addresses: NAME:ADDR.
region_hosts() {
    local r=$1 i s n
    i=$(region_index "$r")
    for s in $HOST_SUFFIXES; do
        case ${s%%:*} in
            zk) n=zk-$r ;; px) n=px-$r ;; bk1) n=bk-${r}1 ;; bk2) n=bk-${r}2 ;;
        esac
        echo "$n:$NET.$i.${s##*:}"
    done
}
all_hosts() { local r; for r in $REGIONS; do region_hosts "${r%%:*}"; done; }
ns() { echo "quirer-$1"; }

bed_up() {
    local r i h n addrs=
    for h in $(all_hosts) "wan:"; do
        nshosts_exists "$(ns "${h%%:*}")" && die "namespace $(ns "${h%%:*}") exists already: run '$0 down' first"
    done
    mkdir -p "$ST/hosts" "$ST/control"
    nshosts_init "$ST"
    ip netns add "$WAN"
    ip -n "$WAN" link set lo up
    ip netns exec "$WAN" sh -c 'sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0'
    ip -n "$WAN" tuntap add dev "$TUN" mode tun
    ip netns exec "$WAN" sysctl -qw "net.ipv4.conf.$TUN.rp_filter=0"
    ip -n "$WAN" link set "$TUN" up
    ip -n "$WAN" route add default dev "$TUN" table 100
    for r in $REGIONS; do
        i=${r##*:}; r=${r%%:*}
        nshosts_bridge "quirer-$r" "$NET.$i.1/24"
        ip link add "vw-$r" type veth peer name "wan-$r" netns "$WAN"
        ip link set "vw-$r" master "quirer-$r" up
        ip -n "$WAN" addr add "$NET.$i.254/24" dev "wan-$r"
        ip -n "$WAN" link set "wan-$r" up
        ip netns exec "$WAN" sysctl -qw "net.ipv4.conf.wan-$r.rp_filter=0"
        # From a region's link into the delay line; back out of it by the main table.
        ip -n "$WAN" rule add pref 1000 iif "wan-$r" lookup 100
        for h in $(region_hosts "$r"); do
            n=${h%%:*}
            nshosts_add "$(ns "$n")" "$n" "${h#*:}/24" "quirer-$r" "vr-$n" "$NET.0.0/16" "$NET.$i.254"
            addrs="$addrs ${h#*:}"
        done
    done
    [ -s "$ST/delay.conf" ] || echo "20 2" > "$ST/delay.conf"
    ip netns exec "$WAN" setsid python3 "$ANSIBLE_DIR/ci/delayline.py" "$TUN" "$ST/delay.conf" "$ST/delayline.pid" \
        < /dev/null > "$ST/delayline.log" 2>&1 &
    for _ in $(seq 1 50); do [ -s "$ST/delayline.pid" ] && break; sleep 0.1; done
    [ -s "$ST/delayline.pid" ] || { cat "$ST/delayline.log" >&2; die "the delay line did not start"; }
    # shellcheck disable=SC2086
    nshosts_wait_ssh $addrs
    echo "regions-bed: 12 hosts in regions a, b, c up (namespaces with sshd on $NET.{1,2,3}.0/24); inter-region delay $(cat "$ST/delay.conf") ms (RTT JITTER)"
}

bed_deploy() {
    local extra=()
    [ -x "$QUIRE_BIN" ] || die "$QUIRE_BIN not built"
    # The region and proxy rack keys come with the topology labels (issue 30, item 1); a binary
    # without them would refuse the configs, so leave them out there.
    if ! "$QUIRE_BIN" bookie --help 2> /dev/null | grep -q -- '--region'; then
        echo "regions-bed: $QUIRE_BIN has no topology labels (quire bookie --region); configs without region" >&2
        extra=(-e quire_topology_labels=false)
    fi
    cd "$ANSIBLE_DIR"
    ANSIBLE_CONFIG=$ANSIBLE_DIR/ansible.cfg ansible-playbook -i inventories/regions site.yml "${extra[@]}" \
        > "$ST/site.log" 2>&1 || { tail -n 60 "$ST/site.log" >&2; die "site.yml failed (log: $ST/site.log)"; }
    grep -A14 "PLAY RECAP" "$ST/site.log"
}

bed_down() {
    local hosts= h r
    if [ -s "$ST/delayline.pid" ]; then
        kill "$(cat "$ST/delayline.pid")" 2> /dev/null || true
    fi
    for h in $(all_hosts); do hosts="$hosts ${h%%:*}:$(ns "${h%%:*}")"; done
    nshosts_teardown "$hosts wan:$WAN"
    # A deleted namespace can outlive `ip netns del` for a while (seen: minutes; the kernel
    # frees it when its last reference goes), and its veths with it; delete our ends (each
    # takes its peer along) so that the names are free for the next `up`.
    for h in $(all_hosts); do
        ip link show "vr-${h%%:*}" > /dev/null 2>&1 && ip link del "vr-${h%%:*}"
    done
    for r in $REGIONS; do
        ip link show "vw-${r%%:*}" > /dev/null 2>&1 && ip link del "vw-${r%%:*}"
        ip link show "quirer-${r%%:*}" > /dev/null 2>&1 && ip link del "quirer-${r%%:*}"
    done
    rm -rf "$ST"
    echo "regions-bed: down (processes stopped by pid, namespaces and bridges removed, $ST removed)"
}

# The links of region R: its hosts' veths on the bridge and its WAN link.
region_links() {
    local h
    for h in $(region_hosts "$1"); do echo "vr-${h%%:*}"; done
    echo "vw-$1"
}

bed_cut() {
    local l
    for l in $(region_links "$1"); do ip link set "$l" down; done
    echo "regions-bed: region $1 cut off (links down: $(region_links "$1" | tr '\n' ' '))"
}

# Blackhole rules both ways between region R and each other region, before the delay line's
# rules (pref 100 < 1000), so that packets already in the delay line are dropped too.
bed_partition() {
    local i j o
    i=$(region_index "$1")
    for o in $REGIONS; do
        j=${o##*:}
        [ "$j" = "$i" ] && continue
        ip -n "$WAN" rule add pref 100 from "$NET.$i.0/24" to "$NET.$j.0/24" blackhole
        ip -n "$WAN" rule add pref 100 from "$NET.$j.0/24" to "$NET.$i.0/24" blackhole
    done
    echo "regions-bed: region $1 partitioned from the other regions (both directions)"
}

bed_heal() {
    local i j o l
    i=$(region_index "$1")
    for l in $(region_links "$1"); do ip link set "$l" up; done
    for o in $REGIONS; do
        j=${o##*:}
        [ "$j" = "$i" ] && continue
        while ip -n "$WAN" rule del pref 100 from "$NET.$i.0/24" to "$NET.$j.0/24" blackhole 2> /dev/null; do :; done
        while ip -n "$WAN" rule del pref 100 from "$NET.$j.0/24" to "$NET.$i.0/24" blackhole 2> /dev/null; do :; done
    done
    echo "regions-bed: region $1 healed (links up, no partition rules)"
}

bed_delay() {
    echo "$1 $2" > "$ST/delay.conf"
    kill -HUP "$(cat "$ST/delayline.pid")"
    echo "regions-bed: inter-region round trip now $1 ms +- $2 ms"
}

# Round trips from FROM's namespace to ADDR: TCP connects to sshd (SYN -> SYN/ACK is one round
# trip; there is no ping on this machine), N samples; prints min / median / max in ms.
rtt_probe() {
    ip netns exec "$(ns "$1")" python3 - "$2" "${3:-20}" << 'PY'
import socket, statistics, sys, time
addr, n = sys.argv[1], int(sys.argv[2])
samples = []
for _ in range(n):
    s = socket.socket()
    s.settimeout(5)
    t0 = time.perf_counter()
    s.connect((addr, 22))
    samples.append((time.perf_counter() - t0) * 1e3)
    s.close()
    time.sleep(0.02)
print(f"min {min(samples):.2f} median {statistics.median(samples):.2f} max {max(samples):.2f} ms ({n} samples)")
PY
}

bed_rtt() {
    echo "inside region a  (zk-a -> bk-a1): $(rtt_probe zk-a $NET.1.21)"
    echo "inside region c  (bk-c1 -> px-c): $(rtt_probe bk-c1 $NET.3.31)"
    echo "region a -> b    (zk-a -> zk-b):  $(rtt_probe zk-a $NET.2.11)"
    echo "region a -> c    (px-a -> bk-c2): $(rtt_probe px-a $NET.3.22)"
    echo "region b -> c    (bk-b1 -> zk-c): $(rtt_probe bk-b1 $NET.3.11)"
}

bed_env() {
    echo "export QUIRE_TLS_CA_FILE=$ST/tls/ca.pem QUIRE_TLS_CERT_FILE=$ST/tls/node.pem QUIRE_TLS_KEY_FILE=$ST/tls/node.key"
    echo "export QUIRE_BOOKIE_TLS_CA_FILE=$ST/tls/ca.pem QUIRE_BOOKIE_TLS_CERT_FILE=$ST/tls/node.pem QUIRE_BOOKIE_TLS_KEY_FILE=$ST/tls/node.key"
    echo "export QUIRE_TOKEN=\$(cat $ST/secrets/token-admin) QUIRE_ZK_AUTH_FILE=$ST/secrets/zk-auth QUIRE_CLUSTER_SECRET_FILE=$ST/secrets/cluster-secret"
    echo "export QUIRE_BED_ZOOKEEPER=$NET.1.11:2181,$NET.2.11:2181,$NET.3.11:2181"
    echo "export QUIRE_BED_PROXIES=$NET.1.31:4181,$NET.2.31:4181,$NET.3.31:4181"
}

bed_status() {
    local h
    for h in $(all_hosts); do
        printf '%-6s %-12s link %s\n' "${h%%:*}" "${h#*:}" \
            "$(ip -br link show "vr-${h%%:*}" 2> /dev/null | awk '{print $2}')"
    done
    ip -n "$WAN" rule show pref 100
    [ -s "$ST/delayline.pid" ] && kill -USR1 "$(cat "$ST/delayline.pid")" && sleep 0.2 && tail -n 1 "$ST/delayline.log"
}

[ "$(id -u)" = 0 ] || die "must run as root (namespaces, sshd)"
cmd=${1:-}
case $cmd in
    up)
        bed_up
        [ "${2:-}" = --no-deploy ] || bed_deploy
        ;;
    deploy) bed_deploy ;;
    down) bed_down ;;
    cut) region_index "${2:-}" > /dev/null; bed_cut "$2" ;;
    partition) region_index "${2:-}" > /dev/null; bed_partition "$2" ;;
    heal) region_index "${2:-}" > /dev/null; bed_heal "$2" ;;
    delay) [ $# = 3 ] || die "usage: $0 delay RTT_MS JITTER_MS"; bed_delay "$2" "$3" ;;
    rtt) bed_rtt ;;
    env) bed_env ;;
    status) bed_status ;;
    *) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
