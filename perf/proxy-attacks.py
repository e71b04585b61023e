#!/usr/bin/env python3
"""Hostile clients against a running Quire proxy (issue 24), loopback only.

Each scenario runs a bounded attack from 127.0.0.1 while a legitimate client from another
loopback address (127.0.0.2 by default) connects, hands shakes, writes one record and reads it
back every 0.25 s; it prints the legitimate client's success rate (each round must finish
within 2 s) and, when --pid is given, the proxy's peak VmRSS.

  cycle N        N connections that never send a byte, reopened as the proxy closes them
  tls-cycle N    the same against a TLS proxy port (the TLS handshake never starts)
  unread N       N handshaken connections pipelining 4 MiB reads of a stream of ~1 MiB
                 records, never reading the answers
  metrics        50 idle connections and one slow-loris on the metrics port; /healthz is asked
                 every 0.5 s and must answer within 1 s
  badtoken       handshakes with a wrong token from 16 connections at a time; prints attempts
                 per second
  legit          no attack: only the legitimate client (run it as a second process beside an
                 attack started with --no-legit, so that the attacker's event loop cannot
                 delay it)

Usage: proxy-attacks.py SCENARIO [N] --proxy HOST:PORT [--metrics HOST:PORT] [--pid PID]
       [--secs S] [--legit-ip 127.0.0.2] [--tls-ca CA --tls-cert CERT --tls-key KEY]
Stdlib only. The attack stops by itself after --secs (default 20).
"""

import argparse
import asyncio
import ssl
import struct
import time

MAGIC = 0x31585051
HELLO, CREATE, LIST, WRITE, READ = 1, 2, 3, 4, 5


def frame(opcode, request_id, body, flags=0):
    return struct.pack("<IBBHQ", 12 + len(body), opcode, flags, 0, request_id) + body


def string(s):
    b = s.encode()
    return struct.pack("<I", len(b)) + b


def hello(token=None):
    body = struct.pack("<IHH", MAGIC, 1, 1)
    if token is not None:
        body += struct.pack("<I", len(token)) + token
    return frame(HELLO, 1, body)


def write(request_id, stream, txid, payload):
    body = string(stream) + struct.pack("<I", 1) + struct.pack("<Q", txid)
    body += struct.pack("<I", len(payload)) + payload
    return frame(WRITE, request_id, body, flags=1)


def read(request_id, stream, max_bytes, head=True, dlsn=(0, 0, 0)):
    pos = struct.pack("<BQQI", 0 if head else 1, *dlsn)
    body = string(stream) + pos + struct.pack("<III", 1000, max_bytes, 0)
    return frame(READ, request_id, body)


async def read_frame(reader):
    n = struct.unpack("<I", await reader.readexactly(4))[0]
    rest = await reader.readexactly(n)
    opcode, _flags, status, rid = struct.unpack("<BBHQ", rest[:12])
    return opcode, status, rid, rest[12:]


class Stats:
    def __init__(self):
        self.ok = 0
        self.failed = 0
        self.reasons = {}
        self.worst = 0.0

    def fail(self, why):
        self.failed += 1
        self.reasons[why] = self.reasons.get(why, 0) + 1


async def open_conn(host, port, ssl_ctx=None, local_ip=None):
    kw = {}
    if local_ip:
        kw["local_addr"] = (local_ip, 0)
    if ssl_ctx:
        kw["ssl"] = ssl_ctx
        kw["server_hostname"] = "localhost"
    return await asyncio.open_connection(host, port, **kw)


async def legit_round(args, ssl_ctx, txid, stats):
    host, port = args.proxy.rsplit(":", 1)
    start = time.monotonic()
    w = None
    try:
        async def once():
            nonlocal w
            r, w = await open_conn(host, int(port), ssl_ctx, args.legit_ip)
            w.write(hello(args.token.encode() if args.token else None))
            op, status, _, _ = await read_frame(r)
            if status != 0:
                raise RuntimeError(f"hello status {status}")
            w.write(write(2, "legit", txid, b"x" * 100))
            op, status, _, body = await read_frame(r)
            if status != 0:
                raise RuntimeError(f"write status {status}")
            seq, entry, slot = struct.unpack("<QQI", body[4:24])
            w.write(read(3, "legit", 4096, head=False, dlsn=(seq, entry, slot)))
            op, status, _, body = await read_frame(r)
            if status != 0:
                raise RuntimeError(f"read status {status}")

        await asyncio.wait_for(once(), 2.0)
        stats.ok += 1
        stats.worst = max(stats.worst, time.monotonic() - start)
    except asyncio.TimeoutError:
        stats.fail("timeout")
    except Exception as e:  # noqa: BLE001 - every failure counts
        stats.fail(type(e).__name__ + ":" + str(e)[:40])
    finally:
        if w is not None:
            w.close()


async def legit_loop(args, ssl_ctx, deadline, stats):
    txid = int(time.time() * 1000) * 1000
    while time.monotonic() < deadline:
        txid += 1
        t = time.monotonic()
        await legit_round(args, ssl_ctx, txid, stats)
        await asyncio.sleep(max(0.0, 0.25 - (time.monotonic() - t)))


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def rss_sampler(pid, deadline, peak):
    while time.monotonic() < deadline:
        try:
            peak[0] = max(peak[0], rss_mib(pid))
        except OSError:
            return
        await asyncio.sleep(0.1)


async def cycle(args, n, deadline):
    host, port = args.proxy.rsplit(":", 1)
    opened = [0]

    async def holder():
        while time.monotonic() < deadline:
            try:
                r, w = await open_conn(host, int(port), None, "127.0.0.1")
                opened[0] += 1
                try:
                    await asyncio.wait_for(r.read(1 << 16), deadline - time.monotonic())
                    while await asyncio.wait_for(r.read(1 << 16), deadline - time.monotonic()):
                        pass
                except (asyncio.TimeoutError, OSError):
                    pass
                w.close()
            except OSError:
                await asyncio.sleep(0.05)

    await asyncio.gather(*(holder() for _ in range(n)), return_exceptions=True)
    return f"attack connections opened: {opened[0]}"


async def unread(args, n, deadline):
    host, port = args.proxy.rsplit(":", 1)
    r, w = await open_conn(host, int(port), None, "127.0.0.1")
    w.write(hello(args.token.encode() if args.token else None))
    await read_frame(r)
    for i in range(8):
        w.write(write(10 + i, "big", i + 1, b"r" * 1_000_000))
        _, status, _, _ = await read_frame(r)
    w.close()
    socks = []
    closed = [0]

    async def attacker():
        try:
            r, w = await open_conn(host, int(port), None, "127.0.0.1")
        except OSError:
            return
        socks.append(w)
        w.write(hello(args.token.encode() if args.token else None))
        await read_frame(r)
        for i in range(100):
            w.write(read(100 + i, "big", 4 << 20))
        try:
            await w.drain()
            # Never read; notice when the proxy closes the connection.
            w.transport.pause_reading()
            while not w.is_closing() and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
        except (OSError, ConnectionError):
            closed[0] += 1

    tasks = [asyncio.create_task(attacker()) for _ in range(n)]
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    for w in socks:
        w.close()
    for t in tasks:
        t.cancel()
    return f"unread-read connections: {n}"


async def metrics(args, deadline, stats_health):
    host, port = args.metrics.rsplit(":", 1)
    idle = []
    for _ in range(50):
        try:
            idle.append(await open_conn(host, int(port)))
        except OSError:
            pass
    r, slow = await open_conn(host, int(port))

    async def loris():
        req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
        for i in range(10_000):
            if time.monotonic() >= deadline:
                return
            try:
                slow.write(req[i % len(req):i % len(req) + 1] if i < len(req) else b"X")
                await slow.drain()
            except OSError:
                return
            await asyncio.sleep(1.0)

    async def checker():
        while time.monotonic() < deadline:
            t = time.monotonic()
            try:
                async def one():
                    rr, ww = await open_conn(host, int(port))
                    ww.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    data = await rr.read(4096)
                    ww.close()
                    return data
                data = await asyncio.wait_for(one(), 1.0)
                if data.startswith(b"HTTP/1.1 200"):
                    stats_health.ok += 1
                else:
                    stats_health.fail(data[:20].decode(errors="replace"))
            except asyncio.TimeoutError:
                stats_health.fail("timeout")
            except OSError as e:
                stats_health.fail(type(e).__name__)
            await asyncio.sleep(max(0.0, 0.5 - (time.monotonic() - t)))

    await asyncio.gather(loris(), checker())
    return "metrics: 50 idle + 1 slow-loris held"


async def badtoken(args, deadline):
    host, port = args.proxy.rsplit(":", 1)
    attempts = [0]
    refused = [0]

    async def one_worker():
        while time.monotonic() < deadline:
            try:
                r, w = await open_conn(host, int(port), None, "127.0.0.1")
                w.write(hello(b"not-a-token"))
                _, status, _, _ = await asyncio.wait_for(read_frame(r), max(0.01, deadline - time.monotonic()))
                attempts[0] += 1
                if status != 0:
                    refused[0] += 1
                w.close()
            except (asyncio.TimeoutError, OSError, asyncio.IncompleteReadError):
                await asyncio.sleep(0.001)

    start = time.monotonic()
    await asyncio.gather(*(one_worker() for _ in range(16)))
    secs = time.monotonic() - start
    return f"bad-token attempts answered: {attempts[0]} in {secs:.1f} s = {attempts[0] / secs:.0f}/s"


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("scenario")
    p.add_argument("n", nargs="?", type=int, default=0)
    p.add_argument("--proxy", required=True)
    p.add_argument("--metrics")
    p.add_argument("--pid", type=int)
    p.add_argument("--secs", type=float, default=20)
    p.add_argument("--legit-ip", default="127.0.0.2")
    p.add_argument("--token")
    p.add_argument("--tls-ca")
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--no-legit", action="store_true")
    args = p.parse_args()
    ssl_ctx = None
    if args.tls_ca:
        ssl_ctx = ssl.create_default_context(cafile=args.tls_ca)
        if args.tls_cert:
            ssl_ctx.load_cert_chain(args.tls_cert, args.tls_key)
    deadline = time.monotonic() + args.secs
    stats = Stats()
    peak = [0.0]
    if args.pid:
        peak[0] = rss_mib(args.pid)
        print(f"proxy VmRSS before: {peak[0]:.0f} MiB")
    side = []
    if args.pid:
        side.append(rss_sampler(args.pid, deadline, peak))
    if args.scenario in ("cycle", "tls-cycle"):
        attack = cycle(args, args.n, deadline)
    elif args.scenario == "unread":
        attack = unread(args, args.n, deadline)
    elif args.scenario == "metrics":
        attack = metrics(args, deadline, stats)
    elif args.scenario == "badtoken":
        attack = badtoken(args, deadline)
    elif args.scenario == "legit":
        async def nothing():
            while time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            return "no attack"
        attack = nothing()
    else:
        raise SystemExit(f"unknown scenario {args.scenario}")
    if args.scenario in ("metrics", "badtoken") or args.no_legit:
        results = await asyncio.gather(attack, *side)
    else:
        async def legit_later():
            await asyncio.sleep(min(3.0, args.secs / 4))
            await legit_loop(args, ssl_ctx, deadline, stats)
        results = await asyncio.gather(attack, legit_later(), *side)
    print(results[0])
    total = stats.ok + stats.failed
    if total:
        what = "healthz" if args.scenario == "metrics" else "legitimate rounds"
        print(f"{what}: {stats.ok}/{total} ok ({100.0 * stats.ok / total:.0f} %), worst ok {stats.worst:.2f} s, failures {stats.reasons}")
    if args.pid:
        print(f"proxy peak VmRSS: {peak[0]:.0f} MiB")


if __name__ == "__main__":
    asyncio.run(main())
