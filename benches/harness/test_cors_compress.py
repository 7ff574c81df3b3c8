#!/usr/bin/env python3
"""Checks the `cors` variant of `api-route` and the `compress-gzip` scenario: the gateway's
optional sections and nginx's equivalents do the same work (and nginx accepts its config), the
backend serves the JSON, the targets a scenario expands into.

    python3 -m unittest discover -s benches/harness -p 'test_*.py'
"""

from __future__ import annotations

import sys
import tempfile
import unittest
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402
from scenarios import API_CORS_PATH, BY_NAME, CORS_ORIGIN, GZIP_LEVEL, TEXT_FILE  # noqa: E402
from servers import CONFIGS, GATEWAY_SECTIONS, drop_sections  # noqa: E402
from test_peers import ConfigCase, PlanCase, self_signed, server  # noqa: E402


def block(text: str, opening: str) -> str:
    """The lines of an nginx block from its opening line to its closing brace."""
    start = text.index(opening)
    return text[start : text.index("\n        }", start)]


class NginxEquivalents(ConfigCase):
    def test_nginx_cors_route_is_the_api_route_with_the_cors_fields(self) -> None:
        self_signed(self.work)
        config = server("nginx", self.work).write_config()
        assert config is not None
        text = config.read_text()
        api, cors = block(text, "location /api {"), block(text, "location /api/cors {")
        for line in api.splitlines()[1:]:
            self.assertIn(line, cors)
        self.assertIn(f'"{CORS_ORIGIN}" $http_origin;', text)
        for line in (
            "add_header Access-Control-Allow-Origin $cors_origin always;",
            "add_header Access-Control-Allow-Credentials $cors_credentials always;",
            "add_header Access-Control-Expose-Headers $cors_expose always;",
            "add_header Vary Origin always;",
        ):
            self.assertIn(line, cors)
        self.nginx_accepts(config)

    def test_nginx_compresses_the_backends_json_at_the_gateways_level(self) -> None:
        self_signed(self.work)
        config = server("nginx", self.work).write_config()
        assert config is not None
        text = block(config.read_text(), "location /text/ {")
        for line in (
            "proxy_pass http://backend;",
            "gzip on;",
            f"gzip_comp_level {GZIP_LEVEL};",
            "gzip_types application/json;",
            "gzip_proxied any;",
        ):
            self.assertIn(line, text)
        backend = server("backend", self.work).write_config()
        assert backend is not None
        text = block(backend.read_text(), "location /text/ {")
        self.assertIn(f"root {self.work / 'root'};", text)
        self.nginx_accepts(backend)


class GatewaySections(unittest.TestCase):
    def routes(self, section: str, route: str) -> dict[str, dict]:
        text = (CONFIGS / "gateway.yaml").read_text()
        kept = drop_sections(text, set(GATEWAY_SECTIONS) - {section, "api-route"})
        self.assertNotIn(f"name: {route}\n", drop_sections(text, set(GATEWAY_SECTIONS)))
        try:
            import yaml
        except ImportError:
            self.skipTest("no PyYAML")
        filled = kept.replace("{{CORS_ORIGIN}}", CORS_ORIGIN).replace("{{", "").replace("}}", "")
        return {r["name"]: r for r in yaml.safe_load(filled)["routes"]}

    def test_the_cors_route_is_the_api_route_behind_a_cors_filter_before_it(self) -> None:
        routes = self.routes("api-cors", "api-cors")
        names = list(routes)
        self.assertLess(names.index("api-cors"), names.index("api"))
        cors, api = routes["api-cors"], routes["api"]
        self.assertEqual(cors["filters"][1:], api["filters"])
        self.assertEqual(cors["proxy"], api["proxy"])
        policy = cors["filters"][0]["cors"]
        self.assertEqual(policy["allow_origins"], [CORS_ORIGIN])
        self.assertTrue(policy["allow_credentials"])
        self.assertTrue(API_CORS_PATH.startswith(cors["match"]["path_prefix"]))

    def test_the_compress_route_gzips_the_backends_text(self) -> None:
        route = self.routes("compress", "text")["text"]
        self.assertEqual(route["filters"], [{"compress": {"algorithms": ["gzip"],
                                                          "level": {"gzip": "GZIP_LEVEL"}}}])
        self.assertEqual(route["proxy"], {"upstream": "backend"})


class Plan(PlanCase):
    def test_compress_runs_on_the_gateway_and_nginx_with_gzip_asked(self) -> None:
        labels, skipped = self.targets("compress-gzip", set(GATEWAY_SECTIONS))
        self.assertEqual(labels, [f"gateway text/{TEXT_FILE}", f"nginx text/{TEXT_FILE}"])
        self.assertEqual(skipped, [])
        self.assertEqual(BY_NAME["compress-gzip"].headers, ["Accept-Encoding: gzip"])
        # Compressed lengths differ between zlib builds: the probe checks no length.
        self.assertIsNone(BY_NAME["compress-gzip"].body_size)

    def test_api_route_requests_come_from_the_allowed_origin(self) -> None:
        self.assertIn(f"Origin: {CORS_ORIGIN}", BY_NAME["api-route"].headers)

    def test_a_gateway_without_the_cors_filter_says_why(self) -> None:
        labels, skipped = self.targets("api-route", set(GATEWAY_SECTIONS) - {"api-cors"})
        self.assertNotIn("gateway cors api/cors/hello", labels)
        self.assertEqual(skipped, ["api-route: gateway cors: unknown field `api`"])


class JsonText(unittest.TestCase):
    def test_the_json_is_sized_stable_and_compressible(self) -> None:
        data = bench.json_text(65536)
        self.assertEqual(len(data), 65536)
        self.assertEqual(data, bench.json_text(65536))
        ratio = len(zlib.compress(data, GZIP_LEVEL)) / len(data)
        self.assertTrue(0.1 < ratio < 0.5, ratio)

    def test_prepare_files_writes_it_under_text(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            work = Path(d) / "w"
            work.mkdir()
            bench.prepare_files(work)
            self.assertEqual((work / "root" / "text" / TEXT_FILE).read_bytes(),
                             bench.json_text(65536))


if __name__ == "__main__":
    unittest.main()
