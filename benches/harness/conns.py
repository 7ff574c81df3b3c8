#!/usr/bin/env python3
"""`conns-10k`: the memory 10,000 connections take on each protocol, the gateway beside nginx
(and h2o over TLS HTTP/2), a fresh server for every cell so that no cell inherits another's heap.

    python3 benches/harness/conns.py --servers gateway,nginx,h2o --cells plain,tls,h2,slow,idle \\
        --gateway target/dist/gateway --rounds 1

Cells (the server on the server CPU, the load on the load CPU, as bench.py runs them):

- `plain`: wrk, one thread, 10,000 keep-alive HTTP/1.1 connections on /hello for 10 s;
- `tls`: h2load --h1, 10,000 TLS HTTP/1.1 keep-alive connections (ALPN http/1.1), one
  request at a time each, on /static/1k.bin, measured for 10 s after a 5 s warm-up in which
  the handshakes finish. Not wrk: with 10,000 TLS connections on one thread wrk 4.1 stalls
  or loses connections against nginx and the gateway alike, neither server busy
  (docs/benchmarks.md, "10,000 connections per protocol");
- `h2`: h2load, 10,000 TLS connections negotiating h2, one stream each, on /static/1k.bin,
  the same warm-up and window;
- `slow`: 10,000 clients each sending half a request head and holding it (slowclients.py),
  with the header timeout of every server set to `--header-timeout` (the gateway's
  `listeners[].header_read_timeout`, nginx's `client_header_timeout`); counts how many the
  server closed within it;
- `idle`: no load, the server with its plain and TLS listeners 2 s after start.

For each cell and server: RSS 2 s after start (idle), the peak (VmHWM summed over the server's
processes, nginx's master included), RSS 1 s after the load, the load generator's requests and
errors, and memory per connection = (peak − idle) / connections. One CSV row per run goes to
benches/results/conns-<run id>.csv, with a .meta.json beside it; the markdown tables go to
stdout. The configs are bench.py's (configs/), the gateway's without its optional sections.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import http.client
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import bench
import loadgen
import procstat
import slowclients
from servers import CONFIGS, GATEWAY_SECTIONS, Server, drop_sections, fill

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULTS = REPO / "benches" / "results"

KINDS = ["gateway", "nginx", "h2o"]


@dataclass(frozen=True)
class Cell:
    """One measurement: a load (or none) on one port and path of every server that takes part."""

    name: str
    title: str
    tool: str  # wrk | h2load | h2load-h1 | slow | none
    port: str  # a port name of servers.Server.ports
    path: str
    kinds: tuple[str, ...]  # the kinds of server measured in it


CELLS = {
    c.name: c
    for c in [
        Cell("plain", "plain HTTP/1.1 keep-alive", "wrk", "http", "/hello", ("gateway", "nginx")),
        Cell("tls", "TLS HTTP/1.1 keep-alive", "h2load-h1", "tls", "/static/1k.bin",
             ("gateway", "nginx")),
        # h2o's strength is TLS HTTP/2; its /hello is an mruby handler, so it serves the file.
        Cell("h2", "TLS HTTP/2, one stream each", "h2load", "tls", "/static/1k.bin",
             ("gateway", "nginx", "h2o")),
        Cell("slow", "clients each holding half a request head", "slow", "http", "/hello",
             ("gateway", "nginx")),
        Cell("idle", "idle, a plain and a TLS listener", "none", "http", "/hello",
             ("gateway", "nginx")),
    ]
}  # fmt: skip

# The issue's targets for the gateway, in MB (10^6 bytes): the idle cell's RSS, the others' peak.
TARGETS_MB = {"idle": 8, "plain": 30, "tls": 120, "h2": 200, "slow": 30}

COLUMNS = [
    "run_id",
    "label",
    "cell",
    "server",
    "round",
    "tool",
    "path",
    "conns",
    "duration_s",
    "idle_rss_kib",
    "idle_anon_kib",
    "idle_file_kib",
    "peak_rss_kib",
    "sampled_peak_rss_kib",
    "after_rss_kib",
    "per_conn_kib",
    "requests",
    "errors",
    "non2xx",
    "header_timeout_s",
    "slow_slack_s",
    "slow_connected",
    "slow_peak_open",
    "slow_closed_in_time",
    "slow_closed_late",
    "slow_open_at_end",
    "slow_answered",
    "slow_close_p50_s",
    "slow_close_max_s",
]


def log(msg: str) -> None:
    print(f"[conns] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--servers", default="gateway,nginx,h2o", help="of " + ",".join(KINDS))
    p.add_argument("--cells", default=",".join(CELLS), help="of " + ",".join(CELLS))
    p.add_argument("--gateway", type=Path, default=REPO / "target/dist/gateway")
    p.add_argument("--rounds", type=int, default=1, help="each cell this many times per server")
    p.add_argument("--conns", type=int, default=10000, help="connections per cell")
    p.add_argument("--duration", type=int, default=10, help="seconds of wrk and h2load load")
    p.add_argument(
        "--warm-up", type=int, default=5, help="h2load's seconds before its measured window"
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=5.0,
        help="the servers' header timeout in the slow cell, seconds",
    )
    p.add_argument(
        "--slack",
        type=float,
        default=2.0,
        help="seconds past the header timeout a slow client's close still counts as in time",
    )
    p.add_argument("--settle", type=float, default=2.0, help="seconds from start to idle RSS")
    p.add_argument("--port-base", type=int, default=23000, help="ports as bench.py's, from here")
    p.add_argument("--label", default="", help="a note stored with the results (the build)")
    p.add_argument("--out", type=Path, default=None, help="CSV path")
    args = p.parse_args(argv)
    args.gateway = args.gateway.resolve()
    args.server_kinds = names(args.servers, KINDS, "server")
    args.cell_names = names(args.cells, list(CELLS), "cell")
    # What bench.make_servers reads besides these.
    args.compare = None
    return args


def names(text: str, known: list[str], what: str) -> list[str]:
    """The comma-separated names of `text`, each checked against `known`."""
    out = [n.strip() for n in text.split(",") if n.strip()]
    for n in out:
        if n not in known:
            sys.exit(f"unknown {what} {n!r}: one of {', '.join(known)}")
    return out


# === configs ===


def with_listener_option(yaml: str, key: str, value: str) -> str:
    """The gateway config with `key: value` added to every HTTP listener (the entries of the
    top-level `listeners:` list, after their `bind:`), the rest left as it is."""
    out, section = [], ""
    for line in yaml.splitlines(keepends=True):
        if line[:1].isalpha():
            section = line.split(":", 1)[0]
        out.append(line)
        stripped = line.lstrip()
        if section == "listeners" and stripped.startswith("bind:"):
            indent = line[: len(line) - len(stripped)]
            out.append(f"{indent}{key}: {value}\n")
    return "".join(out)


def with_http_directive(conf: str, directive: str) -> str:
    """The nginx config with `directive` (`name value;`) first in its `http` block."""
    lines = conf.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.strip() == "http {":
            return "".join(lines[: i + 1] + [f"    {directive}\n"] + lines[i + 1 :])
    raise ValueError("no `http {` block in the nginx config")


def seconds_text(seconds: float) -> str:
    """A duration as both configs write it: `5s`, or `1500ms` for a fraction."""
    return f"{seconds:g}s" if seconds == int(seconds) else f"{round(seconds * 1000)}ms"


def config_text(server: Server, cell: Cell, header_timeout: float) -> str:
    """The config `server` runs `cell` with: bench.py's template filled in; the gateway's
    without its optional sections (plain and TLS listeners, the L4 stream nginx has too); in
    the slow cell, every server's header timeout set to `header_timeout`."""
    templates = {"gateway": "gateway.yaml", "nginx": "nginx.conf", "h2o": "h2o.conf"}
    text = fill((CONFIGS / templates[server.kind]).read_text(), server.values())
    if server.kind == "gateway":
        text = drop_sections(text, set(GATEWAY_SECTIONS))
    if cell.tool == "slow":
        if server.kind == "gateway":
            text = with_listener_option(text, "header_read_timeout", seconds_text(header_timeout))
        elif server.kind == "nginx":
            text = with_http_directive(
                text, f"client_header_timeout {seconds_text(header_timeout)};"
            )
        else:
            raise ValueError(f"no header timeout for {server.kind}")
    return text


def write_config(server: Server, cell: Cell, header_timeout: float) -> Path:
    suffix = {"gateway": "yaml", "nginx": "conf", "h2o": "conf"}[server.kind]
    path = server.env.work / f"{server.name}-{cell.name}.{suffix}"
    path.write_text(config_text(server, cell, header_timeout))
    return path


# === measuring ===


def per_conn_kib(peak_kib: int, idle_kib: int, conns: int) -> float | None:
    """Memory a connection took: what the peak added to the idle process, over the connections."""
    if conns <= 0:
        return None
    return round((peak_kib - idle_kib) / conns, 3)


def load(server: Server, cell: Cell, args: argparse.Namespace, row: dict[str, object]) -> str:
    """Runs the cell's load against `server`, fills its figures into `row`; the tool's output."""
    url = server.url(cell.port, cell.path)
    if cell.tool == "slow":
        port = server.ports[cell.port]
        res = slowclients.run("127.0.0.1", port, args.conns, args.header_timeout, args.slack)
        row |= {f"slow_{k}": v for k, v in asdict(res).items() if k != "errors"}
        row |= {"errors": res.errors, "header_timeout_s": args.header_timeout,
                "slow_slack_s": args.slack}  # fmt: skip
        return json.dumps(asdict(res))
    if cell.tool == "wrk":
        result = loadgen.wrk("0", url, args.conns, args.duration, False, [])
    else:
        h1 = cell.tool == "h2load-h1"
        result = loadgen.h2load("0", url, args.conns, 1, args.duration, h1, args.warm_up)
    row |= {"requests": result.requests, "errors": result.errors, "non2xx": result.non2xx}
    return result.raw


def measure(server: Server, cell: Cell, args: argparse.Namespace) -> tuple[dict, str]:
    """One fresh run of `server` in `cell`: started, measured, stopped."""
    server.start_with(write_config(server, cell, args.header_timeout))
    try:
        time.sleep(args.settle)
        pids = server.pids()
        row: dict[str, object] = {
            "idle_rss_kib": procstat.rss_kib(pids),
            # Heap and stacks apart from the binary's and libraries' pages: only the first
            # depends on the code's data structures.
            "idle_anon_kib": procstat.status_kib(pids, "RssAnon"),
            "idle_file_kib": procstat.status_kib(pids, "RssFile"),
        }
        raw = ""
        t0 = time.monotonic()
        if cell.tool != "none":
            check_answer(server, server.url(cell.port, cell.path))
            with procstat.RssSampler(pids) as sampled:
                raw = load(server, cell, args, row)
            row["sampled_peak_rss_kib"] = sampled.peak
            row["peak_rss_kib"] = procstat.hwm_kib(pids)
            row["duration_s"] = round(time.monotonic() - t0, 3)
            row["conns"] = args.conns
            time.sleep(1.0)
            row["after_rss_kib"] = procstat.rss_kib(pids)
            row["per_conn_kib"] = per_conn_kib(
                int(row["peak_rss_kib"]), int(row["idle_rss_kib"]), args.conns
            )
        else:
            row["peak_rss_kib"] = procstat.hwm_kib(pids)
            row["after_rss_kib"] = row["idle_rss_kib"]
        if not server.alive():
            raise RuntimeError(f"{server.name} died during the {cell.name} cell")
    finally:
        server.stop()
    return row, raw


def check_answer(server: Server, url: str) -> None:
    """One request before the load: a server that does not answer 200 is not measured."""
    try:
        status, _, _ = bench.probe(url, [])
    except (OSError, http.client.HTTPException) as e:
        raise RuntimeError(f"{server.name}: {url} failed: {e}") from None
    if status != 200:
        raise RuntimeError(f"{server.name}: {url} answered {status}")


# === report ===


def num(v: object) -> float | None:
    if v is None or v == "":
        return None
    return float(v)  # type: ignore[arg-type]


def group(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """The rows of each (cell, server), in the order they first appear."""
    out: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        out.setdefault((str(r["cell"]), str(r["server"])), []).append(r)
    return out


def median(rows: list[dict], col: str) -> float | None:
    vals = [v for r in rows if (v := num(r.get(col))) is not None]
    return statistics.median(vals) if vals else None


def fmt_mib(kib: float | None) -> str:
    return "—" if kib is None else f"{kib / 1024:.1f}"


def fmt_peak(rows: list[dict]) -> str:
    """The median peak in MiB, with the rounds' range when there are several."""
    vals = sorted(v for r in rows if (v := num(r.get("peak_rss_kib"))) is not None)
    if not vals:
        return "—"
    text = fmt_mib(statistics.median(vals))
    return text if len(vals) < 2 else f"{text} ({fmt_mib(vals[0])}–{fmt_mib(vals[-1])})"


def fmt_int(v: float | None) -> str:
    return "—" if v is None else f"{round(v):,}"


def slow_note(rows: list[dict]) -> str:
    """How the server ended the slow clients (medians of the rounds)."""
    closed, conns = median(rows, "slow_closed_in_time"), median(rows, "conns")
    if closed is None or conns is None:
        return ""
    timeout, slack = median(rows, "header_timeout_s"), median(rows, "slow_slack_s") or 0
    p50 = median(rows, "slow_close_p50_s")
    text = f"closed {fmt_int(closed)} of {fmt_int(conns)} within {timeout:g} s + {slack:g} s"
    if p50 is not None:
        text += f" (median {p50:.1f} s)"
    late, still = median(rows, "slow_closed_late"), median(rows, "slow_open_at_end")
    if late:
        text += f", {fmt_int(late)} later"
    if still:
        text += f", {fmt_int(still)} never"
    peak_open = median(rows, "slow_peak_open")
    if peak_open is not None and peak_open < conns:
        text += f"; at most {fmt_int(peak_open)} open at once"
    return text


def table(rows: list[dict]) -> list[str]:
    """The markdown table of every (cell, server): medians of the rounds."""
    out = [
        "| cell | server | idle RSS MiB | peak RSS MiB | RSS after MiB | KiB per connection "
        "| requests | errors | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (cell, server), rs in group(rows).items():
        per = median(rs, "per_conn_kib")
        note = slow_note(rs) if cell == "slow" else ""
        non2xx = median(rs, "non2xx")
        if non2xx:
            note = f"{fmt_int(non2xx)} non-2xx"
        out.append(
            f"| {cell} | {server} | {fmt_mib(median(rs, 'idle_rss_kib'))} | {fmt_peak(rs)} "
            f"| {fmt_mib(median(rs, 'after_rss_kib'))} | {'—' if per is None else f'{per:.2f}'} "
            f"| {fmt_int(median(rs, 'requests'))} | {fmt_int(median(rs, 'errors'))} | {note} |"
        )
    return out


def targets(rows: list[dict]) -> list[str]:
    """The issue's targets against the gateway's medians, beside nginx's same figure."""
    out = ["| cell | target (gateway) | gateway | nginx | met |", "|---|---|---|---|---|"]
    groups = group(rows)
    for cell, limit in TARGETS_MB.items():
        gw = groups.get((cell, "gateway"))
        if not gw:
            continue
        col = "idle_rss_kib" if cell == "idle" else "peak_rss_kib"
        what = "idle RSS" if cell == "idle" else "peak"
        mine = median(gw, col)
        peer = median(groups.get((cell, "nginx"), []), col)
        mb = [None if v is None else v * 1024 / 1e6 for v in (mine, peer)]
        met = "—" if mb[0] is None else ("yes" if mb[0] <= limit else "no")
        shown = ["—" if v is None else f"{v:.1f} MB" for v in mb]
        out.append(f"| {cell} | {what} ≤ {limit} MB | {shown[0]} | {shown[1]} | {met} |")
    return out


def untrusted(rows: list[dict]) -> list[str]:
    """Cells where nginx saw errors: the reference itself failed, so the gateway's figure
    there is not compared until nginx runs clean."""
    out = []
    for (cell, server), rs in group(rows).items():
        errors = sum(int(num(r.get("errors")) or 0) for r in rs)
        if server == "nginx" and errors:
            out.append(f"{cell}: nginx had {errors:,} errors; do not compare this cell")
    return out


def render(rows: list[dict]) -> str:
    lines = table(rows)
    if any(r["server"] == "gateway" for r in rows):
        lines += ["", *targets(rows)]
    if warn := untrusted(rows):
        lines += ["", *(f"- {w}" for w in warn)]
    return "\n".join(lines) + "\n"


# === the run ===


def listened(port: int) -> bool:
    """Whether a socket listens on 127.0.0.1:port. bench.py's check (a plain bind) also
    fails on a port whose last server closed thousands of connections, which sit in
    TIME_WAIT for a minute; the servers bind with SO_REUSEADDR, and so does this check."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def plan(args: argparse.Namespace, servers: list[Server]) -> list[tuple[int, Cell, Server]]:
    """Every (round, cell, server) in the order run: cells in turn, the servers of a cell in
    bench.py's order for that round (reversed every other round)."""
    out = []
    for rnd in range(1, args.rounds + 1):
        for name in args.cell_names:
            cell = CELLS[name]
            these = [s for s in servers if s.kind in cell.kinds]
            out += [(rnd, cell, s) for s in bench.round_order(these, rnd)]
    return out


def setup(args: argparse.Namespace, work: Path) -> list[Server]:
    env = bench.prepare_files(work)
    env.backend_port = args.port_base + 80  # named by the configs; nothing here proxies to it
    args.servers = ",".join(args.server_kinds)
    servers = bench.make_servers(args, env)
    busy = [f"{s.name}:{port}" for s in servers for port in s.ports.values() if listened(port)]
    if busy:
        sys.exit(f"ports in use: {', '.join(busy)}; pick others with --port-base")
    # The binary's resident code depends on how much of its file is cached (bench.py says why).
    for s in servers:
        if s.binary is not None:
            bench.cache_whole_file(s.binary)
    return servers


def run(args: argparse.Namespace, servers: list[Server], run_id: str, out: Path) -> list[dict]:
    rows: list[dict] = []
    raw_dir = RESULTS / "raw" / run_id
    raw_dir.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for rnd, cell, server in plan(args, servers):
            log(f"r{rnd} {cell.name}: {server.name}")
            try:
                row, raw = measure(server, cell, args)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                log(f"  {e}")
                continue
            (raw_dir / f"conns-{cell.name}-{server.name}-r{rnd}.txt").write_text(raw)
            row |= {
                "run_id": run_id,
                "label": args.label,
                "cell": cell.name,
                "server": server.name,
                "round": rnd,
                "tool": cell.tool,
                "path": cell.path,
            }
            w.writerow(row)
            f.flush()
            rows.append(row)
            log(
                f"  idle {fmt_mib(row['idle_rss_kib'])} peak {fmt_mib(row['peak_rss_kib'])} "
                f"after {fmt_mib(row['after_rss_kib'])} MiB, requests {row.get('requests')}, "
                f"errors {row.get('errors')}"
            )
    return rows


def meta(args: argparse.Namespace, servers: list[Server], run_id: str, commit: str) -> dict:
    return {
        "run_id": run_id,
        "label": args.label,
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "harness_commit": commit,
        "cells": args.cell_names,
        "servers": [s.name for s in servers],
        "rounds": args.rounds,
        "conns": args.conns,
        "duration_s": args.duration,
        "warm_up_s": args.warm_up,
        "header_timeout_s": args.header_timeout,
        "slack_s": args.slack,
        "settle_s": args.settle,
        "open_files_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "machine": bench.machine(),
        "versions": {
            k: v
            for k, v in bench.versions(servers, args).items()
            if v and k in {*KINDS, "wrk", "h2load"}
        },
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # Stay off the server CPU (the slow clients run in this process); 10,000 connections need
    # more descriptors than the default, in this process and in what it starts.
    os.sched_setaffinity(0, {0})
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.conns + 1000:
        log(f"open-files limit is {hard}: {args.conns} connections may see errors")
    for tool in ("wrk", "h2load", "taskset", "openssl"):
        if not bench.have(tool):
            sys.exit(f"{tool} is not installed: run benches/harness/run.sh, which installs it")

    run_id = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    commit = bench.git_commit()
    out = args.out or RESULTS / f"conns-{run_id}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gateway-conns-"))
    try:
        servers = setup(args, work)
        rows = run(args, servers, run_id, out)
        out.with_suffix(".meta.json").write_text(
            json.dumps(meta(args, servers, run_id, commit), indent=2) + "\n"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"results: {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    print(render(rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
