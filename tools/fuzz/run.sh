#!/usr/bin/env bash
# Runs libFuzzer on the decoder checks (issue 12 item 7).
#   tools/fuzz/run.sh                 every target, 60 s each
#   tools/fuzz/run.sh TARGET SECONDS  one target
# Needs a nightly toolchain (rustup) and cargo-fuzz (installed here if missing). New inputs that
# reach new code go to tools/fuzz/corpus/TARGET/ (the checked-in corpus, which the seeded test in
# CI replays); a crash is written to tools/fuzz/libfuzzer/artifacts/TARGET/ and replays with
#   cargo +nightly fuzz run --fuzz-dir tools/fuzz/libfuzzer TARGET ARTIFACT
set -eu
cd "$(dirname "$0")"
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "run.sh: a nightly toolchain is needed (rustup toolchain install nightly)" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
targets=("$@")
seconds=60
if [ $# -ge 2 ]; then
    targets=("$1")
    seconds="$2"
elif [ $# -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir libfuzzer)
fi
cargo run --release -p quire-fuzz --example seed_corpus
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    echo "run.sh: fuzzing $t for $seconds s"
    cargo +nightly fuzz run --fuzz-dir libfuzzer "$t" "corpus/$t" -- \
        -max_total_time="$seconds" -max_len=65536 -use_value_profile=1 -print_final_stats=1
done
