#!/usr/bin/env bash
# Prints the path of the load driver: the quire command's one integration-test binary
# (tools/tests/it), from the workspace build command of scripts/test (a no-op once that has
# run, so it only asks cargo where the binary is). Used by deploy-test.sh, and by .ci/run once
# before it starts deploy-test.sh beside ./scripts/test (QUIRE_LOAD_BIN), so that the
# deployment test does not wait for cargo's lock while clippy holds it.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --workspace --tests --bins --release --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if (m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "it"
            and m.get("manifest_path", "").endswith("tools/Cargo.toml") and m.get("executable")):
        print(m["executable"])
'
