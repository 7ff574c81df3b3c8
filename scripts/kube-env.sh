#!/usr/bin/env bash
# Builds the real Kubernetes the Gateway API tests run against: etcd and kube-apiserver from the
# Go module registry at pinned versions, plus the Gateway API standard-channel CRDs and the
# experimental TCPRoute, UDPRoute and TLSRoute ones. Everything
# lands in a cache outside the repository and is built once per machine; a second run only checks
# a stamp. Neither project can be `go install`ed (their go.mod files carry replace directives),
# so each is built from a scratch module that pins what those replaces point at.
#
# Output (the tests look here, or in $GATEWAY_KUBE_DIR):
#   $dir/bin/etcd  $dir/bin/kube-apiserver  $dir/crds/*.yaml
set -euo pipefail

ETCD_VERSION=v3.6.16
KUBE_VERSION=v1.37.2
KUBE_STAGING_VERSION=v0.37.2
GATEWAY_API_VERSION=v1.4.1

dir="${GATEWAY_KUBE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gateway-test/kube}"
stamp="$dir/stamp"
want="etcd=$ETCD_VERSION kube=$KUBE_VERSION gateway-api=$GATEWAY_API_VERSION"
crd_stamp="$dir/crds.stamp"
crd_want="gateway-api=$GATEWAY_API_VERSION standard experimental:tcproutes,udproutes,tlsroutes"
EXPERIMENTAL_CRDS="tcproutes udproutes tlsroutes"

log() { printf '[kube-env] %s\n' "$*" >&2; }

bins_ok() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }
crds_ok() { [ -f "$crd_stamp" ] && [ "$(cat "$crd_stamp")" = "$crd_want" ]; }
if bins_ok && crds_ok; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  log "go not found; the Kubernetes tests will say so and skip (CI=true makes that a failure)"
  exit 0
fi

mkdir -p "$dir/bin" "$dir/crds" "$dir/src"
# Two test runs starting at once must not build twice into the same directory.
exec 9>"$dir/lock"
flock 9

# A module whose only file imports the given main packages, so `go mod tidy` records their deps.
scratch_module() { # name, go.mod body, packages...
  local name=$1 body=$2
  shift 2
  local m="$dir/src/$name"
  rm -rf "$m"
  mkdir -p "$m"
  printf '%s\n' "$body" >"$m/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for p in "$@"; do printf '\t_ "%s"\n' "$p"; done
    printf ')\n'
  } >"$m/tools.go"
  echo "$m"
}

build_etcd() {
  log "building etcd $ETCD_VERSION"
  local m
  m=$(scratch_module etcd "module gateway-test/etcd

go 1.26.0" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/etcdctl/v3)
  (
    cd "$m"
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "go.etcd.io/etcd/etcdctl/v3@$ETCD_VERSION" >/dev/null 2>&1
    go mod tidy >/dev/null 2>&1
    go build -ldflags "-s -w" -o "$dir/bin/etcd.new" go.etcd.io/etcd/server/v3
  )
  mv "$dir/bin/etcd.new" "$dir/bin/etcd"
}

build_kube_apiserver() {
  log "building kube-apiserver $KUBE_VERSION (cold: several minutes and about 3 GB of memory)"
  local gomod replaces m
  gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
  # kubernetes' go.mod points each staging module at ./staging/...; pin them to the published
  # versions of the same release instead.
  replaces=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#replace \1 => \1 '"$KUBE_STAGING_VERSION"'#p' "$gomod")
  m=$(scratch_module kube-apiserver "module gateway-test/kube-apiserver

go 1.26.0

require k8s.io/kubernetes $KUBE_VERSION

$replaces" k8s.io/kubernetes/cmd/kube-apiserver)
  (
    cd "$m"
    go mod tidy >/dev/null 2>&1
    go build -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION" \
      -o "$dir/bin/kube-apiserver.new" k8s.io/kubernetes/cmd/kube-apiserver
  )
  mv "$dir/bin/kube-apiserver.new" "$dir/bin/kube-apiserver"
}

fetch_crds() {
  log "fetching the Gateway API $GATEWAY_API_VERSION standard-channel CRDs"
  local src
  src=$(go mod download -json "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
  rm -f "$dir/crds/"*.yaml
  cp "$src/config/crd/standard/"*.yaml "$dir/crds/"
  for kind in $EXPERIMENTAL_CRDS; do
    cp "$src/config/crd/experimental/gateway.networking.k8s.io_$kind.yaml" "$dir/crds/"
  done
  chmod u+w "$dir/crds/"*.yaml
}

# Versions are in the stamps, so a bump rebuilds what it names.
if ! bins_ok; then
  rm -f "$stamp"
  build_etcd
  build_kube_apiserver
  echo "$want" >"$stamp"
fi
if ! crds_ok; then
  fetch_crds
  echo "$crd_want" >"$crd_stamp"
fi
log "ready in $dir"
