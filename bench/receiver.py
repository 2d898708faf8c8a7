"""A loopback webhook receiver that records when each POST arrived.

SparkOps and both Alertmanagers post here, each to a path of its own. A benchmark waits for the
first delivery that matches a predicate and reads its arrival time (wall clock, the same clock
the allocation is timed with).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Delivery:
    path: str
    arrived: float  # time.time() when the body had been read
    body: dict[str, Any]


class WebhookReceiver:
    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self._changed = threading.Condition()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, match: Callable[[Delivery], bool], timeout: float) -> Delivery | None:
        """The first delivery (already received or arriving within ``timeout``) that matches."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = next((d for d in self.deliveries if match(d)), None)
                remaining = deadline - time.monotonic()
                if found is not None or remaining <= 0:
                    return found
                self._changed.wait(min(remaining, 0.5))

    def _record(self, path: str, raw: bytes) -> None:
        arrived = time.time()
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"unparsed": raw[:200].decode(errors="replace")}
        with self._changed:
            self.deliveries.append(Delivery(path, arrived, body))
            self._changed.notify_all()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server naming
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver._record(self.path, raw)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        return Handler
