"""A raw-socket HTTP server on 127.0.0.1 that misbehaves on purpose: a slow, truncated, oversized
or silent engine, served over a real loopback socket.

Each mode is a function that writes the bytes of a response, right or wrong, to the accepted
socket; the server reads the request head first and records it. Raw sockets rather than
``http.server`` because truncation and trickling need byte-level control.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from types import TracebackType

Responder = Callable[[socket.socket, threading.Event], None]


class FaultServer:
    """Serve ``responder`` to every connection on an ephemeral loopback port, until closed.

    ``requests`` holds each request's raw bytes (head and, with Content-Length, body).
    ``connections`` counts accepted connections, including ones that sent nothing.
    """

    def __init__(self, responder: Responder, *, tls: ssl.SSLContext | None = None) -> None:
        self._responder = responder
        self._tls = tls
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self._threads: list[threading.Thread] = []
        self.port: int = self._listener.getsockname()[1]
        self.requests: list[bytes] = []
        self.connections = 0

    def url(self, path: str = "/metrics") -> str:
        scheme = "https" if self._tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> FaultServer:
        self._spawn(self._accept_loop)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2)
        self._listener.close()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(2)
        try:
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)
        except OSError:
            conn.close()
            return
        with conn:
            try:
                self.requests.append(_read_request(conn))
                self._responder(conn, self._stop)
            except OSError:
                pass  # the client gave up first, which is what several tests provoke


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(4096)
        if not piece:
            return data
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            while len(body) < int(value):
                body += conn.recv(4096)
    return head + b"\r\n\r\n" + body



# --- responders -------------------------------------------------------------------------------


def complete(
    body: bytes,
    *,
    status: str = "200 OK",
    content_type: str = "text/plain; version=0.0.4; charset=utf-8",
    extra_headers: Iterable[str] = (),
) -> Responder:
    """A correct response with Content-Length."""
    head = [f"HTTP/1.1 {status}", f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}", *extra_headers]

    def respond(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)

    return respond


def short_body(body: bytes, *, declared: int) -> Responder:
    """Announce ``declared`` bytes, send ``body`` (fewer), then close."""

    def respond(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {declared}\r\n\r\n".encode() + body)

    return respond


def chunked(pieces: Iterable[bytes], *, finish: bool = True) -> Responder:
    """Chunked transfer of ``pieces``; without ``finish`` the last chunk never comes."""

    def respond(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in pieces:
            if stop.is_set():
                return
            conn.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        if finish:
            conn.sendall(b"0\r\n\r\n")

    return respond


def close_delimited(body: bytes) -> Responder:
    """HTTP/1.0 style: no length at all, the end of the body is the connection closing."""

    def respond(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body)

    return respond


def trickle(*, at_once: bytes = b"", slowly: bytes = b"", interval: float = 0.3) -> Responder:
    """Send ``at_once``, then ``slowly`` one byte per ``interval``, then "#" bytes forever.

    Each byte arrives well within any per-read timeout, so only a total deadline ends it.
    """

    def respond(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(at_once)
        stream = iter(slowly)
        while not stop.wait(interval):
            conn.sendall(bytes([next(stream, ord("#"))]))

    return respond


def silent(conn: socket.socket, stop: threading.Event) -> None:
    """Accept, read the request and never answer (a tarpit)."""
    stop.wait(10)


def hang_up(conn: socket.socket, stop: threading.Event) -> None:
    """Read the request and close without a word."""
