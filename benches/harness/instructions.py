#!/usr/bin/env python3
"""Instructions per request of the gateway, counted by callgrind, for one or two builds.

The harness's CPU time per request moves by 10 to 30 % from round to round on a shared
two-core host, so a change worth a few per cent cannot be told from that noise there.
callgrind counts the instructions the gateway executes in user space, which repeat from run
to run within about 1 %: the before/after figure of most user-space changes in
docs/performance-log.md. It does not see the kernel, so a change to system calls, or to how many
cache lines a request touches, still needs the harness.

    python3 benches/harness/instructions.py --gateway NEW [--compare OLD] --scenario proxy-close
            [--conns 200] [--warmup 5] [--duration 10] [--top 25] [--keep DIR]

Scenarios: those of the harness that wrk or h2load drive to the gateway's HTTP listeners
(`hello`, `static-*`, `proxy`, `proxy-close`, TLS `tls-h1-1k` and `tls-h2-1k`, the filter
comparisons `wasm`, `waf`, ... on both of their routes, `traced`: the proxy route with every
request traced, the gateway config's opt-in `traced` section on); not HTTP/3 (the project's own
load generator) or the L4 relay.
Each build runs alone under `valgrind --tool=callgrind` on the server CPU with the harness's
gateway config (one worker) and the shared nginx backend, wrk on the load CPU: wrk warms the
gateway up, the counters are zeroed (`callgrind_control -z`), the load runs again for the
measured window, and the counters dumped then are divided by the requests completed in it.
valgrind runs the gateway about 50 times slower, so the load's concurrency is what the
gateway sees, not its rate.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import loadgen
from bench import jwt_fixture, prepare_files
from link_order import self_costs
from scenarios import BY_NAME, Scenario, with_token
from servers import OPT_IN_SECTIONS, Env, Server, have, wait_tcp

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# How long valgrind may take to start the gateway and load its config (Wasm plugins compile
# under valgrind too).
START_TIMEOUT = 120.0


@dataclass
class Counts:
    """One callgrind dump: the instructions of the whole window and of each function alone."""

    total: int
    by_function: dict[str, int]


def read_counts(path: Path) -> Counts:
    """The window's total (callgrind's `summary:` or `totals:` line) and each function's own
    instructions ([`link_order.self_costs`], every object), from a callgrind output file."""
    total = None
    with path.open(errors="replace") as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
    own = self_costs(path, None)
    return Counts(total if total is not None else sum(own.values()), dict(own))


def newest_dump(out: Path, before: set[Path]) -> Path:
    """The dump `callgrind_control -d` wrote: `out.N`, the one that was not there before."""
    fresh = [p for p in out.parent.glob(out.name + ".*") if p not in before]
    if not fresh:
        raise RuntimeError(f"callgrind wrote no dump next to {out}")
    return max(fresh, key=lambda p: p.stat().st_mtime)


def control(flag: str, pid: int) -> None:
    subprocess.run(["callgrind_control", flag, str(pid)], check=True, capture_output=True)


@dataclass
class Measured:
    build: str
    path: str
    requests: int
    counts: Counts

    @property
    def per_request(self) -> float:
        return self.counts.total / self.requests


def countable(sc: Scenario) -> bool:
    """A scenario this counts: wrk or h2load to the gateway's HTTP listeners."""
    return sc.tool in ("wrk", "h2load") and sc.port in ("http", "general", "tls")


def drive(sc: Scenario, cpu: str, url: str, conns: int, seconds: int) -> loadgen.Load:
    """One run of the scenario's load generator with the scenario's settings."""
    if sc.tool == "h2load":
        return loadgen.h2load(cpu, url, conns, sc.streams, seconds)
    return loadgen.wrk(cpu, url, conns, seconds, sc.close, sc.headers)


def opt_in(sc: Scenario) -> set[str]:
    """The opt-in sections of the gateway config the scenario needs (`traced`)."""
    return ({v.needs for v in sc.variants} | {sc.needs}) & OPT_IN_SECTIONS


def paths_of(sc: Scenario) -> list[str]:
    return [v.path for v in sc.variants] if sc.variants else [sc.path]


def measure_build(
    label: str, binary: Path, sc: Scenario, args: argparse.Namespace, env: Env
) -> list[Measured]:
    """Starts `binary` under callgrind and counts each of the scenario's routes in turn."""
    gateway = Server(label, "gateway", args.port_base + 100, env, binary=binary)
    gateway.opt_in = opt_in(sc)
    config = gateway.write_config()
    missing = sorted(gateway.opt_in - gateway.capabilities)
    if missing:
        why = gateway.skipped_sections.get(missing[0], "")
        raise RuntimeError(f"{label}: the build rejects the `{missing[0]}` section: {why}")
    out = env.work / f"callgrind.{label}.out"
    cmd = ["taskset", "-c", env.server_cpu, "valgrind", "--tool=callgrind", "--dump-instr=no"]
    cmd += [f"--callgrind-out-file={out}", str(binary), "run", "--config", str(config)]
    log_path = env.work / f"{label}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, RUST_LOG="warn"),
            cwd=env.work,
        )
    results = []
    try:
        for path in paths_of(sc):
            url = gateway.url(sc.port, path)
            # Under valgrind the listeners open one by one, seconds apart.
            wait_tcp(urlsplit(url).port or 80, proc, timeout=START_TIMEOUT)
            drive(sc, env.backend_cpu, url, args.conns, args.warmup)
            control("-z", proc.pid)
            load = drive(sc, env.backend_cpu, url, args.conns, args.duration)
            before = set(out.parent.glob(out.name + ".*"))
            control("-d", proc.pid)
            dump = newest_dump(out, before)
            if load.requests == 0:
                raise RuntimeError(f"{label} {path}: {sc.tool} completed no request")
            if load.errors or load.non2xx:
                print(
                    f"[instructions] {label} {path}: {load.errors} errors, {load.non2xx} "
                    "non-2xx answers in the window (counted as requests)",
                    file=sys.stderr,
                )
            results.append(Measured(label, path, load.requests, read_counts(dump)))
            if args.keep:
                shutil.copy(dump, args.keep / f"{label}{path.replace('/', '_')}.callgrind")
    except (RuntimeError, subprocess.CalledProcessError) as e:
        tail = log_path.read_text(errors="replace")[-1500:]
        raise RuntimeError(f"{label}: {e}\n{tail}") from None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return results


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gateway", type=Path, default=REPO / "target/dist/gateway")
    p.add_argument("--compare", type=Path, help="another build, measured after the first")
    p.add_argument("--scenario", default="hello", help="a wrk or h2load scenario of the harness")
    p.add_argument(
        "--jwt-fixture",
        type=Path,
        default=REPO / "target/dist/jwt_fixture",
        help="writes the key set and prints the token of the `jwt` variant",
    )
    p.add_argument("--conns", type=int, help="default: the scenario's quick concurrency")
    p.add_argument("--warmup", type=int, default=5, help="seconds of load before counting")
    p.add_argument("--duration", type=int, default=10, help="seconds counted")
    p.add_argument("--top", type=int, default=0, help="functions to list by their own cost")
    p.add_argument("--keep", type=Path, help="a directory to keep the callgrind files in")
    p.add_argument(
        "--plugin", type=Path, default=REPO / "plugins/target/wasm32-wasip1/release/add_header.wasm"
    )
    p.add_argument("--port-base", type=int, default=29000)
    args = p.parse_args(argv)
    sc = BY_NAME.get(args.scenario)
    if sc is None or not countable(sc):
        names = ", ".join(s.name for s in BY_NAME.values() if countable(s))
        p.error(f"--scenario: one of {names}")
    args.sc = sc
    args.conns = args.conns or sc.quick_conns[0]
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    for tool in ("valgrind", "callgrind_control", args.sc.tool, "nginx", "taskset", "openssl"):
        if not have(tool):
            sys.exit(f"{tool} is not installed (valgrind and wrk: the Debian packages of those "
                     "names; h2load: nghttp2-client)")
    builds = [("new", args.gateway)] + ([("old", args.compare)] if args.compare else [])
    for _, binary in builds:
        if not binary.is_file():
            sys.exit(f"no gateway binary at {binary}")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    os.sched_setaffinity(0, {0})
    work = Path(tempfile.mkdtemp(prefix="gateway-instructions-"))
    results: list[Measured] = []
    try:
        env = prepare_files(work)
        env.backend_port = args.port_base + 80
        env.plugin = args.plugin if args.plugin.is_file() else None
        # The `jwt` variant's key set and the one token every request carries.
        env.jwks, token = jwt_fixture(args.jwt_fixture, work)
        args.sc.headers = with_token(args.sc.headers, token)
        backend = Server("backend", "backend", env.backend_port, env)
        backend.start()
        try:
            for label, binary in builds:
                results += measure_build(label, binary, args.sc, args, env)
                time.sleep(0.5)
        finally:
            backend.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(report(results, args))
    return 0


def report(results: list[Measured], args: argparse.Namespace) -> str:
    """Instructions per request of each build on each route, the ratio of the two builds, and
    the functions with the largest own cost."""
    sc = args.sc
    mode = "a new connection per request" if sc.close else "keep-alive"
    if sc.streams > 1:
        mode += f", {sc.streams} streams per connection"
    lines = [
        f"{sc.name}: {args.conns} connections, {mode}; {args.duration} s counted "
        f"after {args.warmup} s",
        "",
        "| build | route | requests counted | instructions per request |",
        "|---|---|---|---|",
    ]
    for m in results:
        lines.append(f"| {m.build} | `{m.path}` | {m.requests:,} | {m.per_request:,.0f} |")
    by_path = collections.defaultdict(dict)
    for m in results:
        by_path[m.path][m.build] = m
    for path, builds in by_path.items():
        if "new" in builds and "old" in builds:
            ratio = builds["new"].per_request / builds["old"].per_request
            lines.append(f"\n`{path}`: new over old {ratio:.3f}")
    # A feature comparison's two routes (`wasm`: native filter, then the plugin): the
    # feature's cost in each build.
    for build in dict.fromkeys(m.build for m in results):
        routes = [m for m in results if m.build == build]
        if len(routes) == 2:
            base, feature = routes
            lines.append(
                f"\n{build}: `{feature.path}` over `{base.path}` "
                f"{feature.per_request / base.per_request:.3f}"
            )
    if args.top:
        for m in results:
            lines.append(f"\nOwn instructions per request, {m.build} `{m.path}`:")
            ranked = sorted(m.counts.by_function.items(), key=lambda kv: -kv[1])
            for name, cost in ranked[: args.top]:
                lines.append(f"{cost / m.requests:9.0f}  {name[:140]}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
