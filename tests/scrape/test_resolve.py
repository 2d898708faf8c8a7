"""The one resolver on a thread (``sparkops.httpfetch.resolve``), as fetch and the webhook
address check meet it: a hanging resolver is bounded, a failing one is named."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dashboard.notify import addresses
from sparkops.httpfetch import FetchError, fetch, resolve


@pytest.fixture
def hanging_resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """A ``getaddrinfo`` that blocks until the test ends (then fails), like a dead DNS server."""
    release = threading.Event()

    def getaddrinfo(*args: Any, **kwargs: Any) -> list[Any]:
        release.wait(10)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield release
    release.set()


def test_a_hanging_resolver_is_abandoned_at_the_deadline(
        hanging_resolver: threading.Event, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(addresses, "_RESOLVE_TIMEOUT", 0.2)  # 3 s in production
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="resolving slow.test took longer than 0.2 s"):
        resolve("slow.test", 80, 0.2)
    with pytest.raises(FetchError) as caught:
        fetch("http://slow.test/metrics", deadline=0.2, max_bytes=1024)
    with pytest.raises(ValueError, match="resolving slow.test took longer than 0.2 s"):
        addresses.refused_targets("https://slow.test/hook")

    assert caught.value.kind == "timeout"
    assert caught.value.reason == "timed out after 0.2 s while resolving slow.test"
    assert time.monotonic() - started < 3.0


def test_a_failing_resolver_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def getaddrinfo(*args: Any, **kwargs: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)

    with pytest.raises(FetchError) as caught:
        fetch("http://missing.test/", deadline=1.0, max_bytes=1024)
    with pytest.raises(ValueError, match="cannot resolve missing.test: .*not known"):
        addresses.refused_targets("https://missing.test/hook")

    assert caught.value.kind == "dns"
    assert caught.value.reason.startswith("cannot resolve missing.test: ")


def test_ip_literals_resolve_without_a_lookup() -> None:
    assert resolve("127.0.0.1", 8000, 1.0) == [(socket.AF_INET, ("127.0.0.1", 8000))]
