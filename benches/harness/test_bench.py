#!/usr/bin/env python3
"""Checks the harness's round order (every target once a round, and the order changing from
round to round so that no target always follows the same one) and that the servers compared
send the same answer.

    python3 -m unittest discover -s benches/harness -p 'test_*.py'
"""

from __future__ import annotations

import http.server
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import head_differences, jwt_fixture, probe, round_order  # noqa: E402
from servers import Env, Server  # noqa: E402


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


class FileHead(http.server.BaseHTTPRequestHandler):
    """A file's answer as nginx gives it, on a real socket."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (the handler's name is fixed by http.server)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", "4")
        self.send_header("ETag", '"6553f100-400"')
        self.send_header("Connection", "keep-alive")
        self.end_headers()
        self.wfile.write(b"abcd")

    def log_message(self, *args: object) -> None:
        pass


class SameAnswer(unittest.TestCase):
    def test_probe_reads_the_field_names(self) -> None:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FileHead)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            status, length, names = probe(f"http://127.0.0.1:{server.server_port}/f", [])
        finally:
            server.shutdown()
            server.server_close()
        self.assertEqual((status, length), (200, 4))
        self.assertTrue({"etag", "content-type", "content-length", "connection"} <= names, names)

    def test_a_peer_with_a_shorter_head_is_named(self) -> None:
        gateway = {"server", "date", "content-type", "content-length", "etag", "last-modified"}
        heads = {
            "gateway": gateway,
            "nginx": gateway | {"connection"},
            "haproxy": {"content-type", "content-length", "x-extra"},
        }
        self.assertEqual(
            head_differences("static-1k", heads),
            [
                "static-1k: haproxy's answer lacks date, etag, last-modified, server and adds "
                "x-extra (against gateway's)"
            ],
        )

    def test_nothing_to_compare_without_the_gateway(self) -> None:
        self.assertEqual(head_differences("hello", {"nginx": {"a"}, "haproxy": set()}), [])

    def test_the_jwt_fixture_gives_a_key_set_and_a_token(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            self.assertEqual(jwt_fixture(work / "missing", work), (None, ""))
            fake = work / "fixture"
            fake.write_text('#!/bin/sh\necho \'{"keys": []}\' > "$1"\necho h.p.s\n')
            fake.chmod(0o755)
            jwks, token = jwt_fixture(fake, work)
            self.assertEqual((jwks, token), (work / "jwks.json", "h.p.s"))
            self.assertEqual(jwks.read_text().strip(), '{"keys": []}')
            fake.write_text("#!/bin/sh\necho broken >&2\nexit 1\n")
            self.assertEqual(jwt_fixture(fake, work), (None, ""))

    def test_haproxy_is_given_the_validators_nginx_sends(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            pem = work / "bench.pem"
            env = Env(work, work / "root", work / "c", work / "k", pem, None, 1, "1", "0")
            config = Server("haproxy", "haproxy", 28500, env).write_config()
            assert config is not None
            text = config.read_text()
            # nginx's ETag of the harness's files: mtime and size in hex.
            self.assertIn("""hdr etag '"6553f100-400"'""", text)
            self.assertIn("""hdr etag '"6553f100-2800"'""", text)
            self.assertIn('hdr last-modified "Tue, 14 Nov 2023 22:13:20 GMT"', text)
            self.assertEqual(text.count('hdr date "%[date,http_date]"'), 3)
            if shutil.which("haproxy") and shutil.which("openssl"):
                # The config HAProxy will be started with parses (it needs the files it names).
                (work / "root" / "static").mkdir(parents=True)
                for name in ("1k.bin", "10k.bin"):
                    (work / "root" / "static" / name).write_bytes(b"x")
                key = subprocess.run(
                    ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                     "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=t", "-keyout",
                     "-", "-out", "-", "-days", "1"],
                    capture_output=True, check=True,
                )
                pem.write_bytes(key.stdout)
                check = subprocess.run(
                    ["haproxy", "-c", "-f", str(config)], capture_output=True, text=True
                )
                self.assertEqual(check.returncode, 0, check.stdout + check.stderr)


if __name__ == "__main__":
    unittest.main()
