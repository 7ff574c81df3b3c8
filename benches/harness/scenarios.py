"""The scenarios of the side-by-side benchmark: what is requested, from which servers, with which
load generator, at which concurrencies.

A scenario expands into cells (one per concurrency); a cell's targets (a server, or a variant of
the gateway such as "wasm" vs "native") are measured in interleaved rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from email.utils import formatdate

# A realistic query for the WAF scenario: a search with parameters and a browser's headers, so the
# detectors have something to look at (and nothing that should match).
WAF_PATH = "/search?q=running+shoes&size=42&sort=price&page=2"
BROWSER_HEADERS = [
    "User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
    "Accept-Language: en-GB,en;q=0.5",
    "Cookie: session=3f2a9c0d7b1e4a6f; theme=dark",
]

# The route an API gateway runs: a local rate limit keyed by client IP that refuses nothing, then
# the proxy with header edits both ways (set `X-Api-Version` and remove the client's `X-Debug`
# on the way up; add `X-Content-Type-Options` and hide the backend's `X-Powered-By` on the way
# down). Measured beside the same proxy route bare, on every server that has both. The `cors`
# variant is the API route behind a CORS policy that allows the requests' origin (the answer
# gets `Access-Control-Allow-Origin`, `-Allow-Credentials`, `-Expose-Headers` and `Vary`).
API_PATH = "/api/hello"
API_CORS_PATH = "/api/cors/hello"
# The API route with a `rewrite` filter added (the path's prefix replaced), on the gateway only.
API_REWRITE_PATH = "/api-rewrite/hello"
CORS_ORIGIN = "https://app.example.com"

# A compressible answer (JSON text) the backend serves from the document root, proxied and
# gzip-compressed on the way at the same level by the gateway and by nginx (`gzip on`); the
# report compares the uncompressed bytes each serves per second per fully-used core.
TEXT_FILE = "64k.json"
TEXT_SIZE = 65536
GZIP_LEVEL = 5

# The `jwt` variant: the bare proxy route behind a `jwt` filter (RS256, the key cached), sent one
# valid token made when the harness starts (`jwt_fixture`). Every target of the scenario gets the
# same request, token included; nginx's open-source build has no JWT, so the comparison is the
# gateway's own bare route.
JWT_PATH = "/jwt/hello"
JWT_PLACEHOLDER = "{{JWT}}"
API_HEADERS = ["X-Debug: 1", f"Origin: {CORS_ORIGIN}", f"Authorization: Bearer {JWT_PLACEHOLDER}"]


def with_token(headers: list[str], token: str) -> list[str]:
    """`headers` with the harness's token in place of its placeholder; without a token, the
    header that would carry it is left out."""
    if not token:
        return [h for h in headers if JWT_PLACEHOLDER not in h]
    return [h.replace(JWT_PLACEHOLDER, token) for h in headers]


# The static files' modification time, set when they are written, so that a revalidation's date
# is known in advance: nginx answers `If-Modified-Since` with a 304 only for the exact date (its
# default `if_modified_since exact`). 2023-11-14T22:13:20Z.
FILES_MTIME = 1_700_000_000

# The static files of the document root and their sizes.
STATIC_FILES = {"1k.bin": 1024, "10k.bin": 10240, "100k.bin": 102400, "1m.bin": 1048576}


@dataclass
class Variant:
    """Another path (and capability) on each server of a scenario: a feature on vs off on the
    gateway, or a route beside its bare baseline on every server that has both."""

    label: str
    path: str
    needs: str


@dataclass
class Scenario:
    name: str
    title: str
    tool: str  # wrk | h2load | h3load
    port: str  # http | tls | l4 | h3 | general (which port of each server)
    path: str
    needs: str  # a capability from servers.CAPABILITIES (or an optional gateway section)
    conns: list[int]
    quick_conns: list[int]
    close: bool = False
    streams: int = 1  # concurrent streams per connection (HTTP/2 and HTTP/3)
    headers: list[str] = field(default_factory=list)
    variants: list[Variant] = field(default_factory=list)
    body_size: int | None = None  # expected body length, checked before the run
    status: int = 200  # expected status, checked before the run (206 for a range)
    peers: list[str] | None = None  # restricts the kinds of server (None: all that can)
    # Seconds per run at least: opening 10,000 connections takes seconds of the window itself.
    min_duration: int = 0


SCENARIOS = [
    Scenario("hello", "Synthetic hello, keep-alive", "wrk", "http", "/hello", "hello",
             [10, 200, 1000], [200], body_size=14),
    Scenario("hello-close", "Synthetic hello, new connection per request", "wrk", "http",
             "/hello", "hello", [10, 200], [200], close=True, body_size=14),
    Scenario("static-1k", "Static file 1 KiB, keep-alive", "wrk", "http", "/static/1k.bin",
             "static-small", [10, 200, 1000], [200], body_size=1024),
    Scenario("static-1k-close", "Static file 1 KiB, new connection per request", "wrk", "http",
             "/static/1k.bin", "static-small", [200], [200], close=True, body_size=1024),
    Scenario("static-304", "Revalidation of a 1 KiB file (If-Modified-Since its date: a 304), "
             "keep-alive", "wrk", "http", "/static/1k.bin", "static-small", [200], [200],
             headers=[f"If-Modified-Since: {formatdate(FILES_MTIME, usegmt=True)}"],
             body_size=0, status=304, peers=["gateway", "nginx", "caddy", "h2o"]),
    Scenario("static-10k", "Static file 10 KiB, keep-alive", "wrk", "http", "/static/10k.bin",
             "static-small", [200], [200], body_size=10240),
    Scenario("static-100k", "Static file 100 KiB, keep-alive", "wrk", "http",
             "/static/100k.bin", "static", [200], [200], body_size=102400),
    Scenario("static-1m", "Static file 1 MiB, keep-alive", "wrk", "http", "/static/1m.bin",
             "static", [50], [50], body_size=1048576),
    Scenario("static-1m-disk", "Static file 1 MiB too large for the cache, from disk, keep-alive",
             "wrk", "http", "/disk/1m.bin", "static", [50], [50], body_size=1048576,
             peers=["gateway", "nginx"]),
    Scenario("static-range", "64 KiB range of a 1 MiB file from disk, keep-alive", "wrk", "http",
             "/disk/1m.bin", "static", [200], [200], headers=["Range: bytes=0-65535"],
             body_size=65536, status=206, peers=["gateway", "nginx"]),
    Scenario("tls-range", "TLS HTTP/1.1, 64 KiB range of a 1 MiB file from disk, keep-alive",
             "wrk", "tls", "/disk/1m.bin", "tls", [50], [50], headers=["Range: bytes=0-65535"],
             body_size=65536, status=206, peers=["gateway", "nginx"]),
    Scenario("proxy", "Reverse proxy to the shared backend, keep-alive", "wrk", "http",
             "/proxy/hello", "proxy", [10, 200, 1000], [200], body_size=14),
    Scenario("proxy-close", "Reverse proxy, new client connection per request", "wrk", "http",
             "/proxy/hello", "proxy", [200], [200], close=True, body_size=14),
    # The proxy route with every request traced: a server and a client span per request,
    # exported in batches over OTLP/HTTP to the backend. Tracing is process-wide, so the gateway
    # runs a config of its own for it (the opt-in `traced` section); instructions.py counts it.
    Scenario("traced", "Reverse proxy, every request traced and exported over OTLP, keep-alive",
             "wrk", "http", "/proxy/hello", "traced", [200], [200], body_size=14,
             peers=["gateway"]),
    Scenario("api-route", "API route (rate limit, header edits both ways, proxy) beside the bare "
             "proxy route, keep-alive", "wrk", "http", "", "proxy", [50, 200], [200],
             headers=API_HEADERS, body_size=14, peers=["gateway", "nginx", "pingora"],
             variants=[Variant("bare", "/proxy/hello", "proxy"),
                       Variant("api", API_PATH, "api-route"),
                       Variant("cors", API_CORS_PATH, "api-cors"),
                       Variant("rewrite", API_REWRITE_PATH, "rewrite"),
                       Variant("jwt", JWT_PATH, "jwt")]),
    Scenario("compress-gzip", f"Proxied {TEXT_SIZE // 1024} KiB JSON gzip-compressed on the way "
             f"(level {GZIP_LEVEL}), keep-alive", "wrk", "http", f"/text/{TEXT_FILE}", "compress",
             [50], [50], headers=["Accept-Encoding: gzip"], peers=["gateway", "nginx"]),
    # A shared cache in front of the backend, every request a hit once the first stored the
    # object: the gateway's `cache` filter (memory) against nginx's `proxy_cache` (its files,
    # read through the page cache). The backend marks the file cacheable (`max-age`).
    Scenario("cache-hit", "Cached 1 KiB answer of the backend (a hit every request), keep-alive",
             "wrk", "http", "/cached/1k.bin", "cache", [50, 200], [200], body_size=1024,
             peers=["gateway", "nginx"]),
    Scenario("cache-hit-100k", "Cached 100 KiB answer of the backend (a hit every request), "
             "keep-alive", "wrk", "http", "/cached/100k.bin", "cache", [50], [50],
             body_size=102400, peers=["gateway", "nginx"]),
    # A redirect made from the request (the path's prefix replaced, host and query kept): what
    # a `redirect` route costs beside `hello`'s fixed answer.
    Scenario("redirect", "Redirect (301, Location from the request's host and path), keep-alive",
             "wrk", "http", "/old/hello", "redirect", [200], [200], status=301,
             peers=["gateway", "nginx"]),
    Scenario("tls-h1-1k", "TLS HTTP/1.1, static 1 KiB, keep-alive", "wrk", "tls",
             "/static/1k.bin", "tls", [10, 200], [200], body_size=1024),
    Scenario("tls-h2-1k", "TLS HTTP/2, static 1 KiB, 10 streams per connection", "h2load",
             "tls", "/static/1k.bin", "h2", [10, 200, 1000], [200], streams=10),
    Scenario("h3-1k", "HTTP/3, static 1 KiB, 10 streams per connection", "h3load", "h3",
             "/static/1k.bin", "h3", [10, 200], [200], streams=10),
    Scenario("h3-1m", "HTTP/3, static 1 MiB, 1 stream per connection", "h3load", "h3",
             "/static/1m.bin", "h3", [10, 50], [50], streams=1),
    Scenario("stress-10k", "10,000 keep-alive connections, synthetic hello", "wrk", "http",
             "/hello", "hello", [10000], [10000], body_size=14, min_duration=10),
    Scenario("l4-tcp", "L4 TCP proxy (HTTP through it to the backend), keep-alive", "wrk", "l4",
             "/hello", "l4", [10, 200, 1000], [200], body_size=14),
    Scenario("l4-tcp-close", "L4 TCP proxy, new connection (and upstream connection) per request",
             "wrk", "l4", "/hello", "l4", [200], [200], close=True, body_size=14),
    Scenario("wasm", "Wasm add-header plugin vs the native headers filter, on respond", "wrk",
             "general", "", "native", [200], [200], peers=["gateway"],
             variants=[Variant("native", "/native", "native"), Variant("wasm", "/wasm", "wasm")]),
    Scenario("wasm-proxy", "Wasm add-header plugin vs the native headers filter, on a proxied route",
             "wrk", "general", "", "native", [200], [200], peers=["gateway"],
             variants=[Variant("native", "/native-proxy", "native"),
                       Variant("wasm", "/wasm-proxy", "wasm")]),
    Scenario("waf", "WAF (every built-in detector, 50 custom rules) on vs off, on respond", "wrk",
             "general", "", "native", [200], [200], headers=BROWSER_HEADERS, peers=["gateway"],
             variants=[Variant("waf off", "/nowaf" + WAF_PATH, "native"),
                       Variant("waf on", "/waf" + WAF_PATH, "waf")]),
    Scenario("rate-limit", "Rate limit (by client IP, nothing refused) on vs off, on respond",
             "wrk", "general", "", "native", [200], [200], peers=["gateway"],
             variants=[Variant("rate limit off", "/nolimit", "native"),
                       Variant("rate limit on", "/limited", "rate-limit")]),
    # The same pair where plain GETs go: a local rate limit runs on the HTTP/1.1 fast path.
    Scenario("rate-limit-fast",
             "Rate limit (by client IP, nothing refused) on vs off, on respond, HTTP/1.1 fast path",
             "wrk", "http", "", "native", [200], [200], peers=["gateway"],
             variants=[Variant("rate limit off", "/nolimit", "native"),
                       Variant("rate limit on", "/limited", "rate-limit")]),
]  # fmt: skip

BY_NAME = {s.name: s for s in SCENARIOS}
