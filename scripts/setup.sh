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
