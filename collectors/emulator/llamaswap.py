"""The emulator speaking llama-swap, the model router: models started on demand as child
processes, stopped after their TTL. From github.com/mostlygeek/llama-swap at commit 0bdb3720.

    llama-swap -config FILE [-listen [HOST]:PORT]

``FILE`` is JSON (which is also YAML, the format llama-swap reads): ``{"models": {NAME: {"cmd":
"…", "proxy": "http://127.0.0.1:PORT", "ttl": SECONDS, "aliases": […], "unlisted": false}}}``;
macros such as ``${PORT}`` are not expanded here, so each model names its own port. What it
does, as the real one does:

* ``GET /running`` (internal/server/api.go ``handleRunning``): ``{"running": [{"model",
  "state", "cmd", "proxy", "ttl", "name", "description"}]}`` for each process not stopped;
* ``GET /v1/models`` (``handleListModels``): every model not ``unlisted``, ``status.value``
  loaded or unloaded, ``meta.llamaswap.type`` "model" (and its ``aliases``);
* ``/upstream/<model>/<path>`` and ``POST /v1/chat/completions`` / ``/v1/completions`` naming a
  model: the model is started if it is not running (its ``cmd`` split into words and run as a
  child process, ready once its ``proxy`` answers ``GET /health`` with 200), then the request is
  forwarded to its ``proxy``; each forwarded request counts as use when it completes
  (internal/process/process_command.go:762);
* a ready model with ``ttl`` > 0 and no request in flight is stopped (SIGTERM, then SIGKILL)
  once ``ttl`` seconds passed since its last use (process_command.go:306-322);
* ``GET /health``: ``OK``.

Standard library only.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PROG = "llama-swap"
DEFAULT_PORT = 8080
START_TIMEOUT = 120.0
STOP_GRACE = 5.0


@dataclass
class Model:
    """One configured model and its process."""

    name: str
    cmd: str
    proxy: str
    ttl: int = 0
    aliases: list[str] = field(default_factory=list)
    unlisted: bool = False
    state: str = "stopped"
    process: subprocess.Popen | None = None
    last_use: float = 0.0
    inflight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class Router:
    def __init__(self, models: dict[str, Model]) -> None:
        self.models = models
        self.aliases = {alias: m.name for m in models.values() for alias in m.aliases}
        self.stopping = threading.Event()

    def find(self, name: str) -> Model | None:
        return self.models.get(self.aliases.get(name, name))

    def ensure_ready(self, model: Model) -> None:
        """Start ``model`` unless it runs; wait until its proxy answers /health."""
        with model.lock:
            if model.state == "ready" and model.process and model.process.poll() is None:
                return
            model.state = "starting"
            sys.stderr.write(f"[INFO] <{model.name}> starting: {model.cmd}\n")
            model.process = subprocess.Popen(shlex.split(model.cmd))
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline:
                if model.process.poll() is not None:
                    model.state = "stopped"
                    raise RuntimeError(f"upstream command exited with {model.process.returncode}")
                try:
                    with urllib.request.urlopen(f"{model.proxy}/health", timeout=2) as reply:
                        if reply.status == 200:
                            model.state = "ready"
                            model.last_use = time.monotonic()
                            return
                except (OSError, urllib.error.URLError):
                    pass
                time.sleep(0.2)
            self._stop_locked(model)
            raise RuntimeError("upstream did not become ready")

    def stop(self, model: Model) -> None:
        with model.lock:
            self._stop_locked(model)

    def _stop_locked(self, model: Model) -> None:
        process = model.process
        if process is not None and process.poll() is None:
            model.state = "stopping"
            process.terminate()
            try:
                process.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        model.process, model.state = None, "stopped"

    def watch_ttls(self) -> None:
        """Stop each idle ready model once its TTL passed (checked every 0.25 s)."""
        while not self.stopping.wait(0.25):
            for model in self.models.values():
                if model.state == "ready" and model.process is not None \
                        and model.process.poll() is not None:
                    model.state, model.process = "stopped", None
                if model.state != "ready" or model.ttl <= 0 or model.inflight:
                    continue
                if time.monotonic() - model.last_use > model.ttl:
                    sys.stderr.write(f"[INFO] <{model.name}> Unloading model, TTL of "
                                     f"{model.ttl}s reached\n")
                    self.stop(model)

    def running(self) -> list[dict[str, Any]]:
        return [{"model": m.name, "state": m.state, "cmd": m.cmd, "proxy": m.proxy,
                 "ttl": m.ttl, "name": "", "description": ""}
                for m in sorted(self.models.values(), key=lambda m: m.name)
                if m.state != "stopped"]

    def listed(self) -> list[dict[str, Any]]:
        data = []
        for m in sorted(self.models.values(), key=lambda m: m.name):
            if m.unlisted:
                continue
            meta: dict[str, Any] = {"type": "model"}
            if m.aliases:
                meta["aliases"] = m.aliases
            data.append({"id": m.name, "object": "model", "created": int(time.time()),
                         "owned_by": "llama-swap",
                         "status": {"value": "loaded" if m.state != "stopped" else "unloaded"},
                         "meta": {"llamaswap": meta}})
        return data


def _handler(router: Router) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return None

        def _send(self, status: int, body: bytes, content_type: str = "application/json",
                  headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, data: Any) -> None:
            self._send(status, json.dumps(data).encode())

        def _body(self) -> bytes:
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def _route(self, method: str) -> None:
            path = self.path
            body = self._body() if method == "POST" else b""
            if method == "GET" and path == "/health":
                return self._send(200, b"OK", "text/plain")
            if method == "GET" and path == "/running":
                return self._json(200, {"running": router.running()})
            if method == "GET" and path in ("/v1/models", "/models"):
                return self._json(200, {"object": "list", "data": router.listed()})
            if path.startswith("/upstream/"):
                name, _, rest = path[len("/upstream/"):].partition("/")
                model = router.find(urllib.request.unquote(name))
                if model is None:
                    return self._send(404, b"model not found", "text/plain")
                return self._forward(model, method, "/" + rest, body)
            if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
                try:
                    name = json.loads(body or b"{}").get("model")
                except ValueError:
                    name = None
                model = router.find(name) if isinstance(name, str) else None
                if model is None:
                    return self._send(400, b"could not find suitable inference handler",
                                      "text/plain")
                return self._forward(model, method, path, body)
            return self._send(404, b"not found", "text/plain")

        def _forward(self, model: Model, method: str, path: str, body: bytes) -> None:
            try:
                router.ensure_ready(model)
            except RuntimeError as error:
                return self._send(502, f"unable to start process: {error}".encode(),
                                  "text/plain")
            model.inflight += 1
            try:
                request = urllib.request.Request(f"{model.proxy}{path}", method=method,
                                                 data=body if method == "POST" else None,
                                                 headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=300) as reply:
                        status, data, headers = reply.status, reply.read(), reply.headers
                except urllib.error.HTTPError as error:
                    status, data, headers = error.code, error.read(), error.headers
                except OSError as error:
                    return self._send(502, f"upstream: {error}".encode(), "text/plain")
                passed = {key: value for key, value in headers.items()
                          if key.lower() == "process-start-time-unix"}
                self._send(status, data, headers.get("Content-Type") or "text/plain", passed)
            finally:
                model.inflight -= 1
                model.last_use = time.monotonic()

    return Handler


def parse_args(argv: list[str]) -> tuple[str, str, int]:
    """``-config FILE`` and ``-listen [HOST]:PORT`` (Go's flag syntax: one or two dashes)."""
    values: dict[str, str] = {}
    index = 0
    while index < len(argv):
        name, has_inline, inline = argv[index].lstrip("-").partition("=")
        if name in ("config", "listen"):
            if has_inline:
                values[name] = inline
            elif index + 1 < len(argv):
                values[name] = argv[index + 1]
                index += 1
        index += 1
    if "config" not in values:
        raise SystemExit(f"{PROG}: -config FILE is required")
    host, _, port = values.get("listen", f":{DEFAULT_PORT}").rpartition(":")
    return values["config"], host or "0.0.0.0", int(port)


def load_models(path: str) -> dict[str, Model]:
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    models = {}
    for name, spec in (data.get("models") or {}).items():
        models[name] = Model(name=name, cmd=spec["cmd"], proxy=spec["proxy"].rstrip("/"),
                             ttl=int(spec.get("ttl", data.get("globalTTL", 0))),
                             aliases=list(spec.get("aliases") or []),
                             unlisted=bool(spec.get("unlisted")))
    return models


def main(argv: list[str]) -> int:
    config, host, port = parse_args(argv)
    router = Router(load_models(config))
    server = ThreadingHTTPServer((host, port), _handler(router))
    server.daemon_threads = True

    def shut_down(*_: Any) -> None:
        router.stopping.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shut_down)
    signal.signal(signal.SIGINT, shut_down)
    threading.Thread(target=router.watch_ttls, daemon=True).start()
    sys.stderr.write(f"[INFO] llama-swap listening on {host}:{port}\n")
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        for model in router.models.values():
            router.stop(model)
        server.server_close()
    return 0
