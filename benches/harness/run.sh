#!/usr/bin/env bash
# The side-by-side benchmark in one command:
#
#   bash benches/harness/run.sh [--quick] [--scenarios hello,static-*] [--servers gateway,nginx]
#                               [--compare /path/to/other/gateway] [--rounds N] [--duration S]
#                               [--no-install] [--no-build] [--pgo] [other options of bench.py]
#
# Installs what is missing (idempotently), builds the `dist` binaries, then hands over to
# bench.py, which starts the peers and the gateway, runs the scenarios and writes
# benches/results/<id>.csv, LATEST.csv and the report (docs/benchmarks.md, docs/bench/*.png).
# `python3 benches/harness/bench.py --help` lists every option; `--list` the scenarios.
# `--pgo` measures a profile-guided build of the gateway instead of the plain `dist` build
# (benches/harness/pgo.sh: about 25 minutes more the first time).
set -euo pipefail

cd "$(dirname "$0")/../.."

log() { printf '[run] %s\n' "$*" >&2; }

install=1
build=1
pgo=0
args=()
for a in "$@"; do
  case "$a" in
    --no-install) install=0 ;;
    --no-build) build=0 ;;
    --pgo) pgo=1 ;;
    *) args+=("$a") ;;
  esac
done

if [ "$install" = 1 ]; then
  # Debian's packages of the peers and the load tools. The stream module of nginx is a separate
  # package (the L4 scenario needs it); h2load comes with nghttp2-client. (Pingora, the Rust
  # peer, is built from benches/pingora-proxy below.)
  need=()
  command -v nginx >/dev/null 2>&1 || need+=(nginx)
  [ -f /usr/lib/nginx/modules/ngx_stream_module.so ] || need+=(libnginx-mod-stream)
  command -v caddy >/dev/null 2>&1 || need+=(caddy)
  command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
  command -v h2o >/dev/null 2>&1 || need+=(h2o)
  command -v wrk >/dev/null 2>&1 || need+=(wrk)
  command -v iperf3 >/dev/null 2>&1 || need+=(iperf3)  # benches/harness/l4_bulk.py
  command -v h2load >/dev/null 2>&1 || need+=(nghttp2-client)
  command -v taskset >/dev/null 2>&1 || need+=(util-linux)
  command -v openssl >/dev/null 2>&1 || need+=(openssl)
  if [ ${#need[@]} -gt 0 ]; then
    log "installing Debian packages: ${need[*]}"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
  fi
  # The plots; the CSV and the tables do not need it, so a failure here is not fatal.
  if ! python3 -c 'import matplotlib' 2>/dev/null; then
    log "installing matplotlib"
    python3 -m pip install --quiet matplotlib || log "could not install matplotlib: no plots"
  fi
fi

target_dir="${CARGO_TARGET_DIR:-target}"
if [ "$build" = 1 ]; then
  # The `dist` profile (fat LTO, one codegen unit) is what is packaged, so it is what is
  # measured; it is slow the first time and cargo skips it when nothing changed.
  log "building the gateway (dist profile)"
  cargo build --profile dist -p gateway
  # hyper_hello (the floor of the hello scenario), h3load (the HTTP/3 load generator, when
  # the tree has it) and jwt_fixture (the key set and token of the jwt variant) live in the
  # benches crate.
  log "building hyper_hello, h3load and jwt_fixture (dist profile)"
  cargo build --profile dist -p gateway-benches --bins
  # The Pingora peer: its own Cargo project and target dir, so that its dependencies stay out
  # of the workspace's lock file; bench.py skips Pingora without it.
  log "building the Pingora peer (release)"
  cargo build --release --manifest-path benches/pingora-proxy/Cargo.toml \
    --target-dir "$target_dir/pingora" || log "Pingora build failed: that peer will be skipped"
  # The add-header plugin of the Wasm scenario; bench.py skips that scenario without it.
  if [ -f scripts/build-plugins.sh ]; then
    log "building the Wasm plugins"
    bash scripts/build-plugins.sh || log "plugin build failed: the Wasm scenario will be skipped"
  fi
fi

# 10,000 connections need more than the default 1,024 descriptors, in the load generator and
# in every server: raise the soft limit to the hard one for everything started from here.
ulimit -n "$(ulimit -Hn)"

gateway="$target_dir/dist/gateway"
if [ "$pgo" = 1 ]; then
  log "building the profile-guided gateway"
  gateway="$(bash benches/harness/pgo.sh)"
fi

# Defaults first, so that the caller's own --gateway/--hyper/--h3load win (argparse keeps the last).
exec python3 benches/harness/bench.py \
  --gateway "$gateway" \
  --hyper "$target_dir/dist/hyper_hello" \
  --h3load "$target_dir/dist/h3load" \
  --pingora "$target_dir/pingora/release/pingora-proxy-peer" \
  "${args[@]}"
