#!/usr/bin/env bash
# Installs what the test suite needs, idempotently: the wasm32-wasip1 Rust target (plugins),
# openssl (RSA test keys) and the Debian packages some tests drive. Safe to run repeatedly.
set -euo pipefail

log() { printf '[setup] %s\n' "$*" >&2; }

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
  log "adding the wasm32-wasip1 Rust target"
  rustup target add wasm32-wasip1
fi

need_apt=()
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
# jemalloc, the gateway binary's allocator, is built from source with make.
command -v make >/dev/null 2>&1 || need_apt+=(make)
# The service unit in dist/systemd is checked with `systemd-analyze verify`.
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
if [ ${#need_apt[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    log "installing Debian packages: ${need_apt[*]}"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq >/dev/null || true
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null || log "could not install ${need_apt[*]}; tests needing them will say so and skip"
  else
    log "apt-get not found; tests needing ${need_apt[*]} will say so and skip"
  fi
fi

# h2spec, the HTTP/2 conformance suite the conformance test runs, when Go is available (the
# module proxy is asked for this exact version). Without it that test says why and skips.
H2SPEC_VERSION="v2.2.1+incompatible"
if command -v go >/dev/null 2>&1; then
  h2spec_bin="$(go env GOPATH)/bin/h2spec"
  if [ ! -x "$h2spec_bin" ]; then
    log "installing h2spec ${H2SPEC_VERSION}"
    go install "github.com/summerwind/h2spec/cmd/h2spec@${H2SPEC_VERSION}" >/dev/null 2>&1 \
      || log "could not install h2spec; the conformance test will say so and skip"
  fi
else
  log "go not found; the HTTP/2 conformance test (h2spec) will say so and skip"
fi

# Pebble (a test ACME CA) and its challenge test server for the automatic-HTTPS tests, when Go
# is available; installed into $(go env GOPATH)/bin, where the tests look for them.
PEBBLE_VERSION=v2.8.0
if command -v go >/dev/null 2>&1; then
  gobin="$(go env GOPATH)/bin"
  for tool in pebble pebble-challtestsrv; do
    if [ ! -x "$gobin/$tool" ]; then
      log "installing $tool ${PEBBLE_VERSION}"
      go install "github.com/letsencrypt/pebble/v2/cmd/$tool@${PEBBLE_VERSION}" >/dev/null 2>&1 \
        || log "could not install $tool; the ACME tests will say so and skip"
    fi
  done
else
  log "go not found; the ACME tests (Pebble) will say so and skip"
fi

# etcd, kube-apiserver and the Gateway API CRDs for the Kubernetes controller's tests, built
# once per machine into a cache outside the repository (a warm run returns at once).
bash "$(dirname "$0")/kube-env.sh" || log "could not build the Kubernetes test environment; those tests will say so and skip"
