"""Scrape a vLLM ``/metrics`` endpoint: fetch plus parse, all or nothing.

Either a complete, parsed snapshot comes back or :class:`ScrapeError` is raised with a one-line
reason, so a caller has nothing half-read to store: a failed scrape is a gap with a reason.

Cost: one HTTP request bounded by ``deadline`` (total) and ``max_bytes``, then parsing, which
runs at about 5 MB/s in prometheus_client, so the default 4 MiB cap bounds it to under a
second of CPU. A real vLLM exposition is a few hundred KiB.
"""

from __future__ import annotations

from collectors.vllm.metrics import (
    MetricsParseError,
    MetricsSnapshot,
    parse_engines,
)
from sparkops.httpfetch import FetchError, fetch

__all__ = ["DEFAULT_DEADLINE_S", "DEFAULT_MAX_BYTES", "ScrapeError", "scrape", "scrape_engines"]

DEFAULT_DEADLINE_S = 5.0
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
# Ask for the classic text format: prometheus_client answers OpenMetrics only when asked.
_ACCEPT = "text/plain;version=0.0.4;q=1.0, */*;q=0.1"


class ScrapeError(Exception):
    """A scrape that produced nothing usable. ``str(error)`` is a one-line reason.

    ``kind`` is :class:`~sparkops.httpfetch.FetchError`'s kind for transport failures
    ("timeout", "http_status", "too_large", "truncated", "refused", ...) and "parse" when the
    body was not a usable vLLM exposition.
    """

    def __init__(self, reason: str, *, kind: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


def scrape(
    url: str,
    *,
    deadline: float = DEFAULT_DEADLINE_S,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> MetricsSnapshot:
    """Fetch ``url`` and return the snapshot of its first engine (see ``parse_metrics_text``).

    Raises :class:`ScrapeError` on any failure; nothing partial is returned.
    """
    return scrape_engines(url, deadline=deadline, max_bytes=max_bytes)[0]


def scrape_engines(
    url: str,
    *,
    deadline: float = DEFAULT_DEADLINE_S,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[MetricsSnapshot, ...]:
    """Fetch ``url`` and return a snapshot per engine, for data-parallel or proxied servers."""
    try:
        response = fetch(url, deadline=deadline, max_bytes=max_bytes,
                         headers={"Accept": _ACCEPT})
    except FetchError as error:
        raise ScrapeError(error.reason, kind=error.kind) from error
    try:
        text = response.body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ScrapeError(
            f"not Prometheus text: byte 0x{response.body[error.start]:02x} at offset "
            f"{error.start} is not UTF-8", kind="parse") from None
    try:
        return parse_engines(text)
    except MetricsParseError as error:
        raise ScrapeError(error.reason, kind="parse") from error
