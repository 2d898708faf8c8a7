"""The one summary of an engine row, for the overview's cards and the JSON API alike.

Every figure is None when unknown, never 0; the ``*_text`` fields write them for people
(``sparkops.units``), the numbers stay numbers.
"""

from __future__ import annotations

from typing import Any

from collectors.models import Engine
from collectors.redaction import mask_text
from sparkops.units import gib, gib_text, tps_text

__all__ = ["engine_card"]

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def engine_card(engine: Engine) -> dict:
    """One engine summed up: the overview's card, and the JSON API's engine entries (which
    promise the fields in ``dashboard.exports.api.CARD_FIELDS``)."""
    config, startup, rates = engine.config or {}, engine.startup or {}, engine.rates or {}
    snapshot = (engine.metrics or {}).get("snapshot") or {}
    kv_bytes = snapshot.get("kv_cache_memory_bytes") or config.get("kv_cache_memory_bytes")
    kv_gib = startup.get("kv_cache_gib")
    if kv_gib is None and kv_bytes is not None:
        kv_gib = gib(kv_bytes, 2)
    usage = snapshot.get("kv_cache_usage")
    card = {
        "name": engine.name,
        "model": _first(config.get("served_model_name"), config.get("model"),
                        snapshot.get("model_name")),
        "phase": engine.phase,
        "container_state": engine.container_state,
        "present": engine.present,
        "version": startup.get("version"),
        "kv_gib": kv_gib,
        "kv_pinned": startup.get("kv_cache_pinned"),
        "kv_tokens": _first(startup.get("kv_cache_tokens"), snapshot.get("kv_cache_size_tokens")),
        "max_concurrency": startup.get("max_concurrency"),
        "concurrency_for_tokens": startup.get("concurrency_for_tokens"),
        "kv_usage_pct": round(usage * 100, 1) if usage is not None else None,
        "running": snapshot.get("requests_running"),
        "waiting": snapshot.get("requests_waiting"),
        "max_num_seqs": config.get("max_num_seqs"),
        "prefill_tps": _rounded(rates.get("prefill_tokens_per_s"), 1),
        "decode_tps": _rounded(rates.get("decode_tokens_per_s"), 1),
        "ttft_p95_s": _rounded(rates.get("ttft_p95_s"), 2),
        "restarted": bool(rates.get("restarted")),
        "scrape_error": engine.last_scrape_error,
        # Kept unmasked on the row (restarts poll it); shown without its credentials.
        "metrics_url": mask_text(engine.metrics_url),
        "findings": sorted(engine.findings or [],
                           key=lambda f: SEVERITY_ORDER.get(f.get("severity"), 3)),
        "memory_gib": gib(engine.memory_usage_bytes, 2),
    }
    return _with_texts(card)


def _with_texts(card: dict) -> dict:
    """The card's figures formatted once for the templates (``*_text``); numbers stay numbers."""
    card["kv_text"] = gib_text(card["kv_gib"])
    card["memory_text"] = gib_text(card["memory_gib"])
    card["prefill_text"] = tps_text(card["prefill_tps"])
    card["decode_text"] = tps_text(card["decode_tps"])
    return card


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
