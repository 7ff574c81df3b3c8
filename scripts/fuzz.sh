#!/usr/bin/env bash
# Runs every cargo-fuzz target of the repository for a bounded time each and reports crashes.
#
#   scripts/fuzz.sh                  every target, 60 s each
#   scripts/fuzz.sh 300              every target, 300 s each
#   scripts/fuzz.sh 120 http1_head   only the named targets
#
# Needs a nightly toolchain and cargo-fuzz (`rustup toolchain install nightly`,
# `cargo install cargo-fuzz`). Not part of scripts/test.sh (too slow); the seed corpora in
# <crate>/fuzz/corpus/<target>/ are replayed by the ordinary unit tests instead.
#
# New inputs the fuzzer finds go to a scratch corpus (target/fuzz-work/<target>/corpus), so the
# repository's seeds stay small; copy an input into the seeds when it is worth keeping. A crash
# stops that target: its input is left in target/fuzz-work/<target>/artifacts/, the script goes
# on with the others and exits 1 at the end. Turn each crash into a regression test (add the
# input to the seed corpus, which the unit tests replay) along with the fix.
#
# Targets are built without a sanitizer: the code under test is safe Rust (the workspace denies
# `unsafe`), and AddressSanitizer's signal handling fights wasmtime's guard-page traps. Set
# FUZZ_SANITIZER=address to build with it anyway.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

seconds=${1:-${FUZZ_SECONDS:-60}}
[ $# -gt 0 ] && shift
only=("$@")

# crate directory : target
all=(
  config:load
  config:origin
  http1:request_framing
  http1:h1_differential
  http1:response_head
  http1:response_chunked
  gateway:router
  gateway:http1_head
  gateway:waf_decode
  gateway:path_normalize
  gateway:host
  gateway:basic_auth
  gateway:cache_control
  gateway:cache_file
  wasm-host:host_calls
  stream-proxy:client_hello
  stream-proxy:proxy_protocol
)

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: a nightly toolchain is needed (rustup toolchain install nightly)" >&2
  exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: cargo-fuzz is needed (cargo install cargo-fuzz)" >&2
  exit 2
fi

work=${FUZZ_WORK:-$root/target/fuzz-work}
# One target directory for every fuzz workspace: they share most dependencies.
target_dir=${FUZZ_TARGET_DIR:-$root/target/fuzz}
sanitizer=${FUZZ_SANITIZER:-none}
failed=()

for entry in "${all[@]}"; do
  dir=${entry%%:*}
  name=${entry#*:}
  if [ ${#only[@]} -gt 0 ] && [[ ! " ${only[*]} " =~ " $name " ]]; then
    continue
  fi
  # Resolve the fuzz workspace's dependencies to the versions the main workspace uses.
  [ -f "$dir/fuzz/Cargo.lock" ] || cp Cargo.lock "$dir/fuzz/Cargo.lock"
  mkdir -p "$work/$name/corpus" "$work/$name/artifacts"
  seeds="$dir/fuzz/corpus/$name"
  echo "== fuzz $name ($dir) for ${seconds}s"
  set +e
  (cd "$dir" && cargo +nightly fuzz run --sanitizer "$sanitizer" --target-dir "$target_dir" \
      "$name" "$work/$name/corpus" "$root/$seeds" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$work/$name/artifacts/") >"$work/$name/last.log" 2>&1
  status=$?
  set -e
  grep -E '^Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb|^#[0-9]+.*cov:' \
    "$work/$name/last.log" | tail -n 4 || true
  if [ "$status" -ne 0 ]; then
    echo "!! $name failed (exit $status); log: $work/$name/last.log" >&2
    grep -E 'panicked at|ERROR: libFuzzer|Test unit written to|^error' "$work/$name/last.log" >&2 || true
    failed+=("$name")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failures in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: no crash"
