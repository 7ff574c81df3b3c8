"""The load generators the harness drives, each pinned to the load CPU, and their output parsers.

- wrk (HTTP/1.1, plain and TLS): one thread, no pipelining (wrk sends the next request on a
  connection only after the previous response), `--latency` for the percentiles.
- h2load (HTTP/2 over TLS, or HTTP/1.1 with `--h1`): one thread, N connections × M concurrent
  streams, measuring only after the clients have connected; p50/p99 come from its
  per-request log file.
- h3load (HTTP/3, the project's own, benches/src/bin/h3load.rs): driven like h2load
  (`-c N -m M -D SECONDS URL`, no certificate verification); it prints h2load's summary lines
  (`finished in`, `requests:`, `status codes:`) with wrk-style `50%` / `99%` latency lines, or
  one JSON object with the fields of `Load` (`requests`, `rps`, `p50_ms`, `p99_ms`, `errors`,
  `non2xx`, `transfer_mib_s`).

Every runner returns a `Load` with the same fields whatever the tool.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Load:
    """What one load-generator run measured."""

    requests: int = 0
    rps: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    errors: int = 0
    non2xx: int = 0
    transfer_mib_s: float | None = None
    raw: str = ""


_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}
_SIZE_MIB = {"B": 1 / 1048576, "KB": 1 / 1024, "MB": 1.0, "GB": 1024.0}


def _ms(value: str, unit: str) -> float:
    return float(value) * _UNITS_MS[unit]


def parse_wrk(out: str) -> Load:
    """Parses wrk 4.1's report (`--latency`)."""
    load = Load(raw=out)
    if m := re.search(r"(\d+) requests in", out):
        load.requests = int(m.group(1))
    if m := re.search(r"Requests/sec:\s+([\d.]+)", out):
        load.rps = float(m.group(1))
    for pct, attr in (("50", "p50_ms"), ("99", "p99_ms")):
        if m := re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.M):
            setattr(load, attr, _ms(m.group(1), m.group(2)))
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out):
        load.errors = sum(int(g) for g in m.groups())
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        load.non2xx = int(m.group(1))
    if m := re.search(r"Transfer/sec:\s+([\d.]+)(B|KB|MB|GB)", out):
        load.transfer_mib_s = float(m.group(1)) * _SIZE_MIB[m.group(2)]
    return load


def parse_h2load(out: str) -> Load:
    """Parses h2load's summary (also the format h3load prints)."""
    load = Load(raw=out)
    if m := re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s, ([\d.]+)(B|KB|MB|GB)/s", out):
        load.rps = float(m.group(1))
        load.transfer_mib_s = float(m.group(2)) * _SIZE_MIB[m.group(3)]
    m = re.search(
        r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
        r"(\d+) errored, (\d+) timeout",
        out,
    )
    failed = 0
    if m:
        load.requests = int(m.group(3))
        failed = int(m.group(5))
        load.errors = int(m.group(6)) + int(m.group(7))
    if s := re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out):
        load.non2xx = int(s.group(2)) + int(s.group(3)) + int(s.group(4))
        # `failed` counts 4xx/5xx answers too; what is left failed without a status.
        load.errors = max(load.errors, failed - int(s.group(3)) - int(s.group(4)))
    return load


def percentiles_from_log(path: Path) -> tuple[float | None, float | None]:
    """p50 and p99 (ms) from an h2load --log-file: `start_us <TAB> status <TAB> duration_us`."""
    durations = []
    with path.open() as f:
        for line in f:
            parts = line.split("\t")
            if len(parts) >= 3:
                durations.append(int(parts[2]))
    if len(durations) < 2:
        return None, None
    q = statistics.quantiles(durations, n=100, method="inclusive")
    return q[49] / 1000.0, q[98] / 1000.0


def _run(cmd: list[str], timeout: float) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0 and not proc.stdout:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return proc.stdout + proc.stderr


def wrk(cpu: str, url: str, conns: int, seconds: int, close: bool, headers: list[str]) -> Load:
    """HTTP/1.1 (or HTTPS) with wrk; `close` sends `Connection: close` on every request."""
    cmd = ["taskset", "-c", cpu, "wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--latency"]
    cmd += ["--timeout", "5s"]
    for h in headers + (["Connection: close"] if close else []):
        cmd += ["-H", h]
    return parse_wrk(_run(cmd + [url], timeout=seconds + 60))


def h2load(
    cpu: str,
    url: str,
    conns: int,
    streams: int,
    seconds: int,
    h1: bool = False,
    warm_up: int = 0,
) -> Load:
    """HTTP/2 over TLS with h2load; latency percentiles from its per-request log.

    `h1` speaks HTTP/1.1 instead (over TLS: ALPN http/1.1), one request at a time per
    connection when `streams` is 1. `warm_up` seconds run before the measured window: time
    for thousands of clients to finish their handshakes, which the window would otherwise
    count."""
    with tempfile.NamedTemporaryFile(prefix="h2load-", suffix=".log") as log:
        cmd = ["taskset", "-c", cpu, "h2load", "-t1", f"-c{conns}", f"-m{streams}"]
        cmd += ["--h1"] if h1 else []
        cmd += [f"--warm-up-time={warm_up}s"] if warm_up else []
        cmd += [f"-D{seconds}", f"--log-file={log.name}", url]
        load = parse_h2load(_run(cmd, timeout=warm_up + seconds + 120))
        load.p50_ms, load.p99_ms = percentiles_from_log(Path(log.name))
    return load


def h3load(binary: Path, cpu: str, url: str, conns: int, streams: int, seconds: int) -> Load:
    """HTTP/3 with the project's h3load (h2load's command line; its summary or JSON)."""
    cmd = ["taskset", "-c", cpu, str(binary), f"-c{conns}", f"-m{streams}", f"-D{seconds}"]
    out = _run(cmd + [url], timeout=seconds + 120)
    try:
        j = json.loads(out[out.index("{") : out.rindex("}") + 1])
    except ValueError:
        load = parse_h2load(out)
        wrk_style = parse_wrk(out)
        load.p50_ms, load.p99_ms = wrk_style.p50_ms, wrk_style.p99_ms
        return load
    return Load(
        requests=int(j.get("requests", 0)),
        rps=float(j.get("rps", 0.0)),
        p50_ms=j.get("p50_ms"),
        p99_ms=j.get("p99_ms"),
        errors=int(j.get("errors", 0)),
        non2xx=int(j.get("non2xx", 0)),
        transfer_mib_s=j.get("transfer_mib_s"),
        raw=out,
    )
