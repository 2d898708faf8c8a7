"""Real loopback servers for delivery tests: every delivery goes over a real socket to a real
server on 127.0.0.1, and no test sends a packet off loopback or asks real DNS.

- :class:`ScriptedSMTPHandler` with :func:`smtp_server`: ``aiosmtpd`` answering RCPT and DATA
  from a script (e.g. ``451 4.3.0 try later`` once, then accept).
- :func:`silent_listener`: a bare listening socket that never accepts or writes (an SMTP tarpit,
  or a "forbidden" target whose pending connections the test can count).
- :func:`resolving`: a ``getaddrinfo`` that maps test host names to loopback addresses.

The webhook receiver is :class:`sparkops.testing.webhooks.WebhookReceiver` (shared with the
benchmarks).
"""

from __future__ import annotations

import email
import email.message
import email.policy
import errno
import socket
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from aiosmtpd.controller import Controller

from sparkops.testing.ports import free_port


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
    addresses and everything else as usual, so a test needs no real DNS and sends no packet
    off loopback."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if isinstance(host, str) and host in mapping:
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                     (mapping[host], int(port or 0)))]
        return real(host, port, *args, **kwargs)

    return getaddrinfo
