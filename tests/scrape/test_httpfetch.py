"""httpfetch.fetch on a real loopback server: requests, limits, TLS and address policy."""

from __future__ import annotations

import ipaddress
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from sparkops.httpfetch import FetchError, fetch
from tests.scrape import faultserver
from tests.scrape.faultserver import FaultServer

pytestmark = pytest.mark.slow


def fetch_error(url: str, **options: object) -> FetchError:
    options.setdefault("deadline", 2.0)
    options.setdefault("max_bytes", 1024)
    with pytest.raises(FetchError) as caught:
        fetch(url, **options)  # type: ignore[arg-type]
    return caught.value


def test_post_sends_body_and_headers_and_returns_the_response() -> None:
    responder = faultserver.complete(
        b"", status="204 No Content", extra_headers=["Retry-After: 3", "X-Seen: a", "X-Seen: b"])
    with FaultServer(responder) as server:
        result = fetch(server.url("/hook?x=1"), deadline=2.0, max_bytes=1024, method="POST",
                       headers={"Content-Type": "application/json"}, body=b'{"ok":true}',
                       accept_status=(200, 204))
    assert result.status == 204
    assert result.body == b""
    assert result.headers["retry-after"] == "3"
    assert result.headers["x-seen"] == "a, b"
    assert 0 < result.elapsed < 2.0
    request = server.requests[0]
    assert request.startswith(b"POST /hook?x=1 HTTP/1.1\r\n")
    assert b"Content-Type: application/json\r\n" in request
    assert request.endswith(b'\r\n\r\n{"ok":true}')


def test_status_error_keeps_status_and_headers_for_the_caller() -> None:
    responder = faultserver.complete(b"busy", status="503 Service Unavailable",
                                     extra_headers=["Retry-After: 30"])
    with FaultServer(responder) as server:
        error = fetch_error(server.url())
    assert (error.reason, error.kind, error.status) == (
        "HTTP 503 Service Unavailable", "http_status", 503)
    assert error.headers["retry-after"] == "30"


@pytest.mark.parametrize("size", [1024, 1025])
def test_byte_cap_is_exact(size: int) -> None:
    body = b"x" * size
    for responder in (faultserver.complete(body), faultserver.chunked([body[:1000], body[1000:]])):
        with FaultServer(responder) as server:
            if size <= 1024:
                assert fetch(server.url(), deadline=2.0, max_bytes=1024).body == body
            else:
                assert fetch_error(server.url()).kind == "too_large"


def test_forbidden_address_is_never_contacted() -> None:
    def public_only(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return address.is_global

    with FaultServer(faultserver.complete(b"secret")) as server:
        error = fetch_error(server.url(), allow_address=public_only)
    assert (error.kind, error.reason) == (
        "forbidden_address", "address 127.0.0.1 of 127.0.0.1 is not allowed")
    assert server.connections == 0


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://127.0.0.1/metrics", "invalid URL: scheme must be http or https"),
        ("http:///metrics", "invalid URL: no host"),
        ("http://127.0.0.1:99999/", "invalid URL: Port out of range"),
        ("http://user:pw@127.0.0.1/", "invalid URL: credentials in the URL are not supported"),
    ],
)
def test_invalid_urls_send_nothing(url: str, reason: str) -> None:
    error = fetch_error(url)
    assert error.kind == "invalid_url"
    assert error.reason.startswith(reason)


@pytest.mark.parametrize(("deadline", "max_bytes"), [(0, 10), (-1, 10), (float("inf"), 10), (1, 0)])
def test_missing_limits_are_a_programming_error(deadline: float, max_bytes: int) -> None:
    with pytest.raises(ValueError):
        fetch("http://127.0.0.1:1/", deadline=deadline, max_bytes=max_bytes)


def test_tls_handshake_is_bounded_by_the_deadline() -> None:
    # A plain server that never answers the ClientHello.
    with FaultServer(faultserver.silent) as server:
        url = server.url().replace("http://", "https://")
        error = fetch_error(url, deadline=0.5)
    assert error.reason == (
        f"timed out after 0.5 s in the TLS handshake with 127.0.0.1:{server.port}")


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=30,
    )
    return cert, key


def test_https_with_an_untrusted_certificate_fails_and_with_its_ca_succeeds(
    self_signed: tuple[Path, Path],
) -> None:
    cert, key = self_signed
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    with FaultServer(faultserver.complete(b"hello"), tls=server_context) as server:
        error = fetch_error(server.url())
        trusting = ssl.create_default_context(cafile=str(cert))
        result = fetch(server.url(), deadline=2.0, max_bytes=1024, ssl_context=trusting)
    assert error.kind == "tls"
    assert "CERTIFICATE_VERIFY_FAILED" in error.reason
    assert result.body == b"hello"
