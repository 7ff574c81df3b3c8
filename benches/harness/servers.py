"""The servers the harness starts: the shared backend, the peers (nginx, HAProxy, Caddy, h2o,
and Pingora as a small program of benches/pingora-proxy), the gateway (one or two builds) and
the bare hyper floor. Each gets its config from benches/harness/configs/ with the
placeholders filled in, its own ports, and a CPU: the server under test on the server CPU, the
backend on the load CPU.

Ports of an instance, from its base: HTTP (base), HTTPS (base + 1), L4 TCP (base + 2), HTTP/3
(base + 3, UDP; Caddy serves HTTP/3 on its HTTPS port instead), and for the gateway a second
HTTP listener without the HTTP/1.1 fast path (base + 4), where the filter comparisons run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path

import procstat
from scenarios import CORS_ORIGIN, FILES_MTIME, GZIP_LEVEL, STATIC_FILES

HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "configs"

# What each kind of server can serve; a scenario runs on the servers that have what it needs.
CAPABILITIES = {
    "hyper": {"hello"},
    "gateway": {"hello", "static", "static-small", "proxy", "tls", "h2", "l4", "native"},
    "nginx": {"hello", "static", "static-small", "proxy", "api-route", "api-cors", "compress",
              "redirect", "cache", "tls", "h2", "l4"},
    "haproxy": {"hello", "static-small", "proxy", "tls", "h2", "l4"},
    "caddy": {"hello", "static", "static-small", "proxy", "tls", "h2", "h3"},
    # A file server with a strong TLS stack; `hello` from its mruby handler.
    "h2o": {"hello", "static", "static-small", "tls", "h2"},
    # A proxy framework: the peer program serves the proxy routes only, over plain HTTP/1.1.
    "pingora": {"proxy", "api-route"},
}

# The signal that stops a kind at once (others: SIGTERM). Pingora takes SIGTERM for a graceful
# shutdown that lasts minutes, its listener (SO_REUSEPORT) still answering beside the next one.
STOP_SIGNALS = {"pingora": signal.SIGINT}

# Optional sections of configs/gateway.yaml and the capability each one brings.
GATEWAY_SECTIONS = {
    "h3": "h3",
    "wasm": "wasm",
    "waf": "waf",
    "rate-limit": "rate-limit",
    "api-route": "api-route",
    "api-cors": "api-cors",
    "compress": "compress",
    "jwt": "jwt",
    "rewrite": "rewrite",
    "redirect": "redirect",
    "cache": "cache",
    "general": "general",
    "traced": "traced",
}

# Optional sections that change every route rather than add one (tracing every request): kept
# only in an instance started for a scenario that needs them (`Server.opt_in`), so that the
# other scenarios are measured without them.
OPT_IN_SECTIONS = {"traced"}


@dataclass
class Env:
    """Paths and CPUs shared by every server of a run."""

    work: Path
    root: Path
    cert: Path
    key: Path
    pem: Path
    plugin: Path | None
    backend_port: int
    server_cpu: str
    backend_cpu: str
    # The key set of the `jwt` section (written by `jwt_fixture`), when there is one.
    jwks: Path | None = None


def fill(template: str, values: dict[str, str]) -> str:
    """Replaces every `{{NAME}}`; an unknown placeholder is an error (a typo in a config)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in values:
            raise KeyError(f"no value for placeholder {{{{{m.group(1)}}}}}")
        return values[m.group(1)]

    return re.sub(r"\{\{([A-Z0-9_]+)\}\}", sub, template)


def drop_sections(text: str, names: set[str]) -> str:
    """Removes the lines between `# >>> NAME` and `# <<< NAME` for each name in `names`."""
    out, skipping = [], None
    for line in text.splitlines(keepends=True):
        if m := re.match(r"# >>> (\S+)", line):
            skipping = m.group(1) if m.group(1) in names else None
            continue
        if m := re.match(r"# <<< (\S+)", line):
            skipping = None
            continue
        if skipping is None:
            out.append(line)
    return "".join(out)


def port_free(port: int, udp: bool = False) -> bool:
    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, kind) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def udp_bound(port: int) -> bool:
    """Whether some process has a UDP socket on 127.0.0.1:port (or any address)."""
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        local = line.split()[1]
        if int(local.split(":")[1], 16) == port:
            return True
    return False


def wait_tcp(port: int, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode} during start-up")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"not listening on port {port} after {timeout:.0f}s")


@dataclass
class Server:
    """One running server instance."""

    name: str
    kind: str
    base: int
    env: Env
    binary: Path | None = None
    capabilities: set[str] = field(default_factory=set)
    skipped_sections: dict[str, str] = field(default_factory=dict)
    # The sections of OPT_IN_SECTIONS this instance keeps.
    opt_in: set[str] = field(default_factory=set)
    proc: subprocess.Popen[bytes] | None = None
    idle_rss_kib: int = 0

    def __post_init__(self) -> None:
        self.capabilities = set(CAPABILITIES.get(self.kind, set()))

    @property
    def ports(self) -> dict[str, int]:
        b = self.base
        h3 = b + 1 if self.kind == "caddy" else b + 3
        return {"http": b, "tls": b + 1, "l4": b + 2, "h3": h3, "general": b + 4}

    def url(self, scheme_port: str, path: str) -> str:
        # A gateway without the fast path's setting (an older build compared) serves the
        # general path on its one HTTP port.
        if scheme_port == "general" and "general" not in self.capabilities:
            scheme_port = "http"
        scheme = "http" if scheme_port in ("http", "l4", "general") else "https"
        return f"{scheme}://127.0.0.1:{self.ports[scheme_port]}{path}"

    @property
    def log(self) -> Path:
        return self.env.work / f"{self.name}.log"

    def values(self) -> dict[str, str]:
        e = self.env
        return {
            "WORK": str(e.work),
            "ROOT": str(e.root),
            "CERT": str(e.cert),
            "KEY": str(e.key),
            "PEM": str(e.pem),
            "PLUGIN": str(e.plugin or ""),
            "JWKS": str(e.jwks or ""),
            "BACKEND": str(e.backend_port),
            "HTTP": str(self.ports["http"]),
            "TLS": str(self.ports["tls"]),
            "L4": str(self.ports["l4"]),
            "H3": str(self.ports["h3"]),
            "GENERAL": str(self.ports["general"]),
            "CORS_ORIGIN": CORS_ORIGIN,
            "GZIP_LEVEL": str(GZIP_LEVEL),
            # For a server that does not derive a file's validators itself (HAProxy): the
            # values nginx sends for the harness's files (ETag: mtime and size in hex).
            "LAST_MODIFIED": formatdate(FILES_MTIME, usegmt=True),
            "ETAG_1K": f'"{FILES_MTIME:x}-{STATIC_FILES["1k.bin"]:x}"',
            "ETAG_10K": f'"{FILES_MTIME:x}-{STATIC_FILES["10k.bin"]:x}"',
        }

    # === configuration ===

    def write_config(self) -> Path | None:
        """Writes this instance's config into the work dir; None for servers without one."""
        templates = {
            "backend": "backend-nginx.conf",
            "nginx": "nginx.conf",
            "haproxy": "haproxy.cfg",
            "caddy": "Caddyfile",
            "h2o": "h2o.conf",
        }
        if self.kind == "gateway":
            return self._gateway_config()
        if self.kind not in templates:
            return None
        text = fill((CONFIGS / templates[self.kind]).read_text(), self.values())
        path = self.env.work / f"{self.name}-{templates[self.kind]}"
        path.write_text(text)
        return path

    def _gateway_config(self) -> Path:
        """The gateway config with every optional section the binary accepts. Sections are
        tried one by one on top of the base (all optional sections dropped); a section whose
        config `gateway validate` rejects is dropped and remembered with the error."""
        template = fill((CONFIGS / "gateway.yaml").read_text(), self.values())
        path = self.env.work / f"{self.name}-gateway.yaml"
        wanted = set(GATEWAY_SECTIONS) - (OPT_IN_SECTIONS - self.opt_in)
        for name in sorted(OPT_IN_SECTIONS - self.opt_in):
            self.skipped_sections[name] = "changes every route: on only for its own scenario"
        if self.env.plugin is None:
            self.skipped_sections["wasm"] = "no add-header.wasm was built"
            wanted.discard("wasm")
        if self.env.jwks is None:
            self.skipped_sections["jwt"] = "no jwt_fixture was built"
            wanted.discard("jwt")
        ok, err = self._validate(drop_sections(template, set(GATEWAY_SECTIONS) - wanted), path)
        if not ok:
            base_ok, base_err = self._validate(drop_sections(template, set(GATEWAY_SECTIONS)), path)
            if not base_ok:
                raise RuntimeError(f"the base gateway config is rejected: {base_err}")
            keep: set[str] = set()
            for name in sorted(wanted):
                trial = drop_sections(template, set(GATEWAY_SECTIONS) - {name})
                ok, err = self._validate(trial, path)
                if ok:
                    keep.add(name)
                else:
                    self.skipped_sections[name] = err
            wanted = keep
        path.write_text(drop_sections(template, set(GATEWAY_SECTIONS) - wanted))
        self.capabilities |= {GATEWAY_SECTIONS[n] for n in wanted}
        return path

    def _validate(self, text: str, path: Path) -> tuple[bool, str]:
        path.write_text(text)
        proc = subprocess.run(
            [str(self.binary), "validate", "--config", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        # The message names the scratch file; keep only its name (it ends up in the results).
        msg = (proc.stderr or proc.stdout).strip().replace(f"{path.parent}/", "")
        return proc.returncode == 0, msg

    # === process ===

    def command(self, config: Path | None) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ)
        cpu = self.env.backend_cpu if self.kind == "backend" else self.env.server_cpu
        pin = ["taskset", "-c", cpu]
        if self.kind in ("backend", "nginx"):
            prefix = self.env.work / f"{self.name}-prefix"
            prefix.mkdir(exist_ok=True)
            err = str(self.env.work / f"{self.name}-error.log")
            return pin + ["nginx", "-p", str(prefix), "-e", err, "-c", str(config)], env
        if self.kind == "haproxy":
            return pin + ["haproxy", "-db", "-f", str(config)], env
        if self.kind == "caddy":
            home = self.env.work / "caddy-home"
            home.mkdir(exist_ok=True)
            env |= {
                "GOMAXPROCS": "1",
                "HOME": str(home),
                "XDG_DATA_HOME": str(home / "data"),
                "XDG_CONFIG_HOME": str(home / "config"),
            }
            cmd = ["caddy", "run", "--config", str(config), "--adapter", "caddyfile"]
            return pin + cmd, env
        if self.kind == "h2o":
            return pin + ["h2o", "--conf", str(config)], env
        if self.kind == "pingora":
            listen = f"127.0.0.1:{self.ports['http']}"
            backend = f"127.0.0.1:{self.env.backend_port}"
            return pin + [str(self.binary), listen, backend], env
        if self.kind == "gateway":
            env["RUST_LOG"] = "warn"
            return pin + [str(self.binary), "run", "--config", str(config)], env
        if self.kind == "hyper":
            return pin + [str(self.binary), f"127.0.0.1:{self.ports['http']}"], env
        raise ValueError(self.kind)

    def base_idle_rss(self) -> int:
        """The gateway's idle RSS with its base config (no optional section: no plugin, no WAF,
        no HTTP/3), the fair figure for the idle-memory target: started, left 2 s, stopped."""
        template = fill((CONFIGS / "gateway.yaml").read_text(), self.values())
        path = self.env.work / f"{self.name}-base-gateway.yaml"
        path.write_text(drop_sections(template, set(GATEWAY_SECTIONS)))
        self._launch(path)
        time.sleep(2)
        rss = procstat.rss_kib(self.pids())
        self.stop()
        return rss

    def start(self) -> None:
        self._launch(self.write_config())

    def start_with(self, config: Path) -> None:
        """Starts this instance with a config written by the caller (conns.py's variants of
        the templates) instead of `write_config`'s."""
        self._launch(config)

    def _launch(self, config: Path | None) -> None:
        cmd, env = self.command(config)
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.env.work
            )
        port = self.env.backend_port if self.kind == "backend" else self.ports["http"]
        try:
            wait_tcp(port, self.proc)
        except RuntimeError as e:
            tail = self.log.read_text(errors="replace")[-1500:]
            self.stop()
            raise RuntimeError(f"{self.name}: {e}\n{tail}") from None
        if "h3" in self.capabilities:
            # The config may accept http3 while the build does not serve it yet.
            time.sleep(0.3)
            if not udp_bound(self.ports["h3"]):
                self.capabilities.discard("h3")
                self.skipped_sections["h3"] = f"nothing listens on UDP port {self.ports['h3']}"

    def pids(self) -> list[int]:
        if self.proc is None or self.proc.poll() is not None:
            return []
        return procstat.process_tree(self.proc.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM (or the kind's `STOP_SIGNALS`) to the process this harness started (nginx's
        master takes its workers down), then SIGKILL to whatever of its tree is left after 5 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        tree = [(pid, procstat.start_time(pid)) for pid in self.pids()[1:]]
        self.proc.send_signal(STOP_SIGNALS.get(self.kind, signal.SIGTERM))
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid, started in tree:
            # Only the same process (a recycled pid has another start time).
            if started is not None and procstat.start_time(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def have(tool: str) -> bool:
    return shutil.which(tool) is not None
