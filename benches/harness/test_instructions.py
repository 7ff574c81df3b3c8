#!/usr/bin/env python3
"""Checks how instructions.py reads callgrind's output and which scenarios it counts.

    python3 -m unittest discover -s benches/harness -p 'test_*.py'
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from instructions import (  # noqa: E402
    Counts,
    Measured,
    countable,
    newest_dump,
    opt_in,
    read_counts,
    report,
)
from scenarios import BY_NAME  # noqa: E402

# A dump as callgrind writes one with `--dump-instr=no`: `main` runs 10 instructions of its own
# at two lines and calls `work` twice (the line after `calls=` is what those calls cost,
# inclusive: 70); `work` runs 70 of its own; names are given once and then referred to by id;
# a position may be relative (`+2`).
DUMP = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir
summary: 80

ob=(1) /bin/gateway
fl=(1) src/main.rs
fn=(1) main
10 4
+2 6
cfn=(2) work
calls=2 20
12 70

fn=(2) work
20 30
fi=(2) src/inlined.rs
+1 40

fn=(1)
cfn=(2)
calls=1 20
14 0
"""


class ReadCounts(unittest.TestCase):
    def write(self, text: str) -> Path:
        d = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, d, True)
        path = d / "callgrind.out.1"
        path.write_text(text)
        return path

    def test_own_cost_leaves_out_what_calls_cost(self) -> None:
        counts = read_counts(self.write(DUMP))
        self.assertEqual(counts.total, 80)
        self.assertEqual(counts.by_function, {"main": 10, "work": 70})

    def test_the_total_comes_from_totals_or_the_sum(self) -> None:
        counts = read_counts(self.write(DUMP.replace("summary: 80", "totals: 81")))
        self.assertEqual(counts.total, 81)
        counts = read_counts(self.write(DUMP.replace("summary: 80\n", "")))
        self.assertEqual(counts.total, 80)

    def test_the_first_event_is_the_one_read(self) -> None:
        text = DUMP.replace("events: Ir", "events: Ir Dr").replace("\n10 4\n", "\n10 4 99\n")
        self.assertEqual(read_counts(self.write(text)).by_function["main"], 10)

    def test_the_dump_is_the_file_that_was_not_there_before(self) -> None:
        d = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, d, True)
        out = d / "callgrind.new.out"
        old = d / "callgrind.new.out.1"
        old.write_text("")
        before = set(d.glob(out.name + ".*"))
        time.sleep(0.01)
        fresh = d / "callgrind.new.out.2"
        fresh.write_text("")
        self.assertEqual(newest_dump(out, before), fresh)
        with self.assertRaises(RuntimeError):
            newest_dump(out, before | {fresh})


class Countable(unittest.TestCase):
    def test_http_scenarios_of_wrk_and_h2load_only(self) -> None:
        self.assertTrue(countable(BY_NAME["proxy-close"]))
        self.assertTrue(countable(BY_NAME["wasm"]))  # both routes, on the general listener
        self.assertTrue(countable(BY_NAME["tls-h1-1k"]))
        self.assertTrue(countable(BY_NAME["tls-h2-1k"]))
        # HTTP/3 needs the project's own load generator; the L4 relay is not an HTTP listener.
        for name in ("h3-1k", "h3-1m", "l4-tcp", "l4-tcp-close"):
            self.assertFalse(countable(BY_NAME[name]), name)

    def test_the_traced_scenario_turns_tracing_on_and_no_other_does(self) -> None:
        self.assertTrue(countable(BY_NAME["traced"]))
        self.assertEqual(opt_in(BY_NAME["traced"]), {"traced"})
        for sc in BY_NAME.values():
            if sc.name != "traced":
                self.assertEqual(opt_in(sc), set(), sc.name)


class Report(unittest.TestCase):
    def test_builds_and_routes_are_compared(self) -> None:
        args = argparse.Namespace(sc=BY_NAME["wasm"], conns=10, duration=10, warmup=5, top=1)
        results = [
            Measured("new", "/native", 100, Counts(1_000_000, {"a": 600_000, "b": 400_000})),
            Measured("new", "/wasm", 50, Counts(900_000, {"a": 900_000})),
            Measured("old", "/native", 100, Counts(1_000_000, {"a": 1_000_000})),
            Measured("old", "/wasm", 50, Counts(1_000_000, {"a": 1_000_000})),
        ]
        text = report(results, args)
        self.assertIn("| new | `/wasm` | 50 | 18,000 |", text)
        self.assertIn("`/native`: new over old 1.000", text)
        self.assertIn("`/wasm`: new over old 0.900", text)
        self.assertIn("new: `/wasm` over `/native` 1.800", text)
        self.assertIn("old: `/wasm` over `/native` 2.000", text)
        # `--top 1`: the largest own cost per request, of each build's route.
        self.assertIn("     6000  a", text)
        self.assertNotIn("  b", text)


if __name__ == "__main__":
    unittest.main()
