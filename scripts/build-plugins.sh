#!/usr/bin/env bash
# Builds every plugin under plugins/ to wasm32-wasip1 (release: opt-level "s", LTO), and the Go
# example when Go is installed. Idempotent: cargo and go rebuild only what changed. Outputs land
# in plugins/target/wasm32-wasip1/release/*.wasm, where the end-to-end tests look for them.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[build-plugins] %s\n' "$*" >&2; }

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
  log "adding the wasm32-wasip1 Rust target"
  rustup target add wasm32-wasip1
fi

log "building the Rust plugins"
cargo build --quiet --release --target wasm32-wasip1 --manifest-path plugins/Cargo.toml

out=plugins/target/wasm32-wasip1/release
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
if [ -x "$GO" ] || command -v "$GO" >/dev/null 2>&1; then
  for dir in plugins/go-*/; do
    [ -f "$dir/go.mod" ] || continue
    name=$(basename "$dir" | tr '-' '_')
    log "building the Go plugin $name"
    (cd "$dir" && GOOS=wasip1 GOARCH=wasm GOFLAGS=-mod=mod "$GO" build -buildmode=c-shared -o "../../$out/$name.wasm" .) \
      || log "Go plugin $name did not build; its test will say so and skip"
  done
else
  log "Go not found; the Go plugin test will say so and skip"
fi
