"""scrape() against a real loopback server that fails in every way an engine's endpoint can:
truncated or oversized bodies, bodies that are not (vLLM's) Prometheus text, trickling or silent
servers, hang-ups, HTTP errors, redirects, refused connections and URLs that are not HTTP."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from collectors.vllm.scrape import ScrapeError, scrape, scrape_engines
from sparkops.testing.ports import free_port
from tests.scrape import faultserver
from tests.scrape.faultserver import FaultServer

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "vllm_metrics"
EXPOSITION = (FIXTURES / "vllm_0_33_hybrid_spec.txt").read_bytes()


def scrape_error(server: FaultServer, **limits: float) -> ScrapeError:
    with pytest.raises(ScrapeError) as caught:
        scrape(server.url(), **limits)
    reason = str(caught.value)
    assert reason == caught.value.reason
    assert "\n" not in reason
    return caught.value


def test_ok_returns_the_parsed_snapshot_and_asks_for_text_format() -> None:
    with FaultServer(faultserver.complete(EXPOSITION)) as server:
        snapshot = scrape(server.url())
    assert (snapshot.model_name, snapshot.requests_running) == ("nemotron-3-super", 3)
    assert snapshot.kv_cache_size_tokens == 1230848
    request = server.requests[0].decode()
    assert request.startswith("GET /metrics HTTP/1.1\r\n")
    assert "Accept: text/plain;version=0.0.4" in request


def test_ok_with_chunked_transfer() -> None:
    pieces = [EXPOSITION[i:i + 1000] for i in range(0, len(EXPOSITION), 1000)]
    with FaultServer(faultserver.chunked(pieces)) as server:
        assert scrape(server.url()).generation_tokens_total == 402117


def test_all_engines_of_a_data_parallel_server() -> None:
    body = (FIXTURES / "vllm_0_33_dp2_multiprocess.txt").read_bytes()
    with FaultServer(faultserver.complete(body)) as server:
        engines = scrape_engines(server.url())
    assert [engine.engine for engine in engines] == ["0", "1"]


def test_short_content_length_is_truncated() -> None:
    with FaultServer(faultserver.short_body(EXPOSITION[:120], declared=4000)) as server:
        error = scrape_error(server)
    assert str(error) == "truncated: got 120 of 4000 bytes"
    assert error.kind == "truncated"


def test_chunked_stream_cut_before_its_last_chunk_is_truncated() -> None:
    pieces = [EXPOSITION[:1000], EXPOSITION[1000:1500]]
    with FaultServer(faultserver.chunked(pieces, finish=False)) as server:
        error = scrape_error(server)
    assert str(error) == "truncated: chunked body ended early after 1500 bytes"


def test_close_delimited_body_cut_mid_line_is_caught_by_the_parser() -> None:
    cut = EXPOSITION[: EXPOSITION.index(b"vllm:generation_tokens_total{") + 60]
    with FaultServer(faultserver.close_delimited(cut)) as server:
        error = scrape_error(server)
    assert str(error).startswith("not Prometheus text: the last line does not end with a line feed")
    assert error.kind == "parse"


def test_html_error_page_is_not_prometheus_text() -> None:
    page = b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head></html>\n"
    with FaultServer(faultserver.complete(page, content_type="text/html")) as server:
        error = scrape_error(server)
    assert str(error) == "not Prometheus text: invalid metric name:<!DOCTYPE html>"


def test_random_bytes_are_not_prometheus_text() -> None:
    noise = bytes([0xFF]) + random.Random(7).randbytes(4096)
    with FaultServer(faultserver.complete(noise)) as server:
        error = scrape_error(server)
    assert str(error) == "not Prometheus text: byte 0xff at offset 0 is not UTF-8"


def test_prometheus_text_of_another_exporter_is_not_vllm() -> None:
    body = b"# TYPE node_load1 gauge\nnode_load1 0.21\n"
    with FaultServer(faultserver.complete(body)) as server:
        error = scrape_error(server)
    assert str(error).startswith("not a vLLM /metrics endpoint: ")


def test_huge_content_length_is_refused_before_reading() -> None:
    with FaultServer(faultserver.short_body(b"", declared=10 * 1024**3)) as server:
        error = scrape_error(server)
    assert str(error) == "response larger than 4 MiB (Content-Length: 10737418240)"
    assert error.kind == "too_large"


def test_chunked_stream_beyond_the_cap_is_refused() -> None:
    pieces = [b"# filler line of a never-ending exposition\n" * 100] * 400  # about 1.7 MB
    with FaultServer(faultserver.chunked(pieces)) as server:
        error = scrape_error(server, max_bytes=256 * 1024)
    assert str(error) == "response larger than 256 KiB"


def test_trickling_body_fails_at_the_total_deadline() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 4000\r\n\r\n"
    with FaultServer(faultserver.trickle(at_once=head, interval=0.3)) as server:
        started = time.monotonic()
        error = scrape_error(server, deadline=1.5)
        took = time.monotonic() - started
    assert str(error).startswith("timed out after 1.5 s while reading the body")
    assert error.kind == "timeout"
    assert took < 5


def test_trickling_status_line_fails_at_the_total_deadline() -> None:
    trickler = faultserver.trickle(slowly=b"HTTP/1.1 200 OK\r\nX-Slow: ", interval=0.3)
    with FaultServer(trickler) as server:
        started = time.monotonic()
        error = scrape_error(server, deadline=1.5)
        took = time.monotonic() - started
    assert str(error) == "timed out after 1.5 s while waiting for the response headers"
    assert took < 5


def test_server_that_never_answers_times_out() -> None:
    with FaultServer(faultserver.silent) as server:
        error = scrape_error(server, deadline=0.5)
    assert str(error) == "timed out after 0.5 s while waiting for the response headers"


def test_server_that_hangs_up_without_answering() -> None:
    with FaultServer(faultserver.hang_up) as server:
        error = scrape_error(server)
    assert str(error) == "server closed the connection without a response"


def test_http_500() -> None:
    responder = faultserver.complete(b"Internal Server Error", status="500 Internal Server Error")
    with FaultServer(responder) as server:
        error = scrape_error(server)
    assert str(error) == "HTTP 500 Internal Server Error"
    assert error.kind == "http_status"


def test_redirect_is_not_followed() -> None:
    with FaultServer(faultserver.complete(EXPOSITION)) as elsewhere:
        redirect = faultserver.complete(
            b"", status="302 Found", extra_headers=[f"Location: {elsewhere.url()}"])
        with FaultServer(redirect) as server:
            error = scrape_error(server)
    assert str(error) == f"redirect not followed: HTTP 302 to {elsewhere.url()}"
    assert error.kind == "redirect"
    assert elsewhere.connections == 0


def test_connection_refused() -> None:
    port = free_port()
    with pytest.raises(ScrapeError) as caught:
        scrape(f"http://127.0.0.1:{port}/metrics")
    assert str(caught.value) == f"connection refused (127.0.0.1:{port})"
    assert caught.value.kind == "refused"


def test_url_that_is_not_http() -> None:
    with pytest.raises(ScrapeError, match="^invalid URL: scheme must be http or https"):
        scrape("file:///etc/passwd")
