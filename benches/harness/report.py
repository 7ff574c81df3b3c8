#!/usr/bin/env python3
"""Renders a results CSV of the side-by-side harness: tables, plots and the issue's targets.

    python3 benches/harness/report.py [benches/results/LATEST.csv] [--doc docs/benchmarks.md]
                                      [--plots docs/bench] [--stdout]

Every figure is the median of the rounds of a cell, with the minimum and maximum beside it; a
ratio of two targets is the median of their per-round ratios (`Results.paired`). The
Markdown goes between the `<!-- results:begin -->` and `<!-- results:end -->` markers of the doc
(or to standard output with --stdout); the PNG plots go to --plots. The run's .meta.json (beside
the CSV) labels the results: a smoke or quick run is said to be one in the heading.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from scenarios import BY_NAME, SCENARIOS, TEXT_SIZE  # noqa: E402

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
PEERS = ("nginx", "haproxy", "caddy", "h2o", "pingora")  # a "best peer" is chosen among these
COLORS = {
    "hyper": "#7f7f7f",
    "gateway": "#d62728",
    "gateway-other": "#ff9896",
    "nginx": "#2ca02c",
    "haproxy": "#1f77b4",
    "caddy": "#9467bd",
    "h2o": "#8c564b",
    "pingora": "#ff7f0e",
}
MB = 1_000_000  # the memory targets are in MB; RSS is measured in KiB
# A server at or above this share of its core serves all it can: its requests/s then measure
# it. Below, the load generator held it back, and only its CPU per request does.
SATURATED = 95.0


def num(v: str) -> float | None:
    return float(v) if v not in ("", None) else None


class Cell:
    """The rounds of one target in one cell (scenario × concurrency)."""

    def __init__(self, rows: list[dict[str, str]]) -> None:
        self.rows = rows

    def values(self, col: str) -> list[float]:
        return [v for r in self.rows if (v := num(r.get(col))) is not None]

    def median(self, col: str) -> float | None:
        vals = self.values(col)
        return statistics.median(vals) if vals else None

    def span(self, col: str) -> tuple[float, float] | None:
        vals = self.values(col)
        return (min(vals), max(vals)) if vals else None

    def total(self, col: str) -> int:
        return int(sum(self.values(col)))

    def by_round(self, col: str) -> dict[str, float]:
        """The figure of each round (by its number) that has one."""
        rows = ((r.get("round"), num(r.get(col))) for r in self.rows)
        return {k: v for k, v in rows if k and v is not None}


class Results:
    def __init__(self, path: Path) -> None:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        meta_path = path.with_suffix(".meta.json")
        self.meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        self.idle = {r["server"]: int(r["idle_rss_kib"]) for r in rows if r["scenario"] == "idle"}
        self.idle_base = {
            r["server"]: int(r["idle_rss_kib"]) for r in rows if r["scenario"] == "idle-base"
        }
        self.idle_after = {
            r["server"]: int(r["idle_rss_kib"]) for r in rows if r["scenario"] == "idle-after"
        }
        groups: dict[tuple[str, int, str], list[dict[str, str]]] = defaultdict(list)
        self.targets: dict[str, list[str]] = defaultdict(list)  # scenario -> targets, in order
        for r in rows:
            if r["scenario"] in ("idle", "idle-base", "idle-after"):
                continue
            groups[(r["scenario"], int(r["conns"]), r["target"])].append(r)
            if r["target"] not in self.targets[r["scenario"]]:
                self.targets[r["scenario"]].append(r["target"])
        self.cells = {k: Cell(v) for k, v in groups.items()}
        self.server_of = {r["target"]: r["server"] for r in rows}

    def scenarios(self) -> list[str]:
        known = [s.name for s in SCENARIOS if s.name in self.targets]
        return known + sorted(set(self.targets) - set(known))

    def conns(self, scenario: str) -> list[int]:
        return sorted({c for (s, c, _) in self.cells if s == scenario})

    def cell(self, scenario: str, conns: int, target: str) -> Cell | None:
        return self.cells.get((scenario, conns, target))

    def med(self, scenario: str, conns: int, target: str, col: str) -> float | None:
        c = self.cell(scenario, conns, target)
        return c.median(col) if c else None

    def pairs(
        self, scenario: str, conns: int, a: str, b: str, col: str
    ) -> list[tuple[float, float]] | None:
        """Targets `a`'s and `b`'s figures of each round both ran in (a round runs every target
        once, in turn, so the two figures of a round were taken minutes apart under the same
        load on the host, which drifts between rounds by more than most differences measured
        here); None when either target has no cell."""
        ca, cb = self.cell(scenario, conns, a), self.cell(scenario, conns, b)
        if ca is None or cb is None:
            return None
        ra, rb = ca.by_round(col), cb.by_round(col)
        return [(ra[k], rb[k]) for k in ra if k in rb]

    def paired(self, scenario: str, conns: int, a: str, b: str, col: str) -> float | None:
        """Target `a`'s figure over `b`'s: the median of the per-round ratios ([`pairs`]); the
        ratio of the medians when no round pairs them."""
        pairs = self.pairs(scenario, conns, a, b, col)
        if pairs is None:
            return None
        ratios = [x / y for x, y in pairs if y]
        if ratios:
            return statistics.median(ratios)
        return ratio(self.med(scenario, conns, a, col), self.med(scenario, conns, b, col))

    def rounds_above(self, scenario: str, conns: int, a: str, b: str, col: str) -> tuple[int, int]:
        """In how many of the rounds both ran target `a`'s figure was above `b`'s, of how many:
        whether a difference of medians held round by round or is one round's noise."""
        pairs = self.pairs(scenario, conns, a, b, col) or []
        return sum(x > y for x, y in pairs), len(pairs)

    def saturated(self, scenario: str, conns: int, targets: tuple[str, ...]) -> bool:
        """Whether every one of `targets` used at least `SATURATED` % of its core (median)."""
        pcts = [self.med(scenario, conns, t, "cpu_pct") for t in targets]
        return all(p is not None and p >= SATURATED for p in pcts)

    def main_conns(self, scenario: str) -> int | None:
        cs = self.conns(scenario)
        return 200 if 200 in cs else (cs[0] if cs else None)


# === formatting ===


def fmt_k(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v / 1000:.1f}k" if v >= 1000 else f"{v:.0f}"


def fmt_ms(v: float | None) -> str:
    return "—" if v is None else (f"{v:.2f}" if v < 10 else f"{v:.1f}")


def fmt_span_k(c: Cell, col: str) -> str:
    s = c.span(col)
    if s is None:
        return "—"
    return f"{fmt_k(c.median(col))} ({fmt_k(s[0])}–{fmt_k(s[1])})"


def fmt_mib(kib: float | None) -> str:
    return "—" if kib is None else f"{kib / 1024:.1f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt_ratio(r: float | None) -> str:
    # Three significant digits, so that a ratio just under a target does not print as on it.
    return "—" if r is None else f"{r:#.3g}×"


def bold(text: str, used: bool) -> str:
    """`text` in bold when it is the figure a verdict used."""
    return f"**{text}**" if used else text


# === sections ===


def header(res: Results) -> list[str]:
    m = res.meta
    label = m.get("label") or ("quick run" if m.get("quick") else "full run")
    out = [f"### Run {m.get('run_id', '?')}: {label}", ""]
    if m.get("quick") or "smoke" in label.lower():
        out += [
            "> **A smoke run** (short runs, few rounds), taken to prove the harness works. "
            "The numbers are noisy and not for comparison; the full run replaces them.",
            "",
        ]
    mach = m.get("machine", {})
    out += [
        f"- date (UTC): {m.get('date_utc', '?')}; commit `{m.get('commit', '?')}`",
        f"- machine: {mach.get('cpus', '?')} vCPUs ({mach.get('cpu', '?')}), "
        f"kernel {mach.get('kernel', '?')}; /dev/cpu_dma_latency held at 0: "
        f"{'yes' if m.get('cpu_dma_latency_held') else 'no'}",
        f"- {m.get('rounds', '?')} interleaved rounds of {m.get('duration_s', '?')} s per target "
        f"after a {m.get('warmup_s', '?')} s warm-up; figures are medians (min–max of the rounds)",
    ]
    vers = m.get("versions", {})
    if vers:
        out.append("- versions: " + "; ".join(f"{k}: {v}" for k, v in vers.items() if v))
    for s in m.get("skipped", []):
        out.append(f"- skipped: {s}")
    for s in m.get("answers", []):
        out.append(f"- not the same answer: {s}")
    return out + [""]


def targets_section(res: Results) -> list[str]:
    rows = []

    def vs(scenario: str, peer: str, goal: float, what: str) -> None:
        parts, verdicts = [], []
        for c in res.conns(scenario):
            r = res.paired(scenario, c, "gateway", peer, "rps")
            rc = res.paired(scenario, c, "gateway", peer, "req_per_core")
            if r is None:
                continue
            on_rps = rc is None or res.saturated(scenario, c, ("gateway", peer))
            parts.append(
                f"c={c}: {bold(fmt_ratio(r), on_rps)} (per core {bold(fmt_ratio(rc), not on_rps)})"
            )
            verdicts.append((r if on_rps else rc) >= goal)
        verdict = "not measured" if not verdicts else ("met" if all(verdicts) else "not met")
        rows.append((what, "; ".join(parts) or "—", verdict))

    vs("hello", "hyper", 0.9, "`respond` ≥ 0.9× bare hyper (hello, keep-alive)")
    vs("static-1k", "nginx", 1.3, "static 1 KiB keep-alive ≥ 1.3× nginx")
    vs("proxy", "nginx", 1.2, "reverse proxy ≥ 1.2× nginx")
    vs("tls-h2-1k", "nginx", 1.2, "TLS H2 1 KiB ≥ 1.2× nginx")
    vs("h3-1k", "caddy", 1.5, "H3 1 KiB ≥ 1.5× Caddy")
    vs("h3-1m", "caddy", 1.5, "H3 1 MiB ≥ 1.5× Caddy")

    def cost(scenario: str, off: str, on: str, limit: float, what: str) -> None:
        """A feature's cost: the share of requests/s lost with it on when both routes saturate
        the server, else the CPU per request it adds (the same rule as the ratios above)."""
        parts, verdicts = [], []
        for c in res.conns(scenario):
            kept = res.paired(scenario, c, f"gateway {on}", f"gateway {off}", "rps")
            cpu = res.paired(scenario, c, f"gateway {on}", f"gateway {off}", "cpu_us_per_req")
            if kept is None:
                continue
            lost = 1 - kept
            added = cpu - 1 if cpu else None
            on_rps = added is None or res.saturated(
                scenario, c, (f"gateway {off}", f"gateway {on}")
            )
            shown = f"{lost:.1%} fewer req/s" if lost >= 0 else f"{-lost:.1%} more req/s"
            parts.append(f"c={c}: {bold(shown, on_rps)}")
            if added is not None:
                parts[-1] += f", {bold(f'CPU per request {added:+.1%}', not on_rps)}"
            verdicts.append((lost if on_rps else added) <= limit)
        verdict = "not measured" if not verdicts else ("met" if all(verdicts) else "not met")
        rows.append((what, "; ".join(parts) or "—", verdict))

    cost("waf", "waf off", "waf on", 0.15, "WAF (every detector, 50 rules) costs ≤ 15% of req/s")
    cost(
        "rate-limit-fast",
        "rate limit off",
        "rate limit on",
        0.05,
        "rate limiter costs ≤ 5% of req/s (HTTP/1.1 GETs: the fast path)",
    )
    cost(
        "rate-limit",
        "rate limit off",
        "rate limit on",
        0.05,
        "the same, on the general path (HTTP/2, requests with bodies, other filters)",
    )
    cost(
        "api-route",
        "bare",
        "jwt",
        0.15,
        "`jwt` (RS256, cached key) costs ≤ 15% over the bare proxied route",
    )
    cost("wasm", "native", "wasm", 0.10, "Wasm plugin vs native filter costs ≤ 10% of req/s")
    cost(
        "wasm-proxy",
        "native",
        "wasm",
        0.10,
        "the same, in front of the reverse proxy (where an API gateway runs plugins)",
    )

    c = res.cell("stress-10k", 10000, "gateway")
    if c:
        errs = c.total("errors") + c.total("non2xx")
        peak = max(c.values("peak_rss_kib"))
        ok = errs == 0 and peak * 1024 <= 150 * MB
        rows.append(
            (
                "10,000 connections: zero errors, RSS ≤ 150 MB",
                f"{errs} errors/non-2xx, peak RSS {peak * 1024 / MB:.1f} MB",
                "met" if ok else "not met",
            )
        )
    else:
        rows.append(("10,000 connections: zero errors, RSS ≤ 150 MB", "—", "not measured"))
    if "gateway" in res.idle:
        base = "gateway" in res.idle_base
        kib = res.idle_base["gateway"] if base else res.idle["gateway"]
        what = "with the base config" if base else "with the benchmark config (plugin loaded)"
        rows.append(
            (
                "idle RSS ≤ 10 MB",
                f"{kib * 1024 / MB:.1f} MB at start, {what}",
                "met" if kib * 1024 <= 10 * MB else "not met",
            )
        )

    worse = []
    compared = 0
    for sc in res.scenarios():
        for cn in res.conns(sc):
            g = res.med(sc, cn, "gateway", "p99_ms")
            peers = [(v, p) for p in PEERS if (v := res.med(sc, cn, p, "p99_ms")) is not None]
            if g is None or not peers:
                continue
            compared += 1
            best, peer = min(peers)
            if g > best:
                above, rounds = res.rounds_above(sc, cn, "gateway", peer, "p99_ms")
                held = f", {peer}; higher in {above} of {rounds} rounds" if rounds else f", {peer}"
                worse.append(f"{sc} c={cn} ({fmt_ms(g)} vs {fmt_ms(best)} ms{held})")
    if compared:
        rows.append(
            (
                "p99 no worse than the best peer",
                f"{compared - len(worse)} of {compared} cells"
                + (f"; worse in: {', '.join(worse)}" if worse else ""),
                "met" if not worse else "not met",
            )
        )

    out = [
        "#### Targets from the issue",
        "",
        "Medians of the per-round ratios, gateway over the peer, at each concurrency measured "
        "(a round runs every target once, so a round's two figures share the host's load of "
        "the moment, which drifts between rounds by more than many of these differences). As "
        "the issue states the targets, the verdict uses requests/s when both servers were "
        f"saturated (each at least {SATURATED:.0f} % of its core, median), otherwise CPU per "
        "request, shown as requests per fully-used core; the figure the verdict used is in "
        "bold. Feature costs follow the same rule between the two routes.",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
    ]
    out += [f"| {a} | {b} | {v} |" for a, b, v in rows]
    return out + [""]


def api_route_section(res: Results) -> list[str]:
    """The `api-route` scenario, server by server: what the API route's filters cost over the
    same server's bare proxy route, and how many requests a core serves against nginx's; then
    the same for its `cors` variant, with the CORS filter's own share (cors over api)."""
    sc = "api-route"
    rows = []
    for c in res.conns(sc):
        # The API route on every server, behind CORS where the server has that variant, then
        # the gateway's `jwt` route (no peer has one: its "vs nginx" is the bare route's only).
        for variant, shown in (("api", "{}"), ("cors", "{} cors"), ("jwt", "{} (jwt)")):
            suffix = f" {variant}"
            targets = res.targets.get(sc, [])
            servers = [t.removesuffix(suffix) for t in targets if t.endswith(suffix)]
            rows += api_route_rows(res, c, servers, variant, shown)
    if not rows:
        return []
    return [
        "#### The API route",
        "",
        "`api-route`: each server's API route (a rate limit nothing reaches, header edits both "
        "ways, the proxy) beside its bare proxy route, in the same rounds; the bare route's "
        "figures in brackets. Filters' CPU: the API route's CPU per request over the bare "
        "route's; vs nginx: requests per fully-used core over nginx's on the same route "
        "(medians of the per-round ratios). The `cors` rows are the API route behind a CORS "
        "policy allowing the requests' origin; in brackets, the CORS filter's own share (its "
        "CPU per request over the API route's). `(jwt)`: the gateway's bare route behind a "
        "`jwt` filter (RS256, cached key), sent one valid token.",
        "",
        "| conns | server | req/s | req/s per core | CPU µs/req | filters' CPU per request "
        "| req/s per core vs nginx |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def compress_section(res: Results) -> list[str]:
    """The `compress-gzip` scenario: the uncompressed bytes each server compresses and sends
    per second, and per fully-used core, against nginx's `gzip on` at the same level."""
    sc = "compress-gzip"
    size = TEXT_SIZE / (1024 * 1024)
    rows = []
    for c in res.conns(sc):
        for s in res.targets.get(sc, []):
            rps, per_core = res.med(sc, c, s, "rps"), res.med(sc, c, s, "req_per_core")
            if rps is None:
                continue
            vs = None if s == "nginx" else res.paired(sc, c, s, "nginx", "req_per_core")
            rows.append(
                f"| {c} | {s} | {fmt_k(rps)} | {rps * size:.0f} "
                f"| {'—' if per_core is None else f'{per_core * size:.0f}'} "
                f"| {fmt_ms(res.med(sc, c, s, 'cpu_us_per_req'))} | {fmt_ratio(vs)} |"
            )
    if not rows:
        return []
    return [
        "#### Compression",
        "",
        f"`{sc}`: the backend's {TEXT_SIZE // 1024} KiB JSON proxied and gzip-compressed on the "
        "way at the same level (the gateway's `compress` filter, nginx's `gzip on`). MiB/s: "
        "uncompressed bytes compressed and sent per second; per core: per fully-used server "
        "core; vs nginx: the per-core figure over nginx's (median of the per-round ratios).",
        "",
        "| conns | server | req/s | MiB/s | MiB/s per core | CPU µs/req | per core vs nginx |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def api_route_rows(
    res: Results, c: int, servers: list[str], variant: str, shown: str
) -> list[str]:
    """The `api-route` rows of one variant at `c` connections, one per server measured."""
    sc, rows = "api-route", []
    for s in servers:
        route, bare = f"{s} {variant}", f"{s} bare"
        if res.cell(sc, c, route) is None:
            continue
        filters = res.paired(sc, c, route, bare, "cpu_us_per_req")
        cost = "—" if filters is None else f"{filters - 1:+.1%}"
        alone = res.paired(sc, c, route, f"{s} api", "cpu_us_per_req")
        if variant == "cors" and alone is not None:
            cost += f" (cors {alone - 1:+.1%})"
        # nginx's own row would say 1×: its figures are the reference.
        vs = [
            res.paired(sc, c, f"{s} {v}", f"nginx {v}", "req_per_core")
            for v in (variant, "bare")
            if s != "nginx"
        ] or [None, None]
        rows.append(
            f"| {c} | {shown.format(s)} | {fmt_k(res.med(sc, c, route, 'rps'))} "
            f"| {fmt_k(res.med(sc, c, route, 'req_per_core'))} "
            f"({fmt_k(res.med(sc, c, bare, 'req_per_core'))}) "
            f"| {fmt_ms(res.med(sc, c, route, 'cpu_us_per_req'))} "
            f"({fmt_ms(res.med(sc, c, bare, 'cpu_us_per_req'))}) "
            f"| {cost} "
            f"| {fmt_ratio(vs[0])} ({fmt_ratio(vs[1])}) |"
        )
    return rows


def kernel_floor_section(res: Results) -> list[str]:
    """For each target that asks the gateway to beat a peer by a margin: the CPU per request
    the margin leaves it (the peer's CPU per request over the goal) against the gateway's
    system time alone. Where the kernel's work for the gateway's requests already takes the
    whole budget, no user-space change can meet the target on this host."""
    rows = []
    for scenario, peer, goal in (
        ("static-1k", "nginx", 1.3),
        ("proxy", "nginx", 1.2),
        ("tls-h2-1k", "nginx", 1.2),
    ):
        for c in res.conns(scenario):
            g_cpu = res.med(scenario, c, "gateway", "cpu_us_per_req")
            g_sys = res.med(scenario, c, "gateway", "sys_us_per_req")
            p_cpu = res.med(scenario, c, peer, "cpu_us_per_req")
            p_sys = res.med(scenario, c, peer, "sys_us_per_req")
            if None in (g_cpu, g_sys, p_cpu, p_sys):
                continue
            budget = p_cpu / goal
            if g_cpu <= budget:
                verdict = f"met, with {budget - g_cpu:.2f} µs to spare"
            elif g_sys >= budget:
                verdict = "out of reach: the kernel time alone exceeds the budget"
            else:
                verdict = f"user time would have to fall to {budget - g_sys:.2f} µs"
            rows.append(
                f"| {scenario} vs {peer} ≥ {goal}× | {c} | {g_cpu - g_sys:.2f} | {g_sys:.2f} "
                f"| {p_cpu - p_sys:.2f} | {p_sys:.2f} | {budget:.2f} | {verdict} |"
            )
    if not rows:
        return []
    return [
        "#### What the margins over nginx leave",
        "",
        "CPU per request split into user and system time (medians of the rounds, µs). The "
        "budget is the peer's CPU per request over the target's factor: to meet the target the "
        "gateway's whole CPU per request has to fit in it.",
        "",
        "| target | conns | gateway user | gateway system | peer user | peer system | budget "
        "| what meeting it takes |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def memory_section(res: Results) -> list[str]:
    if not res.idle:
        return []
    out = [
        "#### Memory",
        "",
        "Idle: 2 s after start-up, with the benchmark config (for the gateway that loads the "
        "Wasm plugin); base config: the gateway without its optional sections (no plugin, WAF "
        "or HTTP/3).",
        "",
        "| server | idle RSS, base config (MiB) | idle RSS at start (MiB) "
        "| idle RSS after the run (MiB) | peak RSS, 10,000 connections (MiB) |",
        "|---|---|---|---|---|",
    ]
    for server, kib in res.idle.items():
        stress = res.cell("stress-10k", 10000, server)
        peak = (
            max(stress.values("peak_rss_kib")) if stress and stress.values("peak_rss_kib") else None
        )
        out.append(
            f"| {server} | {fmt_mib(res.idle_base.get(server))} | {fmt_mib(kib)} | "
            f"{fmt_mib(res.idle_after.get(server))} | "
            f"{fmt_mib(peak)} |"
        )
    return out + [""]


def scenario_tables(res: Results) -> list[str]:
    out = [
        "#### All cells",
        "",
        "req/s: median (min–max). CPU µs/req: the server's user + system CPU time over the "
        "run divided by the requests served. req/s per core: req/s × 100 / server CPU %. "
        "Peak RSS: the largest resident set sampled during the run (every process of the "
        "server).",
        "",
    ]
    for sc in res.scenarios():
        title = BY_NAME[sc].title if sc in BY_NAME else sc
        out += [
            f"**{title}** (`{sc}`)",
            "",
            "| conns | target | req/s | p50 ms | p99 ms | CPU µs/req | req/s per core | "
            "server CPU % | peak RSS MiB | errors | non-2xx |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for cn in res.conns(sc):
            for t in res.targets[sc]:
                c = res.cell(sc, cn, t)
                if c is None:
                    continue
                peak = max(c.values("peak_rss_kib")) if c.values("peak_rss_kib") else None
                out.append(
                    f"| {cn} | {t} | {fmt_span_k(c, 'rps')} | {fmt_ms(c.median('p50_ms'))} | "
                    f"{fmt_ms(c.median('p99_ms'))} | {fmt_ms(c.median('cpu_us_per_req'))} | "
                    f"{fmt_k(c.median('req_per_core'))} | {fmt_ms(c.median('cpu_pct'))} | "
                    f"{fmt_mib(peak)} | {c.total('errors')} | {c.total('non2xx')} |"
                )
        out.append("")
    return out


def compare_section(res: Results) -> list[str]:
    """Ratios of this build over the other when the run compared two gateway builds."""
    pairs = []
    for sc in res.scenarios():
        for t in res.targets[sc]:
            if res.server_of.get(t) != "gateway":
                continue
            other = t.replace("gateway", "gateway-other", 1)
            if other in res.targets[sc]:
                pairs += [(sc, cn, t, other) for cn in res.conns(sc)]
    if not pairs:
        return []
    out = [
        "#### This build over the other (`--compare`)",
        "",
        "Medians of the per-round ratios, gateway over gateway-other: above 1 is better for "
        "req/s and req/s per core, below 1 is better for p99 and CPU per request. Differences "
        "under ~20% are noise on these machines unless they repeat.",
        "",
        "| scenario | conns | target | req/s | req/s per core | p99 | CPU µs/req | peak RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sc, cn, t, o in pairs:
        cells = [
            fmt_ratio(res.paired(sc, cn, t, o, col))
            for col in ("rps", "req_per_core", "p99_ms", "cpu_us_per_req", "peak_rss_kib")
        ]
        out.append(f"| {sc} | {cn} | {t} | " + " | ".join(cells) + " |")
    return out + [""]


# === plots ===


def plot(res: Results, plots: Path, doc_dir: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (run.sh installs it)", file=sys.stderr)
        return []
    plots.mkdir(parents=True, exist_ok=True)
    cells = [(sc, res.main_conns(sc)) for sc in res.scenarios() if res.main_conns(sc)]
    made = []

    def grid(col: str, title: str, name: str) -> None:
        n = len(cells)
        if n == 0:
            return
        ncols = 4
        nrows = (n + ncols - 1) // ncols
        fig, axes = plt.subplots(nrows, ncols, figsize=(4 * ncols, 2.9 * nrows), squeeze=False)
        for ax, (sc, cn) in zip(axes.flat, cells, strict=False):
            labels, meds, lo, hi, colors = [], [], [], [], []
            for t in res.targets[sc]:
                c = res.cell(sc, cn, t)
                if c is None or c.median(col) is None:
                    continue
                m, (a, b) = c.median(col), c.span(col)
                labels.append(t.replace(" ", "\n"))
                meds.append(m)
                lo.append(m - a)
                hi.append(b - m)
                colors.append(COLORS.get(res.server_of.get(t, t), "#bcbd22"))
            ax.bar(range(len(meds)), meds, yerr=[lo, hi], color=colors, capsize=3)
            ax.set_xticks(range(len(meds)), labels, fontsize=7)
            ax.set_title(f"{sc} (c={cn})", fontsize=9)
            ax.tick_params(axis="y", labelsize=7)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.suptitle(title + " (median, bars: min–max of the rounds)", fontsize=11)
        fig.tight_layout()
        fig.savefig(plots / name, dpi=90)
        plt.close(fig)
        made.append((title, name))

    grid("rps", "Requests per second", "throughput.png")
    grid("req_per_core", "Requests per second per fully-used server core", "per_core.png")
    grid("cpu_us_per_req", "Server CPU time per request (µs)", "cpu_per_request.png")
    grid("p99_ms", "p99 latency (ms)", "p99.png")

    multi = [sc for sc in res.scenarios() if len(res.conns(sc)) > 1]
    if multi:
        ncols = min(3, len(multi))
        nrows = (len(multi) + ncols - 1) // ncols
        fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.2 * nrows), squeeze=False)
        for ax, sc in zip(axes.flat, multi, strict=False):
            for t in res.targets[sc]:
                xs = [cn for cn in res.conns(sc) if res.med(sc, cn, t, "rps") is not None]
                ax.plot(
                    xs,
                    [res.med(sc, cn, t, "rps") for cn in xs],
                    marker="o",
                    label=t,
                    color=COLORS.get(res.server_of.get(t, t)),
                )
            ax.set_xscale("log")
            ax.set_title(sc, fontsize=9)
            ax.set_xlabel("connections", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(multi) :]:
            ax.axis("off")
        fig.suptitle("Requests per second by concurrency (median)", fontsize=11)
        fig.tight_layout()
        fig.savefig(plots / "concurrency.png", dpi=90)
        plt.close(fig)
        made.append(("Requests per second by concurrency", "concurrency.png"))

    if res.idle:
        servers = list(res.idle)
        fig, ax = plt.subplots(figsize=(7, 3.2))
        x = range(len(servers))
        ax.bar(
            [i - 0.2 for i in x],
            [res.idle[s] / 1024 for s in servers],
            width=0.4,
            label="idle at start",
            color=[COLORS.get(s, "#bcbd22") for s in servers],
        )
        peaks = []
        for s in servers:
            c = res.cell("stress-10k", 10000, s)
            peaks.append(
                max(c.values("peak_rss_kib")) / 1024 if c and c.values("peak_rss_kib") else 0
            )
        ax.bar(
            [i + 0.2 for i in x],
            peaks,
            width=0.4,
            label="peak, 10,000 connections",
            color=[COLORS.get(s, "#bcbd22") for s in servers],
            alpha=0.5,
            hatch="//",
        )
        ax.set_xticks(list(x), servers, fontsize=8)
        ax.set_ylabel("RSS (MiB)")
        ax.legend(fontsize=8)
        ax.set_title("Resident memory", fontsize=11)
        fig.tight_layout()
        fig.savefig(plots / "memory.png", dpi=90)
        plt.close(fig)
        made.append(("Resident memory", "memory.png"))

    rel = (
        plots.resolve().relative_to(doc_dir.resolve())
        if plots.resolve().is_relative_to(doc_dir.resolve())
        else plots
    )
    return [f"![{title}]({rel}/{name})" for title, name in made] + [""]


def render(res: Results, plots: Path | None, doc_dir: Path) -> str:
    out = header(res) + targets_section(res) + api_route_section(res) + compress_section(res)
    out += kernel_floor_section(res)
    out += compare_section(res)
    out += memory_section(res)
    if plots is not None:
        out += ["#### Plots", ""] + plot(res, plots, doc_dir)
    out += scenario_tables(res)
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("csv", type=Path, nargs="?", default=REPO / "benches/results/LATEST.csv")
    p.add_argument("--doc", type=Path, default=REPO / "docs/benchmarks.md")
    p.add_argument("--plots", type=Path, default=REPO / "docs/bench")
    p.add_argument("--stdout", action="store_true", help="print the Markdown instead")
    args = p.parse_args(argv)
    res = Results(args.csv)
    if args.stdout:
        # Only the text: the plots in the docs belong to the run the docs show.
        sys.stdout.write(render(res, None, args.doc.parent))
        return 0
    text = render(res, args.plots, args.doc.parent)
    doc = args.doc.read_text()
    if BEGIN not in doc or END not in doc:
        sys.exit(f"{args.doc} has no {BEGIN} ... {END} markers")
    new = re.sub(
        re.escape(BEGIN) + r".*?" + re.escape(END),
        lambda _: f"{BEGIN}\n{text}{END}",
        doc,
        flags=re.S,
    )
    args.doc.write_text(new)
    print(f"updated {args.doc} and the plots in {args.plots}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
