#!/usr/bin/env python3
"""Writes gateway/link-order.txt, the order in which the release link lays out the functions
the gateway runs (gateway/build.rs hands it to lld as `--symbol-ordering-file`).

    python3 benches/harness/link_order.py [--gateway target/dist/gateway]

Why: the plain link spreads the ~2.6 MB of code a gateway runs over a 22 MB `.text`, and the
kernel maps 64 KiB around every page it faults in, so an idle gateway had ~6 MB of its own code
resident. Laid out together, the same code takes ~2.5 MB (docs/performance-log.md, "Then:
the code laid out by use").

How: the gateway runs twice under callgrind (which records every function executed) with the
harness's own config and files: first with the base config (no optional section), started and
then sent each kind of request the benchmark sends (HTTP/1.1, h2c, TLS over HTTP/1.1 and HTTP/2,
proxy, static files, the L4 stream); then with every optional section (Wasm plugin, WAF, rate
limit, HTTP/3) and requests to those routes too. The file lists the functions the first run's
requests ran, hottest first (so a request's code sits together), then those of its start-up,
then those only the second run ran. Names are mangled symbols, whose
hashes change with the toolchain and the dependency tree: lld ignores names it does not find,
so a stale list costs memory, never a build. Rerun this after a toolchain or dependency update,
including a change of a dependency's features (it says how many of its names the binary has).

Needs valgrind, nginx (the backend), openssl and h2load, as the harness does.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench import REPO, jwt_fixture, prepare_files
from servers import GATEWAY_SECTIONS, OPT_IN_SECTIONS, Server, drop_sections, fill, CONFIGS

# Paths on the plain port, per run; every optional route is in the second run only.
BASE_PATHS = ["/hello", "/proxy/hello", "/static/1k.bin", "/static/100k.bin", "/nowaf/x"]
FULL_PATHS = ["/native", "/wasm", "/waf/x?page=1", "/limited", "/nolimit"]


def log(msg: str) -> None:
    print(f"[link-order] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gateway", type=Path, default=REPO / "target/dist/gateway")
    p.add_argument(
        "--plugin", type=Path, default=REPO / "plugins/target/wasm32-wasip1/release/add_header.wasm"
    )
    p.add_argument("--h3load", type=Path, default=REPO / "target/dist/h3load")
    p.add_argument("--jwt-fixture", type=Path, default=REPO / "target/dist/jwt_fixture")
    p.add_argument("--out", type=Path, default=REPO / "gateway/link-order.txt")
    p.add_argument("--port-base", type=int, default=29000)
    p.add_argument("--requests", type=int, default=2000, help="requests per path and protocol")
    return p.parse_args(argv)


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Under callgrind the gateway starts ~50× slower (more with a plugin to compile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with {proc.returncode} while starting")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"no answer from {url} after {timeout:.0f} s")


def drive(gw: Server, paths: list[str], n: int, h3load: Path | None) -> None:
    """Each path over HTTP/1.1 and h2c; the static file over TLS (both protocols), HTTP/3
    when the config has it, and the L4 stream."""

    def h2load(url: str, *extra: str) -> None:
        subprocess.run(
            ["h2load", "-n", str(n), "-c", "10", *extra, url], check=True, capture_output=True
        )

    for path in paths:
        h2load(gw.url("http", path), "--h1")
        h2load(gw.url("http", path))
    h2load(gw.url("tls", "/static/1k.bin"), "--h1")
    h2load(gw.url("tls", "/static/1k.bin"))
    h2load(gw.url("l4", "/hello"), "--h1")
    if h3load is not None:
        subprocess.run(
            [str(h3load), "-n", str(n), "-c", "10", gw.url("h3", "/static/1k.bin")],
            check=True,
            capture_output=True,
        )


def profile(gw: Server, config: Path, out: Path, paths: list[str], args, h3: bool) -> list[Path]:
    """Runs the gateway under callgrind; returns the profiles of its start-up (up to its first
    answer) and of the requests that followed, in that order."""
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--demangle=no",
        f"--callgrind-out-file={out}",
        str(gw.binary),
        "run",
        "--config",
        str(config),
    ]
    with gw.log.open("wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
    try:
        wait_http(gw.url("http", "/hello"), proc, timeout=600)
        # Ends the start-up's profile (written to OUT.1); the rest goes to OUT at exit.
        subprocess.run(["callgrind_control", "--dump", str(proc.pid)], check=True, capture_output=True)
        drive(gw, paths, args.requests, args.h3load if h3 else None)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    parts = [out.with_name(out.name + ".1"), out]
    for part in parts:
        if not part.is_file():
            raise RuntimeError(f"callgrind wrote no {part.name}; see {gw.log}")
    return parts


def self_costs(profile_file: Path, binary: Path | None) -> collections.Counter[str]:
    """Instructions executed in each function of `binary` itself (not in its callees), from a
    callgrind profile with undemangled names; of every object when `binary` is None
    (`instructions.py`)."""
    objects: dict[str, str] = {}
    names: dict[str, str] = {}
    cost: collections.Counter[str] = collections.Counter()
    current: str | None = None
    in_binary = False
    after_call = False
    binary_path = str(binary.resolve()) if binary is not None else None
    entry = re.compile(r"(c?(?:ob|fn))=\((\d+)\)(?: (.*))?")
    with profile_file.open(errors="replace") as lines:
        for line in lines:
            m = entry.match(line)
            if m:
                kind, ident, name = m.group(1), m.group(2), m.group(3)
                table = objects if kind.endswith("ob") else names
                if name:
                    table[ident] = name.strip()
                if kind == "ob":
                    in_binary = binary_path is None or objects.get(ident) == binary_path
                elif kind == "fn":
                    # callgrind names a recursion level `name'2`, and a function without a
                    # symbol by its address or `(below main)`: only symbols can be ordered.
                    current = re.sub(r"'\d+$", "", table[ident]) if in_binary else None
                    if current and current[0] in "(0":
                        current = None
                    if current:
                        cost[current] += 0
                continue
            if line.startswith("calls="):
                after_call = True  # the next cost line is the call's, counted in the callee
                continue
            if line[:1].isdigit() or line[:1] in "+-*":
                if after_call:
                    after_call = False
                    continue
                parts = line.split()
                if current and len(parts) >= 2:
                    cost[current] += int(parts[1])
    return cost


def defined_symbols(binary: Path) -> set[str]:
    out = subprocess.run(
        ["nm", "--defined-only", str(binary)], check=True, capture_output=True, text=True
    ).stdout
    return {parts[2] for parts in (line.split() for line in out.splitlines()) if len(parts) == 3}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    for tool in ("valgrind", "nginx", "openssl", "h2load", "nm"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed (valgrind: apt-get install valgrind)")
    if not args.gateway.is_file():
        sys.exit(f"no gateway binary at {args.gateway}: cargo build --profile dist -p gateway")

    work = Path(tempfile.mkdtemp(prefix="gateway-link-order-"))
    env = prepare_files(work)
    env.backend_port = args.port_base + 80
    env.plugin = args.plugin if args.plugin.is_file() else None
    env.jwks, _ = jwt_fixture(args.jwt_fixture, work)
    backend = Server("backend", "backend", env.backend_port, env)
    gw = Server("gateway", "gateway", args.port_base, env, binary=args.gateway)
    template = fill((CONFIGS / "gateway.yaml").read_text(), gw.values())
    drop_full = set(OPT_IN_SECTIONS) | (set() if env.plugin else {"wasm"})
    h3 = args.h3load.is_file()
    if not h3:
        drop_full.add("h3")
        log(f"no h3load at {args.h3load}: the HTTP/3 path is not profiled")
    if env.plugin is None:
        log(f"no plugin at {args.plugin}: the Wasm path is not profiled")
    if env.jwks is None:
        drop_full.add("jwt")
    runs = [
        ("base", drop_sections(template, set(GATEWAY_SECTIONS)), BASE_PATHS, False),
        ("full", drop_sections(template, drop_full), BASE_PATHS + FULL_PATHS, h3),
    ]
    backend.start()
    costs = []
    try:
        for name, text, paths, with_h3 in runs:
            config = work / f"{name}.yaml"
            config.write_text(text)
            log(f"{name} config under callgrind")
            out = work / f"callgrind.{name}.out"
            startup, requests = profile(gw, config, out, paths, args, with_h3)
            costs += [self_costs(requests, args.gateway), self_costs(startup, args.gateway)]
    finally:
        backend.stop()

    order: list[str] = []
    seen: set[str] = set()
    for cost in costs:
        for fn, _ in sorted(cost.items(), key=lambda kv: (-kv[1], kv[0])):
            if fn not in seen:
                seen.add(fn)
                order.append(fn)
    defined = defined_symbols(args.gateway)
    found = sum(1 for fn in order if fn in defined)
    header = (
        "# The release link's function order (gateway/build.rs): the functions a base-config\n"
        "# gateway runs per request, hottest first, then those of its start-up, then those only\n"
        "# the optional sections run. Generated by benches/harness/link_order.py; do not edit.\n"
    )
    args.out.write_text(header + "".join(f"{fn}\n" for fn in order))
    log(
        f"{len(order)} functions ({len(set(costs[0]) | set(costs[1]))} in the base run) "
        f"written to {args.out}; "
        f"{found} of them are symbols of {args.gateway.name}"
    )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
