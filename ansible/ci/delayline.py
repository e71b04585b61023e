#!/usr/bin/env python3
"""A wide-area delay line on a TUN device, for the multi-region test bed (regions-bed.sh).

Why not `tc qdisc ... netem`: the CI machine's kernel has no sch_netem
(CONFIG_NET_SCH_NETEM is not set; `tc` answers "Specified qdisc kind is unknown"), so the
delay is added in user space. regions-bed.sh routes every packet that crosses from one region
to another through the TUN device TUN in the WAN router namespace (policy routing: packets
arriving from a region's link are looked up in a table whose default route is the TUN
device); this program reads each packet, holds it for the one-way delay and writes it back,
and the kernel forwards it to the destination region's link (packets written to the TUN
device arrive on it, so they take the main table).

Addresses are IPv4 NET.R.H (NET the first two octets, R the region's index): the pair
(source R, destination R) decides the delay. One-way delay = RTT/2 plus a uniform jitter in
[-JITTER/2, +JITTER/2], so a round trip is RTT +- JITTER. Packets of one region pair leave in
the order they came (a link does not reorder), so a packet waits at least until the one
before it of its pair has left.

Usage: delayline.py TUN CONFIG PIDFILE
CONFIG holds "RTT_MS JITTER_MS" (e.g. "20 2"); it is read at start and again on SIGHUP
(regions-bed.sh delay RTT JITTER). Counters go to stderr on SIGUSR1 and at exit.
"""

import collections
import fcntl
import os
import random
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


def read_config(path):
    """(rtt_s, jitter_s) from CONFIG; an unreadable or malformed file is a clear error."""
    with open(path, encoding="ascii") as f:
        fields = f.read().split()
    if len(fields) != 2:
        raise SystemExit(f"delayline: {path} must hold 'RTT_MS JITTER_MS', found {fields!r}")
    rtt, jitter = float(fields[0]), float(fields[1])
    if rtt < 0 or jitter < 0 or jitter > rtt:
        raise SystemExit(f"delayline: need 0 <= JITTER_MS <= RTT_MS, found {rtt} {jitter}")
    return rtt / 1e3, jitter / 1e3


def main():
    if len(sys.argv) != 4:
        raise SystemExit("usage: delayline.py TUN CONFIG PIDFILE")
    tun, config, pidfile = sys.argv[1:]
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", tun.encode(), IFF_TUN | IFF_NO_PI))
    state = {"delay": read_config(config), "reload": False, "report": False, "stop": False}
    signal.signal(signal.SIGHUP, lambda *_: state.update(reload=True))
    signal.signal(signal.SIGUSR1, lambda *_: state.update(report=True))
    signal.signal(signal.SIGTERM, lambda *_: state.update(stop=True))
    with open(pidfile, "w", encoding="ascii") as f:
        f.write(f"{os.getpid()}\n")
    # Per (source region, destination region): FIFO of (release time, packet).
    queues = collections.defaultdict(collections.deque)
    last_release = {}
    counts = {"in": 0, "out": 0, "dropped_not_ipv4": 0}

    def report():
        rtt, jit = state["delay"]
        held = sum(len(q) for q in queues.values())
        print(f"delayline: rtt {rtt * 1e3:g} ms +- {jit * 1e3:g} ms; packets in {counts['in']}, "
              f"out {counts['out']}, held {held}, not IPv4 {counts['dropped_not_ipv4']}",
              file=sys.stderr, flush=True)

    while not state["stop"]:
        if state["reload"]:
            state["reload"] = False
            state["delay"] = read_config(config)
            report()
        if state["report"]:
            state["report"] = False
            report()
        now = time.monotonic()
        heads = [q[0][0] for q in queues.values() if q]
        timeout = max(0.0, min(heads) - now) if heads else 1.0
        try:
            readable, _, _ = select.select([fd], [], [], timeout)
        except InterruptedError:
            continue
        if readable:
            rtt, jitter = state["delay"]
            while True:
                try:
                    pkt = os.read(fd, 65536)
                except BlockingIOError:
                    break
                counts["in"] += 1
                if len(pkt) < 20 or pkt[0] >> 4 != 4:
                    counts["dropped_not_ipv4"] += 1
                    continue
                pair = (pkt[14], pkt[18])
                now = time.monotonic()
                release = now + rtt / 2 + random.uniform(-jitter / 2, jitter / 2)
                release = max(release, last_release.get(pair, 0.0))
                last_release[pair] = release
                queues[pair].append((release, pkt))
        now = time.monotonic()
        for q in queues.values():
            while q and q[0][0] <= now:
                try:
                    os.write(fd, q[0][1])
                except BlockingIOError:
                    break  # the TUN queue is full: try again on the next turn
                q.popleft()
                counts["out"] += 1
    report()


if __name__ == "__main__":
    main()
