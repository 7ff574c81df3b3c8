"""Single-connection TCP throughput through an L4 proxy: the gateway's `streams` against nginx
`stream` and HAProxy `mode tcp`, each on one core.

    python3 benches/harness/l4_bulk.py [--gateway target/dist/gateway] [--rounds 5]
                                       [--seconds 5] [--csv out.csv]

An iperf3 server (the sink) and the iperf3 client run on CPU 0, the proxy under test on CPU 1.
Each round pushes one TCP connection's worth of data for `--seconds` through every proxy in turn
(interleaved, so a slow minute hits all alike), in both directions (`-R`: the proxy's upstream
side sends). Per run: the throughput iperf3 measured and the proxy's CPU time (user + system
from /proc) per GiB moved, which is the steadier figure on a shared machine: on loopback the
client and the sink compete with each other for CPU 0, so throughput is often theirs, not the
proxy's. Medians with min–max are printed as a Markdown table.

Needs iperf3 (Debian's iperf3), nginx with its stream module and haproxy; missing peers are
skipped and said so.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import procstat  # noqa: E402

LOAD_CPU, SERVER_CPU = "0", "1"
SINK, BASE = 22081, 22100

GATEWAY = """server: {{ worker_threads: 1, watch_config: false, drain_timeout: 1s }}
upstreams:
  sink: {{ targets: [127.0.0.1:{sink}] }}
streams:
  - name: bulk
    bind: 127.0.0.1:{port}
    protocol: tcp
    upstream: sink
"""

NGINX = """load_module /usr/lib/nginx/modules/ngx_stream_module.so;
worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 1024; }}
stream {{ server {{ listen 127.0.0.1:{port}; proxy_pass 127.0.0.1:{sink}; }} }}
"""

HAPROXY = """global
    nbthread 1
defaults
    mode tcp
    timeout connect 5s
    timeout client 120s
    timeout server 120s
listen bulk
    bind 127.0.0.1:{port}
    server s1 127.0.0.1:{sink}
"""


def start(kind: str, binary: str, work: Path, port: int) -> subprocess.Popen[bytes] | None:
    pin = ["taskset", "-c", SERVER_CPU]
    values = {"work": work, "port": port, "sink": SINK}
    if kind == "gateway":
        cfg = work / "gateway.yaml"
        cfg.write_text(GATEWAY.format(**values))
        cmd = pin + [binary, "run", "--config", str(cfg)]
    elif kind == "nginx":
        if not Path("/usr/lib/nginx/modules/ngx_stream_module.so").exists():
            return None
        cfg = work / "nginx.conf"
        cfg.write_text(NGINX.format(**values))
        cmd = pin + [binary, "-c", str(cfg), "-e", str(work / "nginx-error.log")]
    else:
        cfg = work / "haproxy.cfg"
        cfg.write_text(HAPROXY.format(**values))
        cmd = pin + [binary, "-f", str(cfg)]
    log = open(work / f"{kind}.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(100):
        time.sleep(0.1)
        try:
            with __import__("socket").create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            if proc.poll() is not None:
                return None
    proc.kill()
    return None


def iperf(port: int, seconds: int, reverse: bool) -> float:
    """One connection for `seconds`; returns the receiver's bits per second."""
    cmd = ["taskset", "-c", LOAD_CPU, "iperf3", "-c", "127.0.0.1", "-p", str(port), "-P", "1"]
    cmd += ["-t", str(seconds), "-J"] + (["-R"] if reverse else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30).stdout
    return float(json.loads(out)["end"]["sum_received"]["bits_per_second"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gateway", default="target/dist/gateway")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--csv", default="")
    args = ap.parse_args()
    if not shutil.which("iperf3"):
        print("iperf3 is not installed (Debian: apt-get install iperf3)", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="l4-bulk-"))
    sink = subprocess.Popen(
        ["taskset", "-c", LOAD_CPU, "iperf3", "-s", "-p", str(SINK)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    dma = procstat.hold_cpu_dma_latency()
    peers = {"gateway": args.gateway, "nginx": shutil.which("nginx"), "haproxy": shutil.which("haproxy")}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for i, (kind, binary) in enumerate(peers.items()):
            proc = start(kind, binary, work, BASE + i) if binary else None
            if proc is None:
                print(f"skipped: {kind} (not installed or did not start)", file=sys.stderr)
                continue
            procs[kind] = proc
        rows = []
        for direction in ["client→upstream", "upstream→client"]:
            for r in range(args.rounds + 1):  # round 0 is the warm-up
                for i, kind in enumerate(peers):
                    if kind not in procs:
                        continue
                    pids = procstat.process_tree(procs[kind].pid)
                    cpu0 = procstat.cpu_seconds(pids)
                    bps = iperf(BASE + i, args.seconds, direction == "upstream→client")
                    cpu = procstat.cpu_seconds(pids) - cpu0
                    gib = bps * args.seconds / 8 / 2**30
                    if r == 0:
                        continue
                    row = {"direction": direction, "server": kind, "round": r,
                           "gbit_s": bps / 1e9, "cpu_s_per_gib": cpu / gib if gib else 0.0}
                    rows.append(row)
                    print(f"[l4-bulk] {direction} r{r} {kind:8} {bps / 1e9:6.2f} Gbit/s "
                          f"{row['cpu_s_per_gib']:.3f} CPU s/GiB", file=sys.stderr)
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
        print("| direction | server | Gbit/s, median (min–max) | proxy CPU s per GiB, median (min–max) |")
        print("|---|---|---|---|")
        for direction in ["client→upstream", "upstream→client"]:
            for kind in procs:
                sel = [x for x in rows if x["server"] == kind and x["direction"] == direction]
                g = [x["gbit_s"] for x in sel]
                c = [x["cpu_s_per_gib"] for x in sel]
                print(f"| {direction} | {kind} | {statistics.median(g):.2f} ({min(g):.2f}–{max(g):.2f}) "
                      f"| {statistics.median(c):.3f} ({min(c):.3f}–{max(c):.3f}) |")
    finally:
        for p in list(procs.values()) + [sink]:
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        if dma is not None:
            os.close(dma)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
