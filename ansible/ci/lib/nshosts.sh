# shellcheck shell=bash
# Throw-away "hosts" on one machine, shared by ansible/ci/deploy-test.sh and
# ansible/ci/regions-bed.sh (source it; needs root, ip, unshare, ssh-keygen, /usr/sbin/sshd).
# A host is a network namespace with its own UTS namespace (hostname), its own sshd and one
# address on a bridge of the root namespace, with no default route: only the subnets given
# are reachable, nothing can leave the machine. The namespaces share the filesystem, so each
# host gets its own directory from the playbooks (quire_prefix).
#
# Every process is started and stopped by pid (pid files in NSHOSTS_STATE), never by name.

# nshosts_init STATE: ssh client and host keys, an authorized_keys and one sshd_config in STATE
# (NSHOSTS_STATE is set to it for the functions below).
nshosts_init() {
    NSHOSTS_STATE=$1
    mkdir -p "$NSHOSTS_STATE/keys" /run/sshd
    ssh-keygen -q -t ed25519 -N '' -f "$NSHOSTS_STATE/keys/id_ed25519"
    ssh-keygen -q -t ed25519 -N '' -f "$NSHOSTS_STATE/keys/host_ed25519"
    cp "$NSHOSTS_STATE/keys/id_ed25519.pub" "$NSHOSTS_STATE/keys/authorized_keys"
    cat > "$NSHOSTS_STATE/sshd_config" << CFG
HostKey $NSHOSTS_STATE/keys/host_ed25519
AuthorizedKeysFile $NSHOSTS_STATE/keys/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 100:30:200
MaxSessions 50
Subsystem sftp internal-sftp
CFG
}

# nshosts_bridge NAME ADDR/PREFIX: a bridge in the root namespace (the controller's side).
nshosts_bridge() {
    ip link add "$1" type bridge
    ip addr add "$2" dev "$1"
    ip link set "$1" up
}

# nshosts_add NS HOSTNAME ADDR/PREFIX BRIDGE VETH [ROUTE VIA]...: namespace NS, a veth pair
# (VETH on BRIDGE, eth0 inside), the address on eth0, any extra routes (ROUTE via VIA), and an
# sshd listening on the address (pid in NSHOSTS_STATE/sshd-HOSTNAME.pid, log beside it).
nshosts_add() {
    local nsn=$1 host=$2 cidr=$3 br=$4 veth=$5
    shift 5
    ip netns add "$nsn"
    ip link add "$veth" type veth peer name eth0 netns "$nsn"
    ip link set "$veth" master "$br" up
    ip -n "$nsn" addr add "$cidr" dev eth0
    ip -n "$nsn" link set eth0 up
    ip -n "$nsn" link set lo up
    while [ $# -ge 2 ]; do
        ip -n "$nsn" route add "$1" via "$2"
        shift 2
    done
    ip netns exec "$nsn" unshare --uts sh -c \
        "hostname $host; exec /usr/sbin/sshd -D -e -f $NSHOSTS_STATE/sshd_config -o ListenAddress=${cidr%/*} -o PidFile=none" \
        > "$NSHOSTS_STATE/sshd-$host.log" 2>&1 &
    echo $! > "$NSHOSTS_STATE/sshd-$host.pid"
}

# nshosts_wait_ssh ADDR...: until each address answers on port 22 (10 s each), else returns 1.
nshosts_wait_ssh() {
    local addr i
    for addr in "$@"; do
        for i in $(seq 1 100); do
            (exec 3<> "/dev/tcp/$addr/22") 2> /dev/null && break
            [ "$i" = 100 ] && { echo "nshosts: sshd on $addr does not answer" >&2; return 1; }
            sleep 0.1
        done
    done
}

# nshosts_exists NS: whether namespace NS exists.
nshosts_exists() {
    ip netns list | awk '{print $1}' | grep -qxF "$1"
}

# nshosts_teardown "HOSTNAME:NS ...": stops each host's sshd (its pid file), then whatever
# still runs in the namespaces (services a failed run left, ssh sessions kept by
# ControlPersist): SIGTERM by pid, SIGKILL by pid after 10 s; then deletes the namespaces.
# Safe to call for hosts that were never made.
nshosts_teardown() {
    local h nsn sig left any p
    for h in $1; do
        [ -s "${NSHOSTS_STATE:-}/sshd-${h%%:*}.pid" ] && kill "$(cat "$NSHOSTS_STATE/sshd-${h%%:*}.pid")" 2> /dev/null
    done
    for sig in TERM KILL; do
        left=
        for h in $1; do
            nsn=${h#*:}
            nshosts_exists "$nsn" || continue
            for p in $(ip netns pids "$nsn"); do kill -"$sig" "$p" 2> /dev/null; left=1; done
        done
        [ -z "$left" ] && break
        for _ in $(seq 1 100); do
            any=
            for h in $1; do
                nsn=${h#*:}
                nshosts_exists "$nsn" || continue
                [ -n "$(ip netns pids "$nsn")" ] && any=1
            done
            [ -z "$any" ] && break
            sleep 0.1
        done
    done
    for h in $1; do
        nshosts_exists "${h#*:}" && ip netns del "${h#*:}"
    done
    return 0
}
