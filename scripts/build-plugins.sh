#!/usr/bin/env bash
# Builds every plugin under plugins/ to wasm32-wasip1 (release: opt-level "s", LTO), and the Go
# plugin and the Go SDK's own examples when Go is installed. Idempotent: cargo and go rebuild
# only what changed. Outputs land in plugins/target/wasm32-wasip1/release/*.wasm, where the
# end-to-end tests look for them.
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

# Builds the Go module in directory $1 to $out/$2.wasm (a wasip1 reactor); says so when it fails.
go_wasm() {
  local dir=$1 name=$2 wasm
  wasm="$(pwd)/$out/$name.wasm"
  (cd "$dir" && GOOS=wasip1 GOARCH=wasm GOFLAGS=-mod=mod "$GO" build -buildmode=c-shared -o "$wasm" .) \
    || log "Go module $name did not build; its test will say so and skip"
}

# The Go SDK's own examples, unchanged but for two mechanical edits, for the compatibility
# tests (tests/tests/e2e/wasm_go_examples.rs). They come from the module registry, never from
# this repository: v0.16.0 of the SDK's original module is its last release whose module holds
# its examples (later ones made each example a module of its own, which the registry does not
# serve). That release predates Go's own wasip1 exports, so each example is built against the
# SDK this repository pins (plugins/go-headers/go.mod), the successor of the same code under
# the proxy-wasm organisation: the import path is renamed, and `main` becomes `init`, which is
# what a wasip1 reactor module runs (`main` stays, empty).
GO_SDK_EXAMPLES_MODULE=github.com/tetratelabs/proxy-wasm-go-sdk
GO_SDK_EXAMPLES_VERSION=v0.16.0
GO_SDK_EXAMPLES="http_headers http_body shared_data http_auth_random"
build_go_sdk_examples() {
  local src work name
  src=$(cd plugins/go-headers && "$GO" mod download -json "$GO_SDK_EXAMPLES_MODULE@$GO_SDK_EXAMPLES_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p') || true
  if [ -z "$src" ] || [ ! -d "$src/examples" ]; then
    log "the Go SDK's examples ($GO_SDK_EXAMPLES_MODULE@$GO_SDK_EXAMPLES_VERSION) are not available; their tests will say so and skip"
    return 0
  fi
  for name in $GO_SDK_EXAMPLES; do
    work=plugins/target/go-sdk-examples/$name
    mkdir -p "$work"
    sed -e "s#$GO_SDK_EXAMPLES_MODULE#github.com/proxy-wasm/proxy-wasm-go-sdk#" \
      -e 's#^func main() {#func init() {#' "$src/examples/$name/main.go" >"$work/main.go"
    printf '\nfunc main() {}\n' >>"$work/main.go"
    sed "s#^module .*#module gateway-test/go-sdk-examples/$name#" plugins/go-headers/go.mod >"$work/go.mod"
    cp plugins/go-headers/go.sum "$work/go.sum"
    log "building the Go SDK example $name"
    go_wasm "$work" "go_example_$name"
  done
}
if [ -x "$GO" ] || command -v "$GO" >/dev/null 2>&1; then
  for dir in plugins/go-*/; do
    [ -f "$dir/go.mod" ] || continue
    name=$(basename "$dir" | tr '-' '_')
    log "building the Go plugin $name"
    go_wasm "$dir" "$name"
  done
  build_go_sdk_examples
else
  log "Go not found; the Go plugin test will say so and skip"
fi
