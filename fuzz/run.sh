#!/usr/bin/env bash
# Run every cargo-fuzz target for SECONDS each (default 60), starting from the committed seeds.
# CI calls it with a short time and --dev; SECURITY.md describes longer runs. A crash stops the
# script with the failing input under fuzz/artifacts/<target>/; turn it into a regression test.
#
# Usage: fuzz/run.sh [SECONDS] [--dev]
#   --dev  build the targets unoptimised, with debug assertions and overflow checks: cargo-fuzz
#          builds the whole crate as one codegen unit, which optimised took 9 minutes on the
#          2-core machine; a short pass spends its time building, not fuzzing.
#
# cargo-fuzz needs nightly compiler features; RUSTC_BOOTSTRAP=1 unlocks them on stable.
# Install it once with `cargo install cargo-fuzz`.
set -euo pipefail
seconds="${1:-60}"
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
command -v cargo-fuzz >/dev/null || {
    echo "cargo-fuzz is not installed: cargo install cargo-fuzz" >&2
    exit 1
}
targets=(frame_decoder line_splitter config_toml server_config_json run_args)
mode=(--release)
if [[ "${2:-}" == --dev ]]; then mode=(--dev); fi
cargo fuzz build "${mode[@]}"
for t in "${targets[@]}"; do
    # The working corpus is not committed; the seeds are.
    mkdir -p "corpus/$t"
    echo "== $t: ${seconds}s"
    cargo fuzz run "${mode[@]}" "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=1048576 -print_final_stats=1 2>&1 |
        grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==|SUMMARY|.*panicked|Done [0-9]+ runs)" || true
    if [ -n "$(ls -A "artifacts/$t" 2>/dev/null)" ]; then
        echo "!! $t found a crash: $(ls "artifacts/$t")" >&2
        exit 1
    fi
done
