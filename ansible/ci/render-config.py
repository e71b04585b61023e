#!/usr/bin/env python3
"""Renders a Quire role's config template with the roles' defaults, the way Ansible would
for one host, and prints it: the default-equality test (tools/src/defaults_test.rs) parses
the output and compares each stated value with the crates' defaults.

usage: render-config.py ROLE TEMPLATE [NAME=YAML-VALUE ...]
e.g.   render-config.py bookie bookie.toml.j2 quire_tls=false

Needs python3 with jinja2 and PyYAML (both come with Ansible, which .ci/run installs).
Host facts are stand-ins: host-1 at 10.0.0.1, one ZooKeeper host zk-1 at 10.0.0.2.
"""
import json
import pathlib
import sys

import jinja2
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]


def combine(base, *others, recursive=False):
    """Ansible's `combine` filter: later dicts win; with recursive, nested dicts merge."""
    out = dict(base)
    for other in others:
        for k, v in other.items():
            if recursive and isinstance(out.get(k), dict) and isinstance(v, dict):
                out[k] = combine(out[k], v, recursive=True)
            else:
                out[k] = v
    return out


def main():
    role, template = sys.argv[1], sys.argv[2]
    ctx = {
        "inventory_hostname": "host-1",
        "ansible_host": "10.0.0.1",
        "ansible_managed": "rendered by ansible/ci/render-config.py",
        "playbook_dir": str(ROOT),
        "inventory_dir": str(ROOT / "ci"),
        "groups": {"zookeeper": ["zk-1"]},
        "hostvars": {"zk-1": {"quire_bind_ip": "10.0.0.2"}},
    }
    for r in ("common", role):
        ctx.update(yaml.safe_load((ROOT / "roles" / r / "defaults" / "main.yml").read_text()) or {})
    for arg in sys.argv[3:]:
        name, value = arg.split("=", 1)
        ctx[name] = yaml.safe_load(value)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True)
    # Ansible's filters that the templates use.
    env.filters["bool"] = lambda v: v if isinstance(v, bool) else str(v).lower() in ("yes", "true", "1", "on")
    env.filters["to_json"] = json.dumps
    env.filters["combine"] = combine
    # Variables refer to each other ("{{ quire_conf_dir }}/bookie.toml"): render until stable.
    for _ in range(10):
        for name, value in list(ctx.items()):
            if isinstance(value, str) and ("{{" in value or "{%" in value):
                ctx[name] = env.from_string(value).render(ctx)
    text = (ROOT / "roles" / role / "templates" / template).read_text()
    sys.stdout.write(env.from_string(text).render(ctx))


if __name__ == "__main__":
    main()
