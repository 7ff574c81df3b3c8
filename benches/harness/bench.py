#!/usr/bin/env python3
"""Side-by-side load benchmark: the gateway against nginx, Caddy, HAProxy, h2o, Pingora and a bare
hyper server.

Normally started by `bash benches/harness/run.sh`, which installs the tools and builds the
binaries first. This script:

1. generates the document root (1 KiB, 10 KiB, 100 KiB and 1 MiB of random bytes) and a
   self-signed ECDSA certificate in a scratch directory;
2. starts the shared backend (nginx `return 200`, one worker) on the load CPU and every server
   under test on the server CPU, each from its config in benches/harness/configs/;
3. checks every target answers as expected (status, body length), skipping those that do not,
   with the reason;
4. for every cell (scenario × concurrency): a warm-up run of each target, then `--rounds`
   interleaved rounds, the order reversed every other round and turned every two (A, B, C, then
   C, B, A, then B, C, A, ...), each recording the load generator's figures and the server's CPU
   time and peak RSS over the run;
5. writes one CSV row per run to benches/results/<run id>.csv (and LATEST.csv), with a
   .meta.json beside it (versions, machine, options), then renders the report.

/dev/cpu_dma_latency is held at 0 for the whole run, and the harness itself stays on the load
CPU so that the server CPU runs nothing but the server under test.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import fnmatch
import http.client
import json
import os
import platform
import random
import re
import resource
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import loadgen
import procstat
from scenarios import (FILES_MTIME, SCENARIOS, STATIC_FILES, TEXT_FILE, TEXT_SIZE, Scenario,
                       with_token)
from servers import Env, Server, have, port_free

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULTS = REPO / "benches" / "results"

PEER_KINDS = ["hyper", "gateway", "nginx", "haproxy", "caddy", "h2o", "pingora"]
# The peers from Debian's packages: the kind and the command that has to be installed.
PACKAGED = {"nginx": "nginx", "haproxy": "haproxy", "caddy": "caddy", "h2o": "h2o"}

COLUMNS = [
    "run_id",
    "label",
    "scenario",
    "tool",
    "conn_mode",
    "conns",
    "streams",
    "target",
    "server",
    "round",
    "duration_s",
    "requests",
    "rps",
    "p50_ms",
    "p99_ms",
    "errors",
    "non2xx",
    "transfer_mib_s",
    "cpu_s",
    "cpu_pct",
    "cpu_us_per_req",
    "sys_us_per_req",
    "req_per_core",
    "peak_rss_kib",
    "idle_rss_kib",
]


@dataclass
class Target:
    """One thing measured in a cell: a server, and a path on it."""

    label: str
    server: Server
    url: str
    variant: str | None = None  # the scenario's variant this target measures


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="one concurrency per scenario, 2 rounds of 3 s: proves the harness works",
    )
    p.add_argument(
        "--scenarios", default="*", help="comma-separated names or globs (default: all); see --list"
    )
    p.add_argument(
        "--servers",
        default=None,
        help="comma-separated kinds: " + ",".join(PEER_KINDS) + " (default: all;"
        " with --compare: the two gateways)",
    )
    p.add_argument("--conns", default=None, help="comma-separated concurrencies for every scenario")
    p.add_argument(
        "--rounds", type=int, default=None, help="interleaved rounds (default 5, quick 2)"
    )
    p.add_argument(
        "--duration", type=int, default=None, help="seconds per run (default 5, quick 3)"
    )
    p.add_argument("--warmup", type=int, default=None, help="warm-up seconds (default 2, quick 1)")
    p.add_argument("--pause", type=float, default=0.5, help="seconds between runs")
    p.add_argument(
        "--gateway",
        type=Path,
        default=REPO / "target/dist/gateway",
        help="the gateway binary under test",
    )
    p.add_argument(
        "--compare",
        type=Path,
        default=None,
        help="another gateway binary, run interleaved with --gateway (as gateway-other)",
    )
    p.add_argument("--hyper", type=Path, default=REPO / "target/dist/hyper_hello")
    p.add_argument("--h3load", type=Path, default=REPO / "target/dist/h3load")
    p.add_argument(
        "--pingora",
        type=Path,
        default=REPO / "target/pingora/release/pingora-proxy-peer",
        help="the Pingora peer (benches/pingora-proxy, built by run.sh)",
    )
    p.add_argument(
        "--plugin", type=Path, default=REPO / "plugins/target/wasm32-wasip1/release/add_header.wasm"
    )
    p.add_argument(
        "--jwt-fixture",
        type=Path,
        default=REPO / "target/dist/jwt_fixture",
        help="writes the key set and prints the token of the `jwt` variant (built by run.sh)",
    )
    p.add_argument(
        "--port-base",
        type=int,
        default=21000,
        help="ports used: base+80 (backend), base+100..base+804 (servers)",
    )
    p.add_argument("--label", default="", help="a note stored with the results (e.g. 'smoke run')")
    p.add_argument(
        "--out", type=Path, default=None, help="CSV path (default benches/results/<id>.csv)"
    )
    p.add_argument("--no-report", action="store_true", help="do not run report.py afterwards")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = p.parse_args(argv)
    # Servers start in a scratch directory: make every path absolute first.
    for name in ("gateway", "compare", "hyper", "h3load", "pingora", "plugin", "jwt_fixture"):
        if getattr(args, name) is not None:
            setattr(args, name, getattr(args, name).resolve())
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.duration = args.duration or (3 if args.quick else 5)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    return args


# === set-up ===


def json_text(size: int) -> bytes:
    """`size` bytes of an API's JSON answer: records whose fields repeat and whose values vary
    (as real answers compress: neither random nor one repeated line), the same on every run."""
    rng = random.Random(62)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    out = bytearray(b"[")
    i = 0
    while len(out) < size:
        out += (
            f'{{"id":{i},"name":"{rng.choice(words)} {rng.choice(words)}",'
            f'"price":{rng.randint(1, 99999) / 100},"stock":{rng.randint(0, 500)},'
            f'"tags":["{rng.choice(words)}","{rng.choice(words)}"]}},\n'
        ).encode()
        i += 1
    return bytes(out[: size - 1]) + b"]"


def prepare_files(work: Path) -> Env:
    """Document root and certificate; the scratch dir is world-readable because nginx's worker
    runs as an unprivileged user when started as root."""
    work.chmod(0o755)
    root = work / "root"
    (root / "static").mkdir(parents=True)
    for name, size in STATIC_FILES.items():
        (root / "static" / name).write_bytes(os.urandom(size))
        os.utime(root / "static" / name, (FILES_MTIME, FILES_MTIME))
    (root / "static" / "index.html").write_text("<!doctype html><title>bench</title>\n")
    (root / "text").mkdir()
    (root / "text" / TEXT_FILE).write_bytes(json_text(TEXT_SIZE))
    # Served by a route whose cache (the default, 256 KiB) does not take it: sent from disk.
    (root / "disk").mkdir()
    (root / "disk" / "1m.bin").write_bytes(os.urandom(1048576))
    cert, key = work / "cert.pem", work / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "30",
            "-subj",
            "/CN=localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    key.chmod(0o644)
    pem = work / "cert+key.pem"  # HAProxy wants both in one file
    pem.write_text(cert.read_text() + key.read_text())
    return Env(
        work=work,
        root=root,
        cert=cert,
        key=key,
        pem=pem,
        plugin=None,
        backend_port=0,
        server_cpu="1",
        backend_cpu="0",
    )


def jwt_fixture(binary: Path, work: Path) -> tuple[Path | None, str]:
    """The key set (a file in `work`) and the token of the `jwt` variant, made once per run by
    `binary`; (None, "") without it, and the variant is skipped."""
    if not binary.is_file():
        log(f"no jwt_fixture at {binary}: the jwt variant is skipped (run.sh builds it)")
        return None, ""
    jwks = work / "jwks.json"
    proc = subprocess.run(
        [str(binary), str(jwks)], capture_output=True, text=True, check=False
    )
    token = proc.stdout.strip()
    if proc.returncode != 0 or not token:
        log(f"jwt_fixture failed: {proc.stderr.strip()[-300:]}; the jwt variant is skipped")
        return None, ""
    jwks.chmod(0o644)
    return jwks, token


def port_bases(port_base: int) -> dict[str, int]:
    """The first port of each kind's instance, 100 apart (an instance uses five), and of the
    second gateway of `--compare` after them all."""
    bases = {kind: port_base + 100 * (i + 1) for i, kind in enumerate(PEER_KINDS)}
    bases["gateway-other"] = port_base + 100 * (len(PEER_KINDS) + 1)
    return bases


def make_servers(args: argparse.Namespace, env: Env) -> list[Server]:
    if args.servers:
        kinds = [k.strip() for k in args.servers.split(",") if k.strip()]
    elif args.compare:
        kinds = ["gateway"]
    else:
        kinds = list(PEER_KINDS)
    out: list[Server] = []
    bases = port_bases(args.port_base)
    for kind in PEER_KINDS:
        if kind not in kinds:
            continue
        base = bases[kind]
        if kind == "gateway":
            if not args.gateway.is_file():
                sys.exit(f"no gateway binary at {args.gateway}: build it (run.sh does)")
            out.append(Server("gateway", "gateway", base, env, binary=args.gateway))
            if args.compare:
                if not args.compare.is_file():
                    sys.exit(f"no gateway binary at {args.compare}")
                out.append(
                    Server(
                        "gateway-other",
                        "gateway",
                        bases["gateway-other"],
                        env,
                        binary=args.compare,
                    )
                )
        elif kind == "hyper":
            if not args.hyper.is_file():
                log(f"no hyper_hello at {args.hyper}: the hyper floor is skipped")
                continue
            out.append(Server("hyper", "hyper", base, env, binary=args.hyper))
        elif kind == "pingora":
            if not args.pingora.is_file():
                log(f"no Pingora peer at {args.pingora}: skipped (run.sh builds it)")
                continue
            out.append(Server("pingora", "pingora", base, env, binary=args.pingora))
        else:
            tool = PACKAGED[kind]
            if not have(tool):
                log(f"{tool} is not installed: skipped")
                continue
            out.append(Server(kind, kind, base, env))
    return out


def check_ports(servers: list[Server]) -> None:
    busy = []
    for s in servers:
        for name, port in s.ports.items():
            if not port_free(port) or (name in ("tls", "h3") and not port_free(port, udp=True)):
                busy.append(f"{s.name}:{port}")
    if busy:
        sys.exit(f"ports in use: {', '.join(sorted(set(busy)))}; pick others with --port-base")


def probe(url: str, headers: list[str]) -> tuple[int, int, set[str]]:
    """One HTTP/1.1 request (TLS unverified: the certificate is self-signed).

    Returns the status, the body length and the names of the answer's header fields."""
    scheme, rest = url.split("://", 1)
    hostport, path = rest.split("/", 1)
    host, port = hostport.split(":")
    if scheme == "https":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, int(port), context=ctx, timeout=5
        )
    else:
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
    hdrs = dict(h.split(": ", 1) for h in headers)
    conn.request("GET", "/" + path, headers=hdrs)
    res = conn.getresponse()
    body = res.read()
    conn.close()
    return res.status, len(body), {name.lower() for name, _ in res.getheaders()}


# Fields about the connection, not the answer: a peer's choice of framing is not a difference.
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding"}


def head_differences(scenario: str, heads: dict[str, set[str]]) -> list[str]:
    """What each peer's answer lacks or adds against the gateway's, field names only.

    A shorter head is less work (over HTTP/2 every field is one more HPACK lookup), so the
    report says where the servers compared do not send the same answer."""
    subject = next((label for label in heads if label.startswith("gateway")), None)
    if subject is None:
        return []
    want = heads[subject] - HOP_BY_HOP
    out = []
    for label, names in heads.items():
        if label == subject:
            continue
        names = names - HOP_BY_HOP
        lacks, adds = sorted(want - names), sorted(names - want)
        if lacks or adds:
            parts = ([f"lacks {', '.join(lacks)}"] if lacks else []) + (
                [f"adds {', '.join(adds)}"] if adds else []
            )
            out.append(f"{scenario}: {label}'s answer {' and '.join(parts)} (against {subject}'s)")
    return out


# === the plan ===


def selected(args: argparse.Namespace) -> list[Scenario]:
    pats = [p.strip() for p in args.scenarios.split(",") if p.strip()]
    return [s for s in SCENARIOS if any(fnmatch.fnmatch(s.name, p) for p in pats)]


def targets_for(
    sc: Scenario, servers: list[Server], args: argparse.Namespace, skipped: list[str]
) -> list[Target]:
    out = []
    for srv in servers:
        if sc.peers is not None and srv.kind not in sc.peers:
            continue
        if sc.tool == "h3load" and not args.h3load.is_file():
            continue
        if sc.tool == "h2load" and not have("h2load"):
            continue
        variants = sc.variants or [None]
        for v in variants:
            need = v.needs if v else sc.needs
            if need not in srv.capabilities:
                if srv.kind == "gateway" and need in srv.skipped_sections:
                    why = srv.skipped_sections[need].splitlines()[-1][:200]
                    who = f"{srv.name} {v.label}" if v else srv.name
                    skipped.append(f"{sc.name}: {who}: {why}")
                continue
            label = srv.name + (f" {v.label}" if v else "")
            url = srv.url(sc.port, v.path if v else sc.path)
            out.append(Target(label, srv, url, v.label if v else None))
    return out


def sanity(
    sc: Scenario, targets: list[Target], skipped: list[str], answers: list[str]
) -> list[Target]:
    """Keeps the targets that answer the expected status (200, or 206 for a range) with the
    expected body length (HTTP/1.1 only), and notes in `answers` where their heads differ."""
    if sc.tool != "wrk":
        return targets
    ok, heads = [], {}
    for t in targets:
        try:
            status, length, names = probe(t.url, sc.headers)
        except (OSError, http.client.HTTPException) as e:
            skipped.append(f"{sc.name}: {t.label}: probe failed: {e}")
            continue
        if status != sc.status or (sc.body_size is not None and length != sc.body_size):
            skipped.append(f"{sc.name}: {t.label}: answered {status} with {length} bytes")
            continue
        ok.append(t)
        heads[t.label] = names
    answers.extend(variant_head_differences(sc.name, ok, heads))
    return ok


def variant_head_differences(
    scenario: str, targets: list[Target], heads: dict[str, set[str]]
) -> list[str]:
    """`head_differences` among the targets of each variant (the servers' answers to the same
    route), or among all of them when the scenario has no variants."""
    groups: dict[str | None, dict[str, set[str]]] = {}
    for t in targets:
        if t.label in heads:
            groups.setdefault(t.variant, {})[t.label] = heads[t.label]
    out = []
    for variant, group in groups.items():
        out += head_differences(f"{scenario} {variant}" if variant else scenario, group)
    return out


# === measuring ===


def run_tool(sc: Scenario, t: Target, conns: int, seconds: int, args: argparse.Namespace):
    if sc.tool == "wrk":
        return loadgen.wrk("0", t.url, conns, seconds, sc.close, sc.headers)
    if sc.tool == "h2load":
        return loadgen.h2load("0", t.url, conns, sc.streams, seconds)
    return loadgen.h3load(args.h3load, "0", t.url, conns, sc.streams, seconds)


def measure(
    sc: Scenario, t: Target, conns: int, seconds: int, args: argparse.Namespace
) -> dict[str, object]:
    pids = t.server.pids()
    with procstat.RssSampler(pids) as rss:
        (user0, sys0), t0 = procstat.cpu_split(pids), time.monotonic()
        load = run_tool(sc, t, conns, seconds, args)
        (user1, sys1), wall = procstat.cpu_split(pids), time.monotonic() - t0
        cpu, system = (user1 - user0) + (sys1 - sys0), sys1 - sys0
    cpu_pct = 100.0 * cpu / wall if wall > 0 else 0.0
    if load.requests == 0:
        # wrk prints zero latencies when nothing completed: no figure rather than a wrong one.
        load.p50_ms = load.p99_ms = None
        log(f"  {t.label}: no request completed; the tool said:\n{load.raw.strip()[-1500:]}")
    return {
        "duration_s": round(wall, 3),
        "requests": load.requests,
        "rps": round(load.rps, 1),
        "p50_ms": None if load.p50_ms is None else round(load.p50_ms, 4),
        "p99_ms": None if load.p99_ms is None else round(load.p99_ms, 4),
        "errors": load.errors,
        "non2xx": load.non2xx,
        "transfer_mib_s": None if load.transfer_mib_s is None else round(load.transfer_mib_s, 2),
        "cpu_s": round(cpu, 3),
        "cpu_pct": round(cpu_pct, 1),
        "cpu_us_per_req": round(1e6 * cpu / load.requests, 2) if load.requests else None,
        "sys_us_per_req": round(1e6 * system / load.requests, 2) if load.requests else None,
        "req_per_core": round(load.rps * 100.0 / cpu_pct, 1) if cpu_pct > 0 else None,
        "peak_rss_kib": rss.peak,
        "idle_rss_kib": t.server.idle_rss_kib,
        "_raw": load.raw,
    }


def versions(servers: list[Server], args: argparse.Namespace) -> dict[str, str]:
    def first_line(cmd: list[str]) -> str:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
        except OSError:
            return ""
        lines = ((p.stdout or "") + (p.stderr or "")).strip().splitlines()
        # Keep the version, not the banner around it.
        return lines[0].split(" Copyright")[0].split(" - http")[0] if lines else ""

    v = {
        "nginx": first_line(["nginx", "-v"]),
        "caddy": first_line(["caddy", "version"]),
        "haproxy": first_line(["haproxy", "-v"]),
        "h2o": first_line(["h2o", "--version"]),
        "wrk": first_line(["wrk", "-v"]),
        "h2load": first_line(["h2load", "--version"]),
    }
    for s in servers:
        if s.kind == "gateway":
            v[s.name] = first_line([str(s.binary), "version"])
        if s.kind == "pingora":
            v["pingora"] = locked_version(PINGORA_LOCK, "pingora")
    return v


PINGORA_LOCK = REPO / "benches" / "pingora-proxy" / "Cargo.lock"


def locked_version(lock: Path, package: str) -> str:
    """The version of `package` in a Cargo.lock (the peer program has no version of its own)."""
    if not lock.is_file():
        return ""
    m = re.search(rf'^name = "{re.escape(package)}"\nversion = "([^"]+)"', lock.read_text(), re.M)
    return f"{package} {m.group(1)}" if m else ""


def machine() -> dict[str, str]:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {"cpu": model, "cpus": str(os.cpu_count()), "kernel": platform.release()}


def git_commit() -> str:
    p = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    )
    return p.stdout.strip()


def cache_whole_file(path: Path) -> None:
    """Reads `path` to the end, so the page cache holds all of it."""
    with path.open("rb") as f:
        while f.read(1 << 20):
            pass


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.list:
        for s in SCENARIOS:
            print(f"{s.name:16} {s.tool:7} conns {s.conns}  {s.title}")
        return 0
    # Stay off the server CPU; raise the open-files limit for the 10,000-connection run.
    os.sched_setaffinity(0, {0})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < 20000:
        log(f"open-files limit is {hard}: the 10,000-connection run may see errors")

    scenarios = selected(args)
    if not scenarios:
        sys.exit(f"no scenario matches {args.scenarios!r}; see --list")
    for tool in ("wrk", "nginx", "taskset", "openssl"):
        if not have(tool):
            sys.exit(f"{tool} is not installed: run benches/harness/run.sh, which installs it")

    work = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    env = prepare_files(work)
    env.backend_port = args.port_base + 80
    env.plugin = args.plugin if args.plugin.is_file() else None
    env.jwks, token = jwt_fixture(args.jwt_fixture, work)
    for sc in scenarios:
        sc.headers = with_token(sc.headers, token)
    servers = make_servers(args, env)
    backend = Server("backend", "backend", env.backend_port, env)
    check_ports(servers + [backend])

    run_id = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    # Taken now: the tree the binaries were built from, not what it became during the run.
    commit = git_commit()
    out = args.out or RESULTS / f"{run_id}.csv"
    skipped: list[str] = []
    answers: list[str] = []
    dma = procstat.hold_cpu_dma_latency()
    if dma is None:
        log("cannot hold /dev/cpu_dma_latency at 0 (not root?): expect noisier numbers")

    # A binary's resident code depends on how much of its file is in the page cache: the kernel
    # maps up to 64 KiB of cached pages around each page a process faults in. A binary just built
    # or copied is cached whole; one built an hour earlier may be cached in part, and then shows
    # less RSS for the same code. Reading each binary once puts every build on the same footing.
    for s in servers:
        if s.binary is not None:
            cache_whole_file(s.binary)

    started: list[Server] = []
    base_idle: dict[str, int] = {}
    try:
        for s in servers:
            if s.kind == "gateway":
                base_idle[s.name] = s.base_idle_rss()
        for s in [backend, *servers]:
            s.start()
            started.append(s)
            for name, why in s.skipped_sections.items():
                log(f"{s.name}: optional section `{name}` off: {why.splitlines()[-1][:200]}")
        time.sleep(2)
        for s in servers:
            s.idle_rss_kib = procstat.rss_kib(s.pids())

        plan = []
        for sc in scenarios:
            targets = sanity(sc, targets_for(sc, servers, args, skipped), skipped, answers)
            if sc.tool == "h3load" and not args.h3load.is_file():
                skipped.append(f"{sc.name}: no h3load binary ({args.h3load.name}): HTTP/3 skipped")
            if not targets or (sc.variants and len(targets) < 2):
                # A feature comparison with one side missing measures nothing useful.
                continue
            conns = (
                [int(c) for c in args.conns.split(",")]
                if args.conns
                else (sc.quick_conns if args.quick else sc.conns)
            )
            for c in conns:
                plan.append((sc, c, targets))
        runs = sum(len(t) for _, _, t in plan)
        secs = sum(
            len(t)
            * (
                max(args.warmup, sc.min_duration // 2)
                + 1
                + args.rounds * (max(args.duration, sc.min_duration) + args.pause + 0.5)
            )
            for sc, _, t in plan
        )
        log(
            f"{len(plan)} cells, {runs} targets, {args.rounds} rounds of {args.duration}s: "
            f"about {secs / 60:.0f} min"
        )
        for line in skipped:
            log(f"skip: {line}")
        for line in answers:
            log(f"answer: {line}")
        if args.dry_run:
            for sc, c, targets in plan:
                print(f"{sc.name:16} c={c:<6} " + ", ".join(t.label for t in targets))
            return 0

        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            for s in servers:
                w.writerow(idle_row(run_id, args, s, "idle"))
                if s.name in base_idle:
                    row = idle_row(run_id, args, s, "idle-base")
                    row["idle_rss_kib"] = row["peak_rss_kib"] = base_idle[s.name]
                    w.writerow(row)
            for sc, conns, targets in plan:
                run_cell(w, f, run_id, args, sc, conns, targets, skipped)
            for s in servers:
                if s.alive():
                    s.idle_rss_kib = procstat.rss_kib(s.pids())
                    w.writerow(idle_row(run_id, args, s, "idle-after"))
    finally:
        for s in reversed(started):
            s.stop()
        if dma is not None:
            os.close(dma)
        shutil.rmtree(work, ignore_errors=True)

    meta = {
        "run_id": run_id,
        "label": args.label,
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "quick": args.quick,
        "rounds": args.rounds,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "compare": args.compare is not None,
        "cpu_dma_latency_held": dma is not None,
        "machine": machine(),
        "versions": versions(servers, args),
        "skipped": skipped,
        "answers": answers,
    }
    out.with_suffix(".meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    if args.out is None:
        shutil.copyfile(out, RESULTS / "LATEST.csv")
        shutil.copyfile(out.with_suffix(".meta.json"), RESULTS / "LATEST.meta.json")
    log(f"results: {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    if not args.no_report:
        subprocess.run([sys.executable, str(HERE / "report.py"), str(out)], check=False)
    return 0


def idle_row(run_id: str, args: argparse.Namespace, s: Server, scenario: str) -> dict:
    return {
        "run_id": run_id,
        "label": args.label,
        "scenario": scenario,
        "target": s.name,
        "server": s.name,
        "round": 0,
        "idle_rss_kib": s.idle_rss_kib,
        "peak_rss_kib": s.idle_rss_kib,
    }


def round_order(targets: list[Target], rnd: int) -> list[Target]:
    """The order of the targets in round `rnd` (from 1): reversed every other round and turned
    by one every two, so that no target runs right after the same one in every round (after a
    run that left the host busy, such as one that closed thousands of connections) or always
    first after the warm-ups: A B C, C B A, B C A, A C B, ..."""
    if not targets:
        return []
    k = (rnd - 1) // 2 % len(targets)
    turned = targets[k:] + targets[:k]
    return turned if rnd % 2 == 1 else turned[::-1]


def run_cell(
    w: csv.DictWriter,
    f,
    run_id: str,
    args: argparse.Namespace,
    sc: Scenario,
    conns: int,
    targets: list[Target],
    skipped: list[str],
) -> None:
    log(f"{sc.name} c={conns}: {', '.join(t.label for t in targets)}")
    live = [t for t in targets if t.server.alive()]
    for t in live:  # warm-up: file caches, connection pools, the allocator's free lists
        try:
            run_tool(sc, t, conns, max(args.warmup, sc.min_duration // 2), args)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            log(f"  warm-up of {t.label} failed: {e}")
        time.sleep(args.pause)
    for rnd in range(1, args.rounds + 1):
        for t in round_order(live, rnd):
            if not t.server.alive():
                skipped.append(f"{sc.name} c={conns}: {t.label}: the server died")
                continue
            try:
                row = measure(sc, t, conns, max(args.duration, sc.min_duration), args)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                log(f"  {t.label} round {rnd}: {e}")
                continue
            # The load generator's own report, kept out of git, for when a figure looks wrong.
            raw_dir = RESULTS / "raw" / run_id
            raw_dir.mkdir(parents=True, exist_ok=True)
            name = f"{sc.name}-c{conns}-{t.label.replace(' ', '_')}-r{rnd}.txt"
            (raw_dir / name).write_text(str(row.pop("_raw")))
            row |= {
                "run_id": run_id,
                "label": args.label,
                "scenario": sc.name,
                "tool": sc.tool,
                "conn_mode": "close" if sc.close else "keep-alive",
                "conns": conns,
                "streams": sc.streams,
                "target": t.label,
                "server": t.server.name,
                "round": rnd,
            }
            w.writerow(row)
            f.flush()
            log(
                f"  r{rnd} {t.label:22} {row['rps']:>10} req/s  p99 {row['p99_ms']} ms  "
                f"cpu {row['cpu_pct']}%  {row['cpu_us_per_req']} us/req  "
                f"err {row['errors']} non2xx {row['non2xx']}  rss {row['peak_rss_kib']} KiB"
            )
            time.sleep(args.pause)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
