#!/usr/bin/env python3
"""Waits for a state of the CI cluster's Prometheus, through its HTTP API (ansible/ci/deploy-test.sh).

usage: prom-check.py URL targets N TIMEOUT_S
           every active target of the quire-bookie and quire-proxy jobs is up, and there are N
       prom-check.py URL alert NAME INSTANCE firing|resolved TIMEOUT_S
           alert NAME for the target INSTANCE is firing / is not pending or firing any more
Prints what it saw; exit 1 when the state is not reached in time.
"""
import json
import sys
import time
import urllib.request


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["data"]


def targets(base, want):
    active = [t for t in get(base + "/api/v1/targets")["activeTargets"]
              if t["labels"].get("job") in ("quire-bookie", "quire-proxy")]
    up = [t for t in active if t["health"] == "up"]
    seen = sorted(f'{t["labels"]["job"]}/{t["labels"].get("host")}:{t["health"]}' for t in active)
    return len(active) == want and len(up) == want, seen


def alert(base, name, instance, state):
    alerts = [a for a in get(base + "/api/v1/alerts")["alerts"]
              if a["labels"].get("alertname") == name and a["labels"].get("instance") == instance]
    states = [a["state"] for a in alerts]
    ok = "firing" in states if state == "firing" else not alerts
    return ok, states


def main():
    base, what = sys.argv[1].rstrip("/"), sys.argv[2]
    timeout = float(sys.argv[-1])
    check = (lambda: targets(base, int(sys.argv[3]))) if what == "targets" else \
        (lambda: alert(base, sys.argv[3], sys.argv[4], sys.argv[5]))
    start = time.monotonic()
    seen = None
    while time.monotonic() - start < timeout:
        try:
            ok, seen = check()
        except OSError as e:
            ok, seen = False, f"{base}: {e}"
        if ok:
            print(f"prom-check: {' '.join(sys.argv[2:-1])}: reached in {time.monotonic() - start:.1f} s ({seen})")
            return
        time.sleep(0.25)
    sys.exit(f"prom-check: {' '.join(sys.argv[2:-1])}: not reached in {timeout} s; last seen: {seen}")


if __name__ == "__main__":
    main()
