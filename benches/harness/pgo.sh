#!/usr/bin/env bash
# A profile-guided `dist` build of the gateway:
#
#   bash benches/harness/pgo.sh            # prints the path of the optimised binary
#
# 1. builds the gateway instrumented (`-Cprofile-generate`);
# 2. runs it through the harness's quick pass (every scenario, one concurrency, the gateway
#    alone), which SIGTERMs it at the end of each scenario so the counts are written;
# 3. merges the counts with the toolchain's own llvm-profdata (rustup's `llvm-tools`, the same
#    LLVM as rustc);
# 4. builds the gateway again with `-Cprofile-use`.
#
# Why: the plain build spreads a request's code over so much of `.text` that callgrind
# counts ~100 instruction-cache misses per `respond` request; with the profile, LLVM lays hot
# code out together and inlines by measured frequency (docs/performance-log.md, "Profile-guided
# build"). The profile comes from the benchmark's own scenarios, so the gain it shows is an
# upper bound for other traffic.
#
# Everything lives under $PGO_DIR (default: <target dir>/pgo). The profile's hash is part of
# its file name, so a new profile rebuilds every crate with it (cargo tracks RUSTFLAGS, not the
# file's contents) and an unchanged one reuses the previous build.
set -euo pipefail

cd "$(dirname "$0")/../.."

log() { printf '[pgo] %s\n' "$*" >&2; }

target_dir="${CARGO_TARGET_DIR:-target}"
pgo_dir="${PGO_DIR:-$target_dir/pgo}"
mkdir -p "$pgo_dir"
pgo_dir="$(cd "$pgo_dir" && pwd)"

rustup component add llvm-tools >/dev/null 2>&1 || true
profdata="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
  log "no llvm-profdata at $profdata: install it with 'rustup component add llvm-tools'"
  exit 1
fi

log "building the instrumented gateway"
RUSTFLAGS="-Cprofile-generate=$pgo_dir/data" CARGO_TARGET_DIR="$pgo_dir/gen" \
  cargo build --profile dist -p gateway >&2

log "training: the harness's quick pass with the instrumented gateway alone"
rm -rf "$pgo_dir/data"
mkdir -p "$pgo_dir/data"
python3 benches/harness/bench.py --quick --servers gateway \
  --gateway "$pgo_dir/gen/dist/gateway" \
  --hyper "$target_dir/dist/hyper_hello" --h3load "$target_dir/dist/h3load" \
  --no-report --out "$pgo_dir/training.csv" --label "PGO training run" >&2

"$profdata" merge -o "$pgo_dir/merged.profdata" "$pgo_dir/data"
hash="$(sha256sum "$pgo_dir/merged.profdata" | cut -c1-16)"
mkdir -p "$pgo_dir/profiles"
profile="$pgo_dir/profiles/$hash.profdata"
mv "$pgo_dir/merged.profdata" "$profile"

log "building the gateway with the profile ($hash)"
RUSTFLAGS="-Cprofile-use=$profile" CARGO_TARGET_DIR="$pgo_dir/use" \
  cargo build --profile dist -p gateway >&2
echo "$pgo_dir/use/dist/gateway"
