#!/usr/bin/env python3
"""Checks the `api-route` scenario and the h2o and Pingora peers: the configs filled in (and
accepted by the servers installed here), which targets a scenario expands into, the ports and
the commands of the new kinds.

    python3 -m unittest discover -s benches/harness -p 'test_*.py'
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402
from scenarios import BY_NAME, with_token  # noqa: E402
from servers import (  # noqa: E402
    CAPABILITIES,
    CONFIGS,
    GATEWAY_SECTIONS,
    OPT_IN_SECTIONS,
    Env,
    Server,
    drop_sections,
)

STREAM_MODULE = Path("/usr/lib/nginx/modules/ngx_stream_module.so")


def env_in(work: Path) -> Env:
    return Env(work, work / "root", work / "cert.pem", work / "key.pem", work / "pem", None,
               21080, "1", "0")  # fmt: skip


def self_signed(work: Path) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-subj", "/CN=t", "-keyout", str(work / "key.pem"), "-out",
         str(work / "cert.pem"), "-days", "1"],
        capture_output=True, check=True,
    )  # fmt: skip


def server(kind: str, work: Path, base: int = 28000) -> Server:
    binary = work / kind if kind in ("gateway", "pingora") else None
    return Server(kind, kind, base, env_in(work), binary=binary)


class ConfigCase(unittest.TestCase):
    """A scratch dir per test, and `nginx -t` on the configs written there."""

    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.work = Path(self.tmp.name)

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def nginx_accepts(self, config: Path) -> None:
        """`nginx -t` on a filled config, as the harness starts it (skipped without nginx)."""
        if not shutil.which("nginx") or not STREAM_MODULE.is_file():
            return
        prefix = self.work / "prefix"
        prefix.mkdir(exist_ok=True)
        check = subprocess.run(
            ["nginx", "-t", "-p", str(prefix), "-e", str(self.work / "err.log"), "-c", str(config)],
            capture_output=True,
            text=True,
        )
        self.assertEqual(check.returncode, 0, check.stderr)


class Configs(ConfigCase):
    def test_nginx_api_route_does_the_same_work(self) -> None:
        self_signed(self.work)
        config = server("nginx", self.work).write_config()
        assert config is not None
        text = config.read_text()
        api = text[text.index("location /api {") :]
        api = api[: api.index("}")]
        self.assertIn("limit_req_zone $binary_remote_addr zone=api", text)
        for line in (
            "limit_req zone=api burst=100000 nodelay;",
            'proxy_set_header X-Api-Version "1";',
            'proxy_set_header X-Debug "";',
            "add_header X-Content-Type-Options nosniff always;",
            "proxy_hide_header X-Powered-By;",
            # The forwarding fields of the bare /proxy route.
            "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
            'add_header Via "1.1 nginx" always;',
        ):
            self.assertIn(line, api)
        self.assertIn(f"server 127.0.0.1:{env_in(self.work).backend_port};", text)
        self.nginx_accepts(config)

    def test_nginx_redirects_old_to_new_as_the_gateway_does(self) -> None:
        self_signed(self.work)
        config = server("nginx", self.work).write_config()
        assert config is not None
        self.assertIn("rewrite ^/old(/.*)$ /new$1 permanent;", config.read_text())
        gateway = (CONFIGS / "gateway.yaml").read_text()
        self.assertIn("redirect: { replace_prefix: /new, status: 301 }", gateway)
        self.nginx_accepts(config)

    def test_the_backend_sends_the_hidden_field_under_api_only(self) -> None:
        config = server("backend", self.work).write_config()
        assert config is not None
        text = config.read_text()
        root = text[text.index("location / {") : text.index("location /api {")]
        api = text[text.index("location /api {") :]
        self.assertNotIn("X-Powered-By", root)
        self.assertIn("add_header X-Powered-By backend;", api)
        self.assertEqual(text.count('return 200 "Hello, world!\\n";'), 2)
        self.nginx_accepts(config)

    def section_routes(self, section: str, route: str) -> dict | None:
        """The gateway's routes with only `section` kept, by name, after checking that the
        section holds the route `route`; None without PyYAML."""
        self.assertEqual(GATEWAY_SECTIONS[section], section)
        text = (CONFIGS / "gateway.yaml").read_text()
        kept = drop_sections(text, set(GATEWAY_SECTIONS) - {section})
        self.assertIn(f"name: {route}\n", kept)
        self.assertNotIn(f"name: {route}\n", drop_sections(text, set(GATEWAY_SECTIONS)))
        try:
            import yaml
        except ImportError:
            return None
        return {r["name"]: r for r in yaml.safe_load(kept.replace("{{", "").replace("}}", ""))
                ["routes"]}  # fmt: skip

    def test_the_gateway_api_route_is_an_optional_section(self) -> None:
        routes = self.section_routes("api-route", "api")
        if routes is None:
            return
        api, bare = routes["api"], routes["proxy"]
        self.assertEqual(api["proxy"], bare["proxy"])
        self.assertNotIn("filters", bare)
        limit, headers = api["filters"][0]["rate_limit"], api["filters"][1]["headers"]
        self.assertEqual(
            (limit["key"], limit["requests"], limit["per"]), ("client_ip", 1000000, "1s")
        )
        self.assertEqual(headers["request_set"], {"x-api-version": "1"})
        self.assertEqual(headers["request_remove"], ["x-debug"])
        self.assertEqual(headers["response_add"], {"x-content-type-options": "nosniff"})
        self.assertEqual(headers["response_remove"], ["x-powered-by"])

    def test_the_gateway_jwt_route_is_the_bare_route_behind_the_filter(self) -> None:
        routes = self.section_routes("jwt", "jwt")
        if routes is None:
            return
        jwt, bare = routes["jwt"], routes["proxy"]
        self.assertEqual(jwt["proxy"], bare["proxy"])
        [f] = jwt["filters"]
        self.assertEqual(f["jwt"]["algorithms"], ["RS256"])
        self.assertEqual(f["jwt"]["jwks"], {"file": "JWKS"})

    def test_without_a_key_set_the_jwt_section_is_skipped_and_says_why(self) -> None:
        s = server("gateway", self.work)
        self.assertIsNone(s.env.jwks)
        s._validate = lambda text, path: (True, "")  # type: ignore[method-assign]
        config = s.write_config()
        assert config is not None
        self.assertNotIn("name: jwt\n", config.read_text())
        self.assertNotIn("jwt", s.capabilities)
        self.assertEqual(s.skipped_sections["jwt"], "no jwt_fixture was built")
        s.env.jwks = self.work / "jwks.json"
        s.skipped_sections.clear()
        text = s.write_config().read_text()  # type: ignore[union-attr]
        self.assertIn(f'jwks: {{ file: "{self.work / "jwks.json"}" }}', text)
        self.assertIn("jwt", s.capabilities)

    def test_the_traced_section_is_kept_only_when_asked_for(self) -> None:
        s = server("gateway", self.work)
        s._validate = lambda text, path: (True, "")  # type: ignore[method-assign]
        text = s.write_config().read_text()  # type: ignore[union-attr]
        self.assertNotIn("telemetry:", text)
        self.assertNotIn("traced", s.capabilities)
        self.assertIn("traced", s.skipped_sections)
        s = server("gateway", self.work)
        s._validate = lambda text, path: (True, "")  # type: ignore[method-assign]
        s.opt_in = set(OPT_IN_SECTIONS)
        text = s.write_config().read_text()  # type: ignore[union-attr]
        backend = env_in(self.work).backend_port
        self.assertIn(f"otlp_endpoint: http://127.0.0.1:{backend}/v1/traces", text)
        self.assertIn("sample_ratio: 1.0", text)
        self.assertIn("traced", s.capabilities)
        self.assertNotIn("traced", s.skipped_sections)

    def test_the_backend_accepts_otlp_exports(self) -> None:
        config = server("backend", self.work).write_config()
        assert config is not None
        text = config.read_text()
        otlp = text[text.index("location /v1/ {") :]
        self.assertIn('return 200 "";', otlp[: otlp.index("}")])
        self.nginx_accepts(config)

    def test_h2o_config_is_filled_and_accepted(self) -> None:
        self_signed(self.work)
        s = server("h2o", self.work)
        config = s.write_config()
        assert config is not None
        text = config.read_text()
        self.assertNotIn("{{", text)
        self.assertIn(f"port: {s.ports['http']}", text)
        self.assertIn(f"port: {s.ports['tls']}", text)
        self.assertIn(f"file.dir: {self.work / 'root'}/static", text)
        if shutil.which("h2o"):
            check = subprocess.run(["h2o", "-t", "-c", str(config)], capture_output=True, text=True)
            self.assertEqual(check.returncode, 0, check.stdout + check.stderr)


class Commands(unittest.TestCase):
    def test_pingora_listens_on_its_http_port_and_proxies_to_the_backend(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            s = server("pingora", Path(d), base=28700)
            self.assertIsNone(s.write_config())
            cmd, _ = s.command(None)
        binary = str(Path(d) / "pingora")
        self.assertEqual(
            cmd, ["taskset", "-c", "1", binary, "127.0.0.1:28700", "127.0.0.1:21080"]
        )

    def test_pingora_is_stopped_without_its_graceful_shutdown(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            s = server("pingora", Path(d))
            # Like Pingora: SIGTERM starts a drain that outlasts the harness's wait, SIGINT ends it.
            s.proc = subprocess.Popen(
                [sys.executable, "-c",
                 "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                 "signal.signal(signal.SIGINT, lambda *_: sys.exit(3)); "
                 "print(flush=True); time.sleep(30)"],
                stdout=subprocess.PIPE,
            )  # fmt: skip
            assert s.proc.stdout is not None
            s.proc.stdout.readline()  # the handlers are set
            s.stop()
            s.proc.stdout.close()
            self.assertEqual(s.proc.returncode, 3)

    def test_h2o_runs_its_config(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            cmd, _ = server("h2o", Path(d)).command(Path(d) / "h2o.conf")
        self.assertEqual(cmd[3:], ["h2o", "--conf", str(Path(d) / "h2o.conf")])


class PlanCase(unittest.TestCase):
    """Which targets a scenario becomes on a full set of servers (none started)."""

    def targets(self, name: str, gateway_sections: set[str]) -> tuple[list[str], list[str]]:
        with tempfile.TemporaryDirectory() as d:
            servers = [server(k, Path(d)) for k in bench.PEER_KINDS if k != "hyper"]
        gateway = servers[0]
        gateway.capabilities |= {GATEWAY_SECTIONS[s] for s in gateway_sections}
        for s in set(GATEWAY_SECTIONS) - gateway_sections:
            gateway.skipped_sections[s] = "unknown field `api`"
        args = argparse.Namespace(h3load=Path("/nonexistent/h3load"))
        skipped: list[str] = []
        out = bench.targets_for(BY_NAME[name], servers, args, skipped)
        return [f"{t.label} {t.url.split('/', 3)[3]}" for t in out], skipped


class Expansion(PlanCase):
    def test_redirect_runs_on_the_gateway_and_nginx_expecting_a_301(self) -> None:
        labels, skipped = self.targets("redirect", set(GATEWAY_SECTIONS))
        self.assertEqual(labels, ["gateway old/hello", "nginx old/hello"])
        self.assertEqual((BY_NAME["redirect"].status, BY_NAME["redirect"].body_size), (301, None))
        self.assertEqual(skipped, [])

    def test_api_route_is_each_servers_route_beside_its_bare_route(self) -> None:
        labels, skipped = self.targets("api-route", set(GATEWAY_SECTIONS))
        self.assertEqual(
            labels,
            [
                "gateway bare proxy/hello",
                "gateway api api/hello",
                "gateway cors api/cors/hello",
                "gateway rewrite api-rewrite/hello",
                "gateway jwt jwt/hello",
                "nginx bare proxy/hello",
                "nginx api api/hello",
                "nginx cors api/cors/hello",
                "pingora bare proxy/hello",
                "pingora api api/hello",
            ],
        )
        self.assertEqual(skipped, [])

    def test_api_route_runs_on_the_main_port_with_the_header_to_remove(self) -> None:
        sc = BY_NAME["api-route"]
        self.assertEqual((sc.port, sc.tool, sc.close), ("http", "wrk", False))
        self.assertIn("X-Debug: 1", sc.headers)

    def test_every_api_route_target_is_sent_the_token_or_none_without_one(self) -> None:
        headers = BY_NAME["api-route"].headers
        origin = "Origin: https://app.example.com"
        self.assertEqual(
            with_token(headers, "h.p.s"), ["X-Debug: 1", origin, "Authorization: Bearer h.p.s"]
        )
        self.assertEqual(with_token(headers, ""), ["X-Debug: 1", origin])

    def test_a_gateway_without_the_section_says_why(self) -> None:
        labels, skipped = self.targets("api-route", set(GATEWAY_SECTIONS) - {"api-route"})
        self.assertIn("gateway bare proxy/hello", labels)
        self.assertNotIn("gateway api api/hello", labels)
        self.assertEqual(skipped, ["api-route: gateway api: unknown field `api`"])

    def test_the_new_peers_take_the_scenarios_they_can_serve(self) -> None:
        servers_of = {
            name: {label.split(" ")[0] for label in self.targets(name, set())[0]}
            for name in ("static-1k", "static-304", "tls-h1-1k", "hello", "proxy", "proxy-close")
        }
        for name in ("static-1k", "static-304", "tls-h1-1k", "hello"):
            self.assertIn("h2o", servers_of[name], name)
            self.assertNotIn("pingora", servers_of[name], name)
        for name in ("proxy", "proxy-close"):
            self.assertIn("pingora", servers_of[name], name)
            self.assertNotIn("h2o", servers_of[name], name)
        self.assertEqual(CAPABILITIES["pingora"], {"proxy", "api-route"})

    def test_heads_are_compared_within_a_variant(self) -> None:
        def target(label: str) -> bench.Target:
            return bench.Target(label, None, "", label.split(" ")[1])  # type: ignore[arg-type]

        heads = {
            "gateway bare": {"server", "date", "via"},
            "nginx bare": {"server", "date", "via"},
            "gateway api": {"server", "date", "via", "ratelimit", "x-content-type-options"},
            "nginx api": {"server", "date", "via", "x-content-type-options"},
        }
        targets = [target(label) for label in heads]
        self.assertEqual(
            bench.variant_head_differences("api-route", targets, heads),
            ["api-route api: nginx api's answer lacks ratelimit (against gateway api's)"],
        )


class Ports(unittest.TestCase):
    def test_every_instance_has_its_own_ports(self) -> None:
        bases = bench.port_bases(21000)
        self.assertEqual(set(bases), set(bench.PEER_KINDS) | {"gateway-other"})
        taken = sorted(b + i for b in bases.values() for i in range(5))
        self.assertEqual(len(taken), len(set(taken)))
        self.assertTrue(all(21100 <= p <= 21804 for p in taken))

    def test_the_pingora_version_comes_from_its_lock_file(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            lock = Path(d) / "Cargo.lock"
            lock.write_text(
                'version = 4\n\n[[package]]\nname = "pingora-core"\nversion = "0.9.0"\n\n'
                '[[package]]\nname = "pingora"\nversion = "0.9.1"\nsource = "registry"\n'
            )
            self.assertEqual(bench.locked_version(lock, "pingora"), "pingora 0.9.1")
            self.assertEqual(bench.locked_version(lock, "h2"), "")
            self.assertEqual(bench.locked_version(Path(d) / "none.lock", "pingora"), "")


if __name__ == "__main__":
    unittest.main()
