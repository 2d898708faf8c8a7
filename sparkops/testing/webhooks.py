"""A loopback webhook receiver for tests and benchmarks.

It records every POST with its arrival time, verifies its Standard Webhooks signature with the
``standardwebhooks`` library (the specification's reference verifier, independent of the signing
code SparkOps ships) and answers from a script: a status sequence with extra headers, never
answering (``hang``), or holding every request until released. :meth:`WebhookReceiver.wait_for`
waits for the first request that matches a predicate, which is how a benchmark times a
delivery.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

# How long a ``hang`` reply keeps its connection open without answering, at most.
HANG_SECONDS = 10


@dataclass(frozen=True)
class Reply:
    """How the receiver answers one request: a status and headers, or nothing at all."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False


@dataclass(frozen=True)
class Received:
    """One request as it arrived: header names lower-cased, the raw body, and why its signature
    did not verify (None when it did)."""

    path: str
    headers: dict[str, str]
    body: bytes
    verify_error: str | None
    arrived: float = 0.0  # time.time() once the body had been read

    @property
    def verified(self) -> bool:
        return self.verify_error is None

    @cached_property
    def payload(self) -> dict[str, Any]:
        """The body parsed as a JSON object; ``{"unparsed": <first 200 bytes>}`` if it is not
        JSON, so a predicate can read it without catching errors."""
        try:
            parsed = json.loads(self.body or b"{}")
        except ValueError:
            return {"unparsed": self.body[:200].decode(errors="replace")}
        return parsed if isinstance(parsed, dict) else {"unparsed": parsed}


class WebhookReceiver:
    """Records POSTs on ``host``:<ephemeral port>; answers ``script`` in order, then 200.

    ``secret`` (settable after the channel exists) is used to verify each request as it
    arrives, exactly as a receiver would. :meth:`hold` makes it accept and sleep: every request
    from then on is read and never answered (its connection is closed at :meth:`release`);
    requests after ``release`` are answered again. ``answered`` lists the ``webhook-id`` of
    every request answered 2xx, in order.
    """

    def __init__(self, host: str = "127.0.0.1", script: Iterable[Reply] = ()) -> None:
        self.secret: str | None = None
        self.script: deque[Reply] = deque(script)
        self.requests: list[Received] = []
        self.answered: list[str] = []
        self._changed = threading.Condition()
        self._released = threading.Event()
        self._released.set()
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer((host, 0), self._handler_class())
        self._server.daemon_threads = True
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, path: str = "/hook") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def reply(self, *replies: Reply) -> None:
        self.script.extend(replies)

    def hold(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, match: Callable[[Received], bool], timeout: float) -> Received | None:
        """The first request (already received or arriving within ``timeout`` seconds) for
        which ``match`` is true; None if none came."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = next((r for r in self.requests if match(r)), None)
                remaining = deadline - time.monotonic()
                if found is not None or remaining <= 0:
                    return found
                self._changed.wait(min(remaining, 0.5))

    def _verify(self, body: bytes, headers: dict[str, str]) -> str | None:
        if self.secret is None:
            return "the receiver has no secret"
        try:
            Webhook(self.secret).verify(body, headers)
        except WebhookVerificationError as error:
            return str(error)
        return None

    def _record(self, path: str, headers: dict[str, str], body: bytes) -> None:
        arrived = time.time()
        received = Received(path, headers, body, self._verify(body, headers), arrived)
        with self._changed:
            self.requests.append(received)
            self._changed.notify_all()

    def _next_reply(self) -> Reply | None:
        """The reply for the request just recorded, or None if it must go unanswered (held
        until :meth:`release`, or a ``hang`` reply); either way it waits here first."""
        if not self._released.is_set():
            while not (self._released.wait(0.1) or self._stop.is_set()):
                pass
            return None
        reply = self.script.popleft() if self.script else Reply()
        if reply.hang:
            self._stop.wait(HANG_SECONDS)
            return None
        return reply

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server naming
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {name.lower(): value for name, value in self.headers.items()}
                receiver._record(self.path, headers, body)
                reply = receiver._next_reply()
                if reply is None:
                    self.close_connection = True
                    return
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                if 200 <= reply.status < 300:
                    receiver.answered.append(headers.get("webhook-id", ""))

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        return Handler
