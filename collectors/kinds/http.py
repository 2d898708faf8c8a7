"""Reading an engine's JSON and text endpoints: several GETs under one total deadline.

Every request goes through ``sparkops.httpfetch`` with vLLM's scrape cap (4 MiB) and what is
left of the read's deadline, so one read of several endpoints cannot outlive the deadline the
collection gave it. Any failure raises :class:`~collectors.vllm.scrape.ScrapeError` whose
reason starts with the request (``GET /props: HTTP 503``), so a page can say which endpoint
failed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from collectors.vllm.scrape import DEFAULT_MAX_BYTES, ScrapeError
from sparkops.httpfetch import FetchError, fetch

_REASON_LIMIT = 200


class Clock:
    """What is left of one read's total deadline, shared by its requests."""

    def __init__(self, deadline: float) -> None:
        self.end = time.monotonic() + deadline

    def left(self, path: str) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise ScrapeError(f"GET {path}: no time left of the read's deadline", kind="timeout")
        return left


def get(base_url: str, path: str, clock: Clock, *, accept: tuple[int, ...] = (200,)
        ) -> tuple[int, Mapping[str, str], bytes]:
    """One bounded GET of ``path``: (status, lower-cased headers, body)."""
    try:
        response = fetch(f"{base_url}{path}", deadline=clock.left(path),
                         max_bytes=DEFAULT_MAX_BYTES, accept_status=accept,
                         headers={"Accept": "application/json, text/plain;q=0.9"})
    except FetchError as error:
        raise ScrapeError(f"GET {path}: {error.reason}", kind=error.kind) from error
    return response.status, response.headers, response.body


def get_json(base_url: str, path: str, clock: Clock, *, accept: tuple[int, ...] = (200,)
             ) -> tuple[int, Any]:
    """One bounded GET of ``path`` whose body must be JSON: (status, decoded body)."""
    status, _, body = get(base_url, path, clock, accept=accept)
    try:
        return status, json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise parse_error(f"GET {path}: not JSON: {one_line(str(error))}") from None


def parse_error(reason: str) -> ScrapeError:
    """A body that is not what the endpoint serves (kind "parse", as vLLM's scrape)."""
    return ScrapeError(reason, kind="parse")


def one_line(text: str) -> str:
    """``text`` on one printable line of at most 200 characters."""
    cleaned = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return cleaned if len(cleaned) <= _REASON_LIMIT else cleaned[: _REASON_LIMIT - 1] + "…"
