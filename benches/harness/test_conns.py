#!/usr/bin/env python3
"""Checks the pure parts of the `conns-10k` benchmark (conns.py, slowclients.py): the configs
filled in for each cell (and accepted by nginx where it is installed), memory per connection,
the plan of runs, the tables, and the slow clients against a server that closes them.

    python3 -m unittest discover -s benches/harness -p 'test_*.py'
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conns  # noqa: E402
import slowclients  # noqa: E402
from servers import Env, Server  # noqa: E402

STREAM_MODULE = Path("/usr/lib/nginx/modules/ngx_stream_module.so")


def server(kind: str, work: Path) -> Server:
    env = Env(work, work / "root", work / "cert.pem", work / "key.pem", work / "pem", None,
              23080, "1", "0")  # fmt: skip
    return Server(kind, kind, {"gateway": 23200, "nginx": 23300, "h2o": 23600}[kind], env)


def row(cell: str, srv: str, **values: object) -> dict:
    return {"cell": cell, "server": srv, **values}


class Configs(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.work = Path(self.tmp.name)

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def test_every_listener_gets_the_option_and_streams_do_not(self) -> None:
        yaml = (
            "server:\n  worker_threads: 1\n"
            "listeners:\n"
            "  - name: plain\n    bind: 127.0.0.1:1\n    protocols: [http1]\n"
            "  - name: tls\n    bind: 127.0.0.1:2\n"
            "routes: []\n"
            "streams:\n  - name: l4\n    bind: 127.0.0.1:3\n"
        )
        out = conns.with_listener_option(yaml, "header_read_timeout", "5s")
        self.assertEqual(out.count("header_read_timeout: 5s"), 2)
        self.assertIn("    bind: 127.0.0.1:1\n    header_read_timeout: 5s\n    protocols", out)
        self.assertIn("    bind: 127.0.0.1:2\n    header_read_timeout: 5s\nroutes", out)
        self.assertTrue(out.endswith("    bind: 127.0.0.1:3\n"))

    def test_the_directive_goes_into_the_http_block(self) -> None:
        conf = "events {\n}\n\nhttp {\n    access_log off;\n}\n"
        out = conns.with_http_directive(conf, "client_header_timeout 5s;")
        self.assertEqual(out, "events {\n}\n\nhttp {\n    client_header_timeout 5s;\n"
                              "    access_log off;\n}\n")  # fmt: skip
        with self.assertRaises(ValueError):
            conns.with_http_directive("events {\n}\n", "x 1;")

    def test_durations_as_the_configs_write_them(self) -> None:
        self.assertEqual(conns.seconds_text(5), "5s")
        self.assertEqual(conns.seconds_text(5.0), "5s")
        self.assertEqual(conns.seconds_text(1.5), "1500ms")

    def test_the_gateway_runs_its_base_config_with_the_timeout_only_when_slow(self) -> None:
        gw = server("gateway", self.work)
        plain = conns.config_text(gw, conns.CELLS["plain"], 5)
        slow = conns.config_text(gw, conns.CELLS["slow"], 5)
        for text in (plain, slow):
            # The optional sections are gone: no plugin, WAF, HTTP/3 or second listener.
            self.assertNotRegex(text, r"(?m)^# >>> ")
            self.assertNotIn("name: quic", text)
            self.assertNotIn("name: general", text)
            self.assertIn("name: plain", text)
            self.assertIn("name: tls", text)
            self.assertNotIn("{{", text)
        self.assertNotIn("header_read_timeout", plain)
        self.assertEqual(slow.count("header_read_timeout: 5s"), 2)
        self.assertEqual(slow.replace("    header_read_timeout: 5s\n", ""), plain)

    def test_nginx_closes_slow_heads_after_the_same_timeout(self) -> None:
        ng = server("nginx", self.work)
        plain = conns.config_text(ng, conns.CELLS["plain"], 5)
        slow = conns.config_text(ng, conns.CELLS["slow"], 5)
        self.assertNotIn("client_header_timeout", plain)
        self.assertEqual(slow.count("client_header_timeout 5s;"), 1)
        # Limits for 10,000 connections, set in the template for every cell.
        for line in ("worker_connections 20000;", "worker_rlimit_nofile 20000;", "backlog=65535"):
            self.assertIn(line, plain)
        self.nginx_accepts(conns.write_config(ng, conns.CELLS["slow"], 5))

    def test_h2o_takes_10000_connections_and_has_no_slow_cell(self) -> None:
        h2o = server("h2o", self.work)
        self.assertIn("max-connections: 20000", conns.config_text(h2o, conns.CELLS["h2"], 5))
        with self.assertRaises(ValueError):
            conns.config_text(h2o, conns.CELLS["slow"], 5)
        self.assertEqual([c for c in conns.CELLS.values() if "h2o" in c.kinds],
                         [conns.CELLS["h2"]])  # fmt: skip

    def nginx_accepts(self, config: Path) -> None:
        """`nginx -t` on the filled config (skipped without nginx and its stream module)."""
        if not shutil.which("nginx") or not STREAM_MODULE.is_file():
            return
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=t", "-keyout",
             str(self.work / "key.pem"), "-out", str(self.work / "cert.pem"), "-days", "1"],
            capture_output=True, check=True,
        )  # fmt: skip
        prefix = self.work / "prefix"
        prefix.mkdir()
        check = subprocess.run(
            ["nginx", "-t", "-p", str(prefix), "-e", str(self.work / "err.log"), "-c", str(config)],
            capture_output=True,
            text=True,
        )
        self.assertEqual(check.returncode, 0, check.stderr)


class Arithmetic(unittest.TestCase):
    def test_memory_per_connection_is_the_growth_over_the_connections(self) -> None:
        # 21,000 KiB idle, 61,000 KiB at the peak, 10,000 connections: 4 KiB each.
        self.assertEqual(conns.per_conn_kib(61000, 21000, 10000), 4.0)
        self.assertEqual(conns.per_conn_kib(21500, 21000, 10000), 0.05)
        self.assertIsNone(conns.per_conn_kib(61000, 21000, 0))

    def test_a_slow_client_counts_once(self) -> None:
        res = slowclients.summarize([5.1, 5.4, 6.9, 7.2], 7.0, 6, 1, 6, 2)
        self.assertEqual((res.closed_in_time, res.closed_late, res.open_at_end), (3, 1, 2))
        self.assertEqual((res.connected, res.errors, res.peak_open, res.answered), (6, 1, 6, 2))
        self.assertEqual((res.close_p50_s, res.close_max_s), (6.15, 7.2))
        self.assertIsNone(slowclients.summarize([], 7.0, 3, 0, 3, 0).close_p50_s)


class Plan(unittest.TestCase):
    def test_cells_in_turn_servers_reordered_each_round(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            servers = [server(k, work) for k in ("gateway", "nginx", "h2o")]
            args = argparse.Namespace(rounds=2, cell_names=["plain", "h2"])
            got = [(r, c.name, s.name) for r, c, s in conns.plan(args, servers)]
        self.assertEqual(
            got,
            [
                (1, "plain", "gateway"), (1, "plain", "nginx"),
                (1, "h2", "gateway"), (1, "h2", "nginx"), (1, "h2", "h2o"),
                (2, "plain", "nginx"), (2, "plain", "gateway"),
                (2, "h2", "h2o"), (2, "h2", "nginx"), (2, "h2", "gateway"),
            ],
        )  # fmt: skip


class Tables(unittest.TestCase):
    ROWS = [
        row("plain", "gateway", idle_rss_kib=12288, peak_rss_kib=61440, after_rss_kib=34816,
            per_conn_kib=4.915, requests=140000, errors=0, non2xx=0),
        row("plain", "nginx", idle_rss_kib=21504, peak_rss_kib=27136, after_rss_kib=27136,
            per_conn_kib=0.563, requests=210000, errors=0, non2xx=0),
        row("slow", "gateway", idle_rss_kib=12288, peak_rss_kib=40960, after_rss_kib=14336,
            per_conn_kib=2.867, errors=0, conns=10000, header_timeout_s=5.0, slow_slack_s=2.0,
            slow_closed_in_time=10000, slow_closed_late=0, slow_open_at_end=0,
            slow_close_p50_s=5.42, slow_peak_open=10000),
        row("idle", "gateway", idle_rss_kib=12186, peak_rss_kib=12186, after_rss_kib=12186),
    ]  # fmt: skip

    def test_one_line_per_cell_and_server(self) -> None:
        lines = conns.table(self.ROWS)
        self.assertEqual(len(lines), 2 + 4)
        self.assertEqual(
            lines[2], "| plain | gateway | 12.0 | 60.0 | 34.0 | 4.92 | 140,000 | 0 |  |"
        )
        self.assertEqual(
            lines[4],
            "| slow | gateway | 12.0 | 40.0 | 14.0 | 2.87 | — | 0 | closed 10,000 of 10,000 "
            "within 5 s + 2 s (median 5.4 s) |",
        )
        self.assertEqual(lines[5], "| idle | gateway | 11.9 | 11.9 | 11.9 | — | — | — |  |")

    def test_rounds_show_the_median_and_the_range(self) -> None:
        rows = [row("h2", "gateway", peak_rss_kib=k) for k in (102400, 104448, 112640)]
        self.assertEqual(conns.fmt_peak(rows), "102.0 (100.0–110.0)")
        self.assertEqual(conns.fmt_peak(rows[:1]), "100.0")

    def test_slow_clients_the_server_missed_are_said(self) -> None:
        rs = [row("slow", "x", conns=10000, header_timeout_s=5.0, slow_slack_s=2.0,
                  slow_closed_in_time=9000, slow_closed_late=600, slow_open_at_end=400,
                  slow_close_p50_s=6.0, slow_peak_open=8000)]  # fmt: skip
        self.assertEqual(
            conns.slow_note(rs),
            "closed 9,000 of 10,000 within 5 s + 2 s (median 6.0 s), 600 later, 400 never; "
            "at most 8,000 open at once",
        )

    def test_targets_use_the_idle_rss_for_idle_and_the_peak_elsewhere(self) -> None:
        lines = conns.targets(self.ROWS)
        self.assertEqual(lines[2], "| idle | idle RSS ≤ 8 MB | 12.5 MB | — | no |")
        self.assertEqual(lines[3], "| plain | peak ≤ 30 MB | 62.9 MB | 27.8 MB | no |")
        self.assertEqual(lines[4], "| slow | peak ≤ 30 MB | 41.9 MB | — | no |")
        self.assertEqual(len(lines), 5)

    def test_a_cell_where_nginx_failed_is_flagged(self) -> None:
        rows = self.ROWS + [row("tls", "nginx", errors=12), row("tls", "gateway", errors=3)]
        self.assertEqual(
            conns.untrusted(rows), ["tls: nginx had 12 errors; do not compare this cell"]
        )
        self.assertIn("- tls: nginx had 12 errors", conns.render(rows))
        self.assertNotIn("do not compare", conns.render(self.ROWS))


class SlowClients(unittest.TestCase):
    def test_clients_closed_by_the_server_are_counted(self) -> None:
        """A server that reads each head and closes the connection 0.2 s later."""
        listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        port = listener.getsockname()[1]
        heads: list[bytes] = []

        def serve() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                heads.append(conn.recv(1024))
                threading.Timer(0.2, conn.close).start()

        threading.Thread(target=serve, daemon=True).start()
        try:
            res = slowclients.run("127.0.0.1", port, 20, timeout=0.2, slack=1.0, in_flight=4)
        finally:
            listener.close()
        self.assertEqual((res.connected, res.errors, res.closed_in_time), (20, 0, 20))
        self.assertEqual((res.closed_late, res.open_at_end, res.answered), (0, 0, 0))
        self.assertEqual(heads, [slowclients.HALF_HEAD] * 20)
        self.assertFalse(slowclients.HALF_HEAD.endswith(b"\r\n\r\n"))

    def test_clients_the_server_keeps_are_closed_by_them(self) -> None:
        listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        try:
            res = slowclients.run(
                "127.0.0.1", listener.getsockname()[1], 5, timeout=0.1, slack=0.1
            )
        finally:
            listener.close()
        self.assertEqual((res.connected, res.closed_in_time, res.open_at_end), (5, 0, 5))
        self.assertEqual(res.peak_open, 5)


if __name__ == "__main__":
    unittest.main()
