#!/usr/bin/env bash
# Soak test: the release gateway under steady load for a long time (10 minutes by default)
# while holding thousands of idle keep-alive connections; its RSS is sampled every few seconds
# and the run fails when RSS grows more than a threshold after the warm-up.
#
#   scripts/soak.sh                       10 minutes
#   SOAK_SECONDS=180 scripts/soak.sh      3 minutes
#
# Settings (environment): SOAK_SECONDS (600), SOAK_WARMUP (60, or a fifth of a shorter run),
# SOAK_SAMPLE (5 s between RSS samples), SOAK_MAX_GROWTH_PCT (10), SOAK_IDLE (10000 idle
# keep-alive connections held for the whole run), SOAK_CONNECTIONS (64 busy connections),
# GATEWAY_BIN (default: target/release/gateway, built if missing).
#
# Load comes from wrk when installed, else h2load, else the workspace's own `loadgen`
# (benches/src/bin/loadgen.rs). The mix: a `respond` route, a `headers` filter, a proxied
# route (to a second listener of the same gateway, so the upstream pool is exercised) and a
# small static file. Not part of scripts/test.sh. Results: target/soak/ (rss.csv, logs).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

duration=${SOAK_SECONDS:-600}
warmup=${SOAK_WARMUP:-$(( duration >= 300 ? 60 : duration / 5 ))}
sample=${SOAK_SAMPLE:-5}
max_growth=${SOAK_MAX_GROWTH_PCT:-10}
idle=${SOAK_IDLE:-10000}
busy=${SOAK_CONNECTIONS:-64}
out=$root/target/soak
mkdir -p "$out"

log() { printf '[soak] %s\n' "$*" >&2; }

# Every idle connection is a descriptor in the gateway and one in the holder.
want_fds=$(( idle + busy * 4 + 1024 ))
if [ "$(ulimit -n)" -lt "$want_fds" ]; then
  ulimit -n "$want_fds" 2>/dev/null || {
    hard=$(ulimit -Hn)
    log "open files limit is $(ulimit -n) (hard $hard); holding fewer idle connections"
    ulimit -n "$hard"
    idle=$(( hard - busy * 4 - 1024 ))
    [ "$idle" -lt 0 ] && idle=0
  }
fi

bin=${GATEWAY_BIN:-$root/target/release/gateway}
if [ ! -x "$bin" ]; then
  log "building the release gateway (slow: fat LTO)"
  cargo build --release -p gateway --bin gateway --quiet
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
upstream_port=$(free_port)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${gw_pid:-}" ] && kill "$gw_pid" 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$work/public/static"
head -c 16384 /dev/urandom >"$work/public/static/file.bin"
cat >"$work/gateway.yaml" <<YAML
server: { watch_config: false, drain_timeout: 2s }
listeners:
  - name: main
    bind: 127.0.0.1:$port
    idle_timeout: 1h
  - name: upstream
    bind: 127.0.0.1:$upstream_port
upstreams:
  self: { targets: ["127.0.0.1:$upstream_port"] }
routes:
  - name: origin
    listeners: [upstream]
    match: { path_prefix: / }
    respond: { status: 200, body: "from the upstream listener\n" }
  - name: hello
    listeners: [main]
    match: { path: /hello }
    respond: { status: 200, body: "Hello, world!\n" }
  - name: filtered
    listeners: [main]
    match: { path: /filtered }
    filters:
      - headers: { response_set: { x-soak: "1" }, response_remove: [server] }
    respond: { status: 200, body: "filtered\n" }
  - name: proxied
    listeners: [main]
    match: { path_prefix: /proxy }
    proxy: { upstream: self }
  - name: files
    listeners: [main]
    match: { path_prefix: /static/ }
    static: { root: public }
YAML
"$bin" validate --config "$work/gateway.yaml" >/dev/null
"$bin" run --config "$work/gateway.yaml" 2>"$out/gateway.log" &
gw_pid=$!
for _ in $(seq 100); do
  curl -fsS "http://127.0.0.1:$port/hello" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$port/static/file.bin" -o /dev/null || { log "the static route does not answer"; exit 1; }

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$gw_pid/status"; }
log "gateway pid $gw_pid on :$port, idle RSS $(rss_kib) KiB"

# Idle keep-alive connections: each sends one request, reads the answer, then stays open.
if [ "$idle" -gt 0 ]; then
  python3 - "$port" "$idle" "$duration" >"$out/idle.log" 2>&1 <<'PY' &
import socket, sys, time
port, n, duration = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
held = []
req = b"GET /hello HTTP/1.1\r\nHost: soak\r\n\r\n"
start = time.time()
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(req)
    if not s.recv(4096).startswith(b"HTTP/1.1 200"):
        sys.exit(f"connection {i}: bad answer")
    held.append(s)
print(f"{n} idle keep-alive connections open after {time.time() - start:.1f}s", flush=True)
time.sleep(duration + 5)
PY
  holder=$!
  for _ in $(seq 600); do
    grep -q "idle keep-alive connections open" "$out/idle.log" 2>/dev/null && break
    kill -0 "$holder" 2>/dev/null || { log "idle holder failed: $(cat "$out/idle.log")"; exit 1; }
    sleep 0.2
  done
  log "$(cat "$out/idle.log"); RSS $(rss_kib) KiB"
  t0=$(date +%s%N)
  curl -fsS "http://127.0.0.1:$port/hello" >/dev/null
  log "a new request while they are held: $(( ($(date +%s%N) - t0) / 1000000 )) ms"
fi

# Busy load for the whole duration, split over the routes.
paths=(/hello /filtered /proxy/x /static/file.bin)
per=$(( busy / ${#paths[@]} )); [ "$per" -lt 1 ] && per=1
load_pids=()
if command -v wrk >/dev/null 2>&1; then
  tool=wrk
  for p in "${paths[@]}"; do
    wrk -t1 -c"$per" -d"${duration}s" --latency "http://127.0.0.1:$port$p" >"$out/load${p//\//_}.log" 2>&1 &
    load_pids+=($!)
  done
elif command -v h2load >/dev/null 2>&1; then
  tool=h2load
  for p in "${paths[@]}"; do
    h2load -D "$duration" -c"$per" -m4 --h1 "http://127.0.0.1:$port$p" >"$out/load${p//\//_}.log" 2>&1 &
    load_pids+=($!)
  done
else
  tool=loadgen
  cargo build --release -p gateway-benches --bin loadgen --quiet
  for p in "${paths[@]}"; do
    "$root/target/release/loadgen" "http://127.0.0.1:$port$p" "$per" "$duration" >"$out/load${p//\//_}.log" 2>&1 &
    load_pids+=($!)
  done
fi
log "load: $tool, $busy connections over ${paths[*]} for ${duration}s (warm-up ${warmup}s, samples every ${sample}s)"

echo "seconds,rss_kib" >"$out/rss.csv"
start=$(date +%s)
baseline=""
peak_after=0
while :; do
  now=$(( $(date +%s) - start ))
  [ "$now" -ge "$duration" ] && break
  kill -0 "$gw_pid" 2>/dev/null || { log "the gateway exited"; exit 1; }
  rss=$(rss_kib)
  echo "$now,$rss" >>"$out/rss.csv"
  if [ "$now" -ge "$warmup" ]; then
    [ -z "$baseline" ] && baseline=$rss && log "baseline after warm-up: $baseline KiB"
    [ "$rss" -gt "$peak_after" ] && peak_after=$rss
  fi
  sleep "$sample"
done
for pid in "${load_pids[@]}"; do wait "$pid" || true; done
final=$(rss_kib)
echo "$duration,$final" >>"$out/rss.csv"
[ "$final" -gt "$peak_after" ] && peak_after=$final

for f in "$out"/load_*.log; do
  log "--- $(basename "$f")"
  grep -E 'Requests/sec|Non-2xx|Socket errors|requests:|finished in|status codes|ok,|errors' "$f" >&2 || tail -n 5 "$f" >&2
done
if grep -qE 'Non-2xx|Socket errors: connect [1-9]|errored [1-9]' "$out"/load_*.log; then
  log "some requests failed (see $out)"
  failed_requests=1
fi

[ -z "$baseline" ] && baseline=$final
limit=$(( baseline + baseline * max_growth / 100 ))
log "RSS KiB: baseline $baseline, peak after warm-up $peak_after, final $final, limit $limit (+${max_growth}%)"
log "samples: $out/rss.csv"
if [ "$peak_after" -gt "$limit" ]; then
  log "FAIL: RSS grew more than ${max_growth}% after the warm-up"
  exit 1
fi
[ -n "${failed_requests:-}" ] && exit 1
log "ok"
