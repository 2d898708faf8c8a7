"""The one module through which SparkOps makes outbound HTTP requests, on either side: engine
scrapes and health checks on a node, webhooks from the centre.

Every request has a *total* deadline, a byte cap and an exact body length check; anything
unexpected raises :class:`FetchError` with a one-line ``reason`` and a machine-readable ``kind``.
A caller therefore gets either the whole, verified body or an error, never a partial body.

Why ``http.client`` and not ``requests``: ``requests`` (through urllib3) applies its timeout to
each socket operation, so a server that trickles a byte before every timeout holds a request
for as long as it likes, and a single ``iter_content`` step blocks until a whole chunk has
arrived. Enforcing a total deadline there means reaching into urllib3's
private socket objects. With ``http.client`` we own the socket: every ``recv`` is given the time
that is left, so status line, headers and body together cannot outlive the deadline. It also
brings no proxy settings from the environment, follows no redirects and decodes no content, so
what was received is what the caller sees.

Costs: one TCP (and TLS) connection per call, never reused; a host name other than an IP literal
is resolved on a short-lived thread so that a slow resolver is bounded by the deadline too. The
status line and headers are bounded by ``http.client``'s own limits (100 header lines of at most
64 KiB), not by ``max_bytes``.
"""

from __future__ import annotations

import functools
import http.client
import io
import ipaddress
import math
import selectors
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkops.units import exact_size_text

__all__ = ["FetchError", "FetchResult", "IPAddress", "fetch", "resolve"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_READ_SIZE = 64 * 1024
_REASON_LIMIT = 200
_DEFAULT_HEADERS = {"User-Agent": "SparkOps", "Connection": "close"}


class FetchError(Exception):
    """A request that did not produce a complete, accepted response.

    ``reason`` is one line meant for people ("HTTP 500", "timed out after 5.0 s while reading
    the body"); ``kind`` is for code: ``invalid_url``, ``dns``, ``forbidden_address``,
    ``refused``, ``connection``, ``tls``, ``timeout``, ``protocol``, ``http_status``,
    ``redirect``, ``too_large`` or ``truncated``. ``status`` and ``headers`` are set when the
    server answered with a status that was not accepted (for ``Retry-After`` and the like).
    """

    def __init__(
        self,
        reason: str,
        *,
        kind: str,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.status = status
        self.headers: Mapping[str, str] = dict(headers or {})


@dataclass(frozen=True)
class FetchResult:
    """A complete response: ``body`` has exactly the announced length and at most the cap.

    ``headers`` has lower-cased names; repeated headers are joined with ", ". ``elapsed`` is
    seconds from the start of the call until the body was complete.
    """

    status: int
    headers: Mapping[str, str] = field(repr=False)
    body: bytes = field(repr=False)
    elapsed: float


def fetch(
    url: str,
    *,
    deadline: float,
    max_bytes: int,
    connect_timeout: float = 2.0,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    accept_status: Collection[int] = (200,),
    allow_address: Callable[[IPAddress], bool] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> FetchResult:
    """Make one HTTP(S) request and return the whole response, or raise :class:`FetchError`.

    ``deadline`` bounds the whole call in seconds: name resolution, connect, TLS, sending,
    status line, headers and body. ``connect_timeout`` additionally bounds the TCP connect.
    The body is refused when ``Content-Length`` exceeds ``max_bytes`` (before reading it) or
    when more than ``max_bytes`` arrive; a body shorter than its ``Content-Length`` or a chunked
    body cut before its last chunk is refused as truncated. A body delimited only by the server
    closing the connection cannot be checked for truncation; callers whose format allows it
    should check the ending themselves.

    Redirects are never followed: a 3xx that is not in ``accept_status`` raises with the
    ``Location`` in the reason. ``allow_address``, when given, is asked about every address the
    host resolves to before connecting; if it refuses any of them nothing is sent.
    ``ssl_context`` replaces the default one (system CAs, hostname checked) for https.

    A non-positive ``deadline``, ``max_bytes`` or ``connect_timeout`` is a programming error
    (ValueError), not a FetchError.
    """
    if not (math.isfinite(deadline) and deadline > 0):
        raise ValueError(f"deadline must be a positive number of seconds, not {deadline!r}")
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be at least 1, not {max_bytes!r}")
    if not connect_timeout > 0:
        raise ValueError(f"connect_timeout must be positive, not {connect_timeout!r}")
    started = time.monotonic()
    clock = _Deadline(started, deadline)
    target = _Target.from_url(url)
    sock = _open_socket(target, clock, connect_timeout, allow_address, ssl_context)
    connection = _Connection(target, sock, clock)
    response: http.client.HTTPResponse | None = None
    try:
        response = _send(connection, target, clock, method, headers, body)
        _check_status(response, accept_status)
        payload = _read_body(response, clock, max_bytes)
        return FetchResult(
            status=response.status,
            headers=_header_dict(response),
            body=payload,
            elapsed=time.monotonic() - started,
        )
    finally:
        # The connection hands the socket to a response that announced "close", so both are
        # closed here; the socket is released when the last of them lets go.
        if response is not None:
            response.close()
        connection.close()


# --- deadline ---------------------------------------------------------------------------------


class _DeadlineExceeded(TimeoutError):
    """Raised by a socket read when no time is left; handled like a socket timeout."""


@dataclass(frozen=True)
class _Deadline:
    started: float
    seconds: float

    def remaining(self) -> float:
        return self.started + self.seconds - time.monotonic()

    def remaining_or_raise(self) -> float:
        left = self.remaining()
        if left <= 0:
            raise _DeadlineExceeded
        return left

    def expired_error(self, phase: str) -> FetchError:
        return FetchError(f"timed out after {_seconds(self.seconds)} s {phase}", kind="timeout")


class _DeadlineReader(io.RawIOBase):
    """Socket reader whose every ``recv`` may wait only for the time left before the deadline.

    It wraps the socket's own unbuffered file object so that the socket stays open while the
    response is being read, exactly as ``http.client``'s own file object would keep it.
    """

    def __init__(self, sock: socket.socket, clock: _Deadline) -> None:
        super().__init__()
        self._sock = sock
        self._clock = clock
        self._file = sock.makefile("rb", buffering=0)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self._sock.settimeout(self._clock.remaining_or_raise())
        return self._file.readinto(buffer)

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()


class _DeadlineResponse(http.client.HTTPResponse):
    """``HTTPResponse`` that reads status, headers and body through a :class:`_DeadlineReader`."""

    def __init__(self, sock: socket.socket, *args: Any, clock: _Deadline, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp.close()
        self.fp = io.BufferedReader(_DeadlineReader(sock, clock), _READ_SIZE)


class _Connection(http.client.HTTPConnection):
    """``HTTPConnection`` over a socket we opened (and, for https, wrapped) ourselves."""

    def __init__(self, target: _Target, sock: socket.socket, clock: _Deadline) -> None:
        super().__init__(target.host, target.port)
        self.default_port = target.default_port
        self.sock = sock
        self.response_class = functools.partial(_DeadlineResponse, clock=clock)

    def connect(self) -> None:
        raise http.client.NotConnected("httpfetch connections are opened before use")


# --- URL and socket ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str
    port: int
    path: str

    @property
    def default_port(self) -> int:
        return 443 if self.scheme == "https" else 80

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @classmethod
    def from_url(cls, url: str) -> _Target:
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as error:
            raise FetchError(f"invalid URL: {_one_line(str(error))}", kind="invalid_url") from None
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise FetchError(f"invalid URL: scheme must be http or https: {url!r}"[:_REASON_LIMIT],
                             kind="invalid_url")
        if not parts.hostname:
            raise FetchError(f"invalid URL: no host in {url!r}"[:_REASON_LIMIT], kind="invalid_url")
        if parts.username is not None or parts.password is not None:
            raise FetchError("invalid URL: credentials in the URL are not supported",
                             kind="invalid_url")
        path = parts.path or "/"
        if parts.query:
            path = f"{path}?{parts.query}"
        default_port = 443 if scheme == "https" else 80
        return cls(scheme, parts.hostname, port or default_port, path)


def _open_socket(
    target: _Target,
    clock: _Deadline,
    connect_timeout: float,
    allow_address: Callable[[IPAddress], bool] | None,
    ssl_context: ssl.SSLContext | None,
) -> socket.socket:
    addresses = _resolve(target, clock)
    if allow_address is not None:
        for _family, sockaddr in addresses:
            address = ipaddress.ip_address(sockaddr[0])
            if not allow_address(address):
                raise FetchError(f"address {address} of {target.host} is not allowed",
                                 kind="forbidden_address")
    sock = _connect_first(target, addresses, clock, connect_timeout)
    if target.scheme == "https":
        return _start_tls(sock, target, clock, ssl_context or ssl.create_default_context())
    return sock


def resolve(host: str, port: int | None, timeout: float) -> list[tuple[int, Any]]:
    """The (family, sockaddr) pairs ``socket.getaddrinfo`` gives for ``host`` (TCP), in the
    resolver's order, waiting at most ``timeout`` seconds.

    The lookup runs on a daemon thread so that a hanging resolver cannot hold the caller past
    its deadline; IP literals skip the thread. A lookup still running at the deadline is
    abandoned (its thread ends when the resolver gives up) and TimeoutError is raised; a failed
    lookup raises its OSError (``socket.gaierror``).
    """
    flags = socket.AI_NUMERICHOST if _is_ip_literal(host) else 0
    outcome: list[Any] = []

    def lookup() -> None:
        try:
            outcome.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=flags))
        except OSError as error:
            outcome.append(error)

    if flags:
        lookup()
    else:
        worker = threading.Thread(target=lookup, name="httpfetch-resolve", daemon=True)
        worker.start()
        worker.join(max(timeout, 0.0))
    if not outcome:
        raise TimeoutError(f"resolving {host} took longer than {timeout:g} s")
    if isinstance(outcome[0], OSError):
        raise outcome[0]
    return [(family, sockaddr) for family, _type, _proto, _name, sockaddr in outcome[0]]


def _resolve(target: _Target, clock: _Deadline) -> list[tuple[int, Any]]:
    """:func:`resolve` within what is left of the call's deadline, failures as FetchError."""
    try:
        return resolve(target.host, target.port, clock.remaining())
    except TimeoutError:
        raise clock.expired_error(f"while resolving {target.host}") from None
    except OSError as error:
        raise FetchError(f"cannot resolve {target.host}: {_one_line(str(error))}",
                         kind="dns") from None


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _connect_first(
    target: _Target,
    addresses: list[tuple[int, Any]],
    clock: _Deadline,
    connect_timeout: float,
) -> socket.socket:
    """Connect to the first address that accepts; each attempt is bounded by both limits."""
    last_error: FetchError | None = None
    for family, sockaddr in addresses:
        left = clock.remaining()
        if left <= 0:
            raise clock.expired_error(f"while connecting to {target.authority}")
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(min(connect_timeout, left))
        try:
            sock.connect(sockaddr)
            return sock
        except TimeoutError:
            sock.close()
            if clock.remaining() <= 0:
                raise clock.expired_error(f"while connecting to {target.authority}") from None
            last_error = FetchError(
                f"connect to {target.authority} timed out after {_seconds(connect_timeout)} s",
                kind="timeout")
        except ConnectionRefusedError:
            sock.close()
            last_error = FetchError(f"connection refused ({target.authority})", kind="refused")
        except OSError as error:
            sock.close()
            last_error = FetchError(
                f"cannot connect to {target.authority}: {_one_line(str(error))}",
                kind="connection")
    raise last_error or FetchError(f"no address for {target.host}", kind="dns")


def _start_tls(
    sock: socket.socket, target: _Target, clock: _Deadline, context: ssl.SSLContext
) -> socket.socket:
    """Do the TLS handshake with non-blocking steps so that it, too, ends at the deadline."""
    tls = context.wrap_socket(sock, server_hostname=target.host, do_handshake_on_connect=False)
    tls.setblocking(False)
    try:
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                _wait(tls, clock, for_write=False)
            except ssl.SSLWantWriteError:
                _wait(tls, clock, for_write=True)
    except _DeadlineExceeded:
        tls.close()
        raise clock.expired_error(f"in the TLS handshake with {target.authority}") from None
    except ssl.SSLError as error:
        tls.close()
        raise FetchError(f"TLS error with {target.authority}: {_one_line(str(error))}",
                         kind="tls") from None
    except OSError as error:
        tls.close()
        raise FetchError(f"connection to {target.authority} failed during TLS: "
                         f"{_one_line(str(error))}", kind="connection") from None
    tls.setblocking(True)
    return tls


def _wait(sock: socket.socket, clock: _Deadline, *, for_write: bool) -> None:
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_WRITE if for_write else selectors.EVENT_READ)
        if not selector.select(clock.remaining_or_raise()):
            raise _DeadlineExceeded


# --- request and response ---------------------------------------------------------------------


def _send(
    connection: _Connection,
    target: _Target,
    clock: _Deadline,
    method: str,
    headers: Mapping[str, str] | None,
    body: bytes | None,
) -> http.client.HTTPResponse:
    merged = {**_DEFAULT_HEADERS, **(headers or {})}
    phase = "while sending the request"
    try:
        connection.sock.settimeout(clock.remaining_or_raise())
        connection.request(method, target.path, body=body, headers=merged)
        phase = "while waiting for the response headers"
        return connection.getresponse()
    except TimeoutError:
        raise clock.expired_error(phase) from None
    except http.client.RemoteDisconnected:
        raise FetchError("server closed the connection without a response",
                         kind="connection") from None
    except (http.client.HTTPException, ValueError) as error:
        # ValueError: http.client refuses header names or values with line breaks.
        detail = _one_line(str(error)) or type(error).__name__
        raise FetchError(f"not a valid HTTP exchange: {detail}", kind="protocol") from None
    except OSError as error:
        raise FetchError(f"connection failed {phase}: {_one_line(str(error))}",
                         kind="connection") from None


def _check_status(response: http.client.HTTPResponse, accept_status: Collection[int]) -> None:
    status = response.status
    if status in accept_status:
        return
    headers = _header_dict(response)
    if 300 <= status < 400:
        location = headers.get("location", "(no Location header)")
        raise FetchError(f"redirect not followed: HTTP {status} to {_one_line(location)}",
                         kind="redirect", status=status, headers=headers)
    phrase = _one_line(response.reason or "")
    raise FetchError(f"HTTP {status} {phrase}".strip(), kind="http_status", status=status,
                     headers=headers)


def _read_body(response: http.client.HTTPResponse, clock: _Deadline, max_bytes: int) -> bytes:
    declared = response.length
    if declared is not None and declared > max_bytes:
        raise FetchError(
            f"response larger than {exact_size_text(max_bytes)} (Content-Length: {declared})",
            kind="too_large")
    pieces: list[bytes] = []
    received = 0
    try:
        while piece := response.read1(min(_READ_SIZE, max_bytes + 1 - received)):
            received += len(piece)
            if received > max_bytes:
                raise FetchError(f"response larger than {exact_size_text(max_bytes)}",
                                 kind="too_large")
            pieces.append(piece)
    except TimeoutError:
        raise clock.expired_error(f"while reading the body ({received} bytes received)") from None
    except http.client.IncompleteRead:
        raise FetchError(f"truncated: chunked body ended early after {received} bytes",
                         kind="truncated") from None
    except OSError as error:
        raise FetchError(f"truncated: {_one_line(str(error))} after {received} bytes",
                         kind="truncated") from None
    if declared is not None and received < declared:
        raise FetchError(f"truncated: got {received} of {declared} bytes", kind="truncated")
    return b"".join(pieces)


def _header_dict(response: http.client.HTTPResponse) -> dict[str, str]:
    merged: dict[str, str] = {}
    for name, value in response.getheaders():
        key = name.lower()
        merged[key] = f"{merged[key]}, {value}" if key in merged else value
    return merged


# --- formatting -------------------------------------------------------------------------------


def _one_line(text: str, limit: int = _REASON_LIMIT) -> str:
    """Collapse whitespace and control characters so that a reason stays one short line."""
    cleaned = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


def _seconds(value: float) -> str:
    return repr(round(float(value), 3))
