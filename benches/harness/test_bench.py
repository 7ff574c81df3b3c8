#!/usr/bin/env python3
"""Checks the harness's round order: every target once a round, and the order changing from
round to round so that no target always follows the same one.

    python3 -m unittest discover -s benches/harness -p 'test_*.py'
"""

from __future__ import annotations

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import round_order  # noqa: E402


def predecessors(targets: list[str], rounds: int) -> dict[str, set[str | None]]:
    """What ran right before each target in each round (None: it ran first)."""
    before: dict[str, set[str | None]] = {t: set() for t in targets}
    for r in range(1, rounds + 1):
        order = round_order(targets, r)
        for prev, t in zip([None, *order], order):
            before[t].add(prev)
    return before


class RoundOrder(unittest.TestCase):
    def test_the_first_rounds(self) -> None:
        orders = ["".join(round_order(["a", "b", "c"], r)) for r in range(1, 7)]
        self.assertEqual(orders, ["abc", "cba", "bca", "acb", "cab", "bac"])

    def test_every_target_runs_once_a_round(self) -> None:
        targets = ["a", "b", "c", "d", "e"]
        for r in range(1, 12):
            self.assertEqual(sorted(round_order(targets, r)), targets)

    def test_no_target_follows_the_same_one_in_every_round(self) -> None:
        # The harness's usual cells: two builds side by side, up to five servers; 2 to 5 rounds.
        for n in range(2, 6):
            targets = [chr(ord("a") + i) for i in range(n)]
            for rounds in range(2, 6):
                before = predecessors(targets, rounds)
                self.assertTrue(all(len(p) >= 2 for p in before.values()), (n, rounds, before))

    def test_no_targets_is_no_order(self) -> None:
        self.assertEqual(round_order([], 3), [])


if __name__ == "__main__":
    unittest.main()
