"""Loopback ports and polling for servers started by tests and benchmarks."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def free_port() -> int:
    """A loopback TCP port that was just bound and closed: nobody listens on it now, so a server
    may take it (or a client connecting to it is refused). Another process may take it first;
    callers start their server right away."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    """Return once something accepts connections on 127.0.0.1:``port``; TimeoutError after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout} s")


def wait_for(condition: Callable[[], object], timeout: float, what: str,
             period: float = 0.1) -> None:
    """Poll ``condition()`` every ``period`` seconds until it is truthy; TimeoutError naming
    ``what`` if it is still false after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.0f} s")
        time.sleep(period)
