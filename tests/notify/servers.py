"""Real loopback servers for delivery tests (RELIABILITY.md recipes H1, H2, H11).

- :class:`WebhookReceiver`: a threading HTTP server that records every request, verifies its
  Standard Webhooks signature with the ``standardwebhooks`` library and answers from a script
  (status sequence, extra headers, or never answering).
- :class:`ScriptedSMTPHandler` with :func:`smtp_server`: ``aiosmtpd`` answering RCPT and DATA
  from a script (e.g. ``451 4.3.0 try later`` once, then accept).
- :func:`silent_listener`: a bare listening socket that never accepts or writes (an SMTP tarpit,
  or a "forbidden" target whose pending connections the test can count).
"""

from __future__ import annotations

import email
import email.message
import email.policy
import errno
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from aiosmtpd.controller import Controller
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.conftest import free_port


@dataclass(frozen=True)
class Reply:
    """How the receiver answers one request: a status and headers, or nothing at all."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    verify_error: str | None

    @property
    def verified(self) -> bool:
        return self.verify_error is None


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

    def _verify(self, body: bytes, headers: dict[str, str]) -> str | None:
        if self.secret is None:
            return "the receiver has no secret"
        try:
            Webhook(self.secret).verify(body, headers)
        except WebhookVerificationError as error:
            return str(error)
        return None

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server naming
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {name.lower(): value for name, value in self.headers.items()}
                receiver.requests.append(
                    Received(self.path, headers, body, receiver._verify(body, headers)))
                if not receiver._released.is_set():
                    while not (receiver._released.wait(0.1) or receiver._stop.is_set()):
                        pass
                    self.close_connection = True
                    return
                reply = receiver.script.popleft() if receiver.script else Reply()
                if reply.hang:
                    receiver._stop.wait(10)
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


class ScriptedSMTPHandler:
    """An aiosmtpd handler: RCPT and DATA answer from their scripts, then accept."""

    def __init__(self, rcpt: Iterable[str] = (), data: Iterable[str] = ()) -> None:
        self.rcpt_script: deque[str] = deque(rcpt)
        self.data_script: deque[str] = deque(data)
        self.messages: list[email.message.Message] = []

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,  # noqa: N802
                          rcpt_options: list[str]) -> str:
        if self.rcpt_script:
            return self.rcpt_script.popleft()
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        if self.data_script:
            return self.data_script.popleft()
        self.messages.append(
            email.message_from_bytes(envelope.content, policy=email.policy.default))
        return "250 Message accepted for delivery"


@contextmanager
def smtp_server(handler: ScriptedSMTPHandler) -> Iterator[int]:
    """A real SMTP server on 127.0.0.1; yields its port. ``port=0`` fails aiosmtpd 1.4's
    self-check, so a free port is picked first."""
    controller = Controller(handler, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        yield controller.port
    finally:
        controller.stop()


@contextmanager
def silent_listener(host: str = "127.0.0.1") -> Iterator[tuple[int, Any]]:
    """A socket that listens and never accepts; yields (port, pending) where ``pending()``
    counts the connections the kernel completed for it so far."""
    sock = socket.create_server((host, 0), backlog=16)
    sock.setblocking(False)

    def pending() -> int:
        count = 0
        while True:
            try:
                conn, _peer = sock.accept()
            except OSError as error:
                if error.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return count
                raise
            conn.close()
            count += 1

    try:
        yield sock.getsockname()[1], pending
    finally:
        sock.close()


def resolving(mapping: dict[str, str]) -> Callable[..., list[Any]]:
    """A ``socket.getaddrinfo`` that resolves the names in ``mapping`` to the given loopback
    addresses and everything else as usual (recipe H11: no real DNS, no packets off loopback)."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if isinstance(host, str) and host in mapping:
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                     (mapping[host], int(port or 0)))]
        return real(host, port, *args, **kwargs)

    return getaddrinfo
