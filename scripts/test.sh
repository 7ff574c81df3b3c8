#!/usr/bin/env bash
# The whole test suite, from a fresh clone: set-up, plugin builds, format and lint checks,
# the benchmark harness's own checks, then every test in the workspace (unit, config golden
# tests, end to end). Debug builds only.
set -euo pipefail
cd "$(dirname "$0")/.."

# A one-shot build gains nothing from incremental state, which would add gigabytes to target/.
# Set CARGO_INCREMENTAL=1 yourself when iterating with this script.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

bash scripts/setup.sh
if [ -f scripts/build-plugins.sh ]; then
  bash scripts/build-plugins.sh
fi

echo "== benchmark harness: round order, the same answer from every server, verdicts"
PYTHONDONTWRITEBYTECODE=1 python3 -m unittest discover -s benches/harness -p 'test_*.py'

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "== cargo build (gateway binary used by CLI tests)"
cargo build -p gateway --bin gateway --quiet

echo "== cargo test (unit, golden, end to end; criterion benches run once in test mode)"
cargo test --workspace --lib --bins --tests --examples --quiet -- --test-threads="${TEST_THREADS:-4}"
# criterion benches take their own arguments, not libtest's
cargo test --workspace --benches --quiet
cargo test --workspace --doc --quiet
