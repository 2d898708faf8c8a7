"""The one summary of an engine row, for the overview's cards and the JSON API alike.

Every figure is None when unknown, never 0; the ``*_text`` fields write them for people
(``sparkops.units``), the numbers stay numbers. A figure the engine's kind cannot report at all
reads "unknown — <why>" (``unknown``: the part's reason, from the kind's reader,
``collectors.kinds.registry``), so "not reported by Ollama" is never mistaken for "not read yet".
The phase is also written in words (``phase_text``: "sleeping (level 1)" for a vLLM engine
asleep), and speculative decoding is summed up by ``collectors.vllm.specdecode`` ("not
speculative" for an engine without it, never 0 %).
"""

from __future__ import annotations

from typing import Any

from collectors.kinds.registry import reader_for
from collectors.models import Engine
from collectors.redaction import mask_text
from collectors.vllm.logs import FACT_WORDS, PHASE_WORDS, SLEEPING_PHASES
from collectors.vllm.sleep import held_while_asleep
from collectors.vllm.specdecode import spec_decode_summary
from sparkops.units import UNKNOWN, gib, gib_text, tps_text

__all__ = ["engine_card"]

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def engine_card(engine: Engine) -> dict:
    """One engine summed up: the overview's card, and the JSON API's engine entries (which
    promise the fields in ``dashboard.exports.api.CARD_FIELDS``)."""
    config, startup, rates = engine.config or {}, engine.startup or {}, engine.rates or {}
    snapshot = (engine.metrics or {}).get("snapshot") or {}
    details = (engine.metrics or {}).get("details") or {}
    reader = reader_for(engine.kind)
    kv_bytes = snapshot.get("kv_cache_memory_bytes") or config.get("kv_cache_memory_bytes")
    kv_gib = startup.get("kv_cache_gib")
    if kv_gib is None and kv_bytes is not None:
        kv_gib = gib(kv_bytes, 2)
    usage = snapshot.get("kv_cache_usage")
    card = {
        "name": engine.name,
        "kind": engine.kind,
        "kind_title": reader.title,
        "model": _first(config.get("served_model_name"), config.get("model"),
                        snapshot.get("model_name")),
        "phase": engine.phase,
        "phase_text": PHASE_WORDS.get(engine.phase, engine.phase),
        "container_state": engine.container_state,
        "present": engine.present,
        "version": _first(startup.get("version"), (details.get("props") or {}).get("build_info"),
                          details.get("version")),
        "kv_gib": kv_gib,
        "kv_pinned": startup.get("kv_cache_pinned"),
        "kv_tokens": _first(startup.get("kv_cache_tokens"), snapshot.get("kv_cache_size_tokens")),
        "max_concurrency": startup.get("max_concurrency"),
        "concurrency_for_tokens": startup.get("concurrency_for_tokens"),
        "kv_usage_pct": round(usage * 100, 1) if usage is not None else None,
        "running": snapshot.get("requests_running"),
        "waiting": snapshot.get("requests_waiting"),
        "max_num_seqs": _first(config.get("max_num_seqs"),
                               (details.get("props") or {}).get("total_slots")),
        "prefill_tps": _rounded(rates.get("prefill_tokens_per_s"), 1),
        "decode_tps": _rounded(rates.get("decode_tokens_per_s"), 1),
        "ttft_p95_s": _rounded(rates.get("ttft_p95_s"), 2),
        "restarted": bool(rates.get("restarted")),
        "scrape_error": engine.last_scrape_error,
        "scrape_label": reader.endpoints,
        # Kept unmasked on the row (restarts poll it); shown without its credentials.
        "metrics_url": mask_text(engine.metrics_url),
        "findings": sorted(engine.findings or [],
                           key=lambda f: SEVERITY_ORDER.get(f.get("severity"), 3)),
        "memory_gib": gib(engine.memory_usage_bytes, 2),
        # What the engine itself says it holds (Ollama: its loaded models' sizes).
        "reported_gib": gib(details.get("size_bytes"), 2),
        "reported_gpu_gib": gib(details.get("size_vram_bytes"), 2),
        "models_text": details.get("state"),
        "unknown": {**reader.never_reported, **((engine.metrics or {}).get("unknown") or {})},
        # vLLM startup lines of a known kind whose figures did not parse (why one is unknown);
        # also shown as the "log-line-unparsed" finding.
        "startup_unparsed": list(startup.get("unparsed") or []),
        "sleep_text": _sleep_text(engine),
        # Speculative decoding over the last interval, or "not speculative".
        "spec_decode": spec_decode_summary(config, snapshot, rates)
        if engine.kind == "vllm" else None,
    }
    return _with_texts(card)


def _with_texts(card: dict) -> dict:
    """The card's figures formatted once for the templates (``*_text``); numbers stay numbers.
    An unknown figure of a part the kind cannot report carries the reason."""
    why = card["unknown"]
    card["kv_text"] = _or_why(gib_text(card["kv_gib"]), why.get("kv_pool"))
    card["memory_text"] = gib_text(card["memory_gib"])
    card["reported_text"] = gib_text(card["reported_gib"])
    card["prefill_text"] = _or_why(tps_text(card["prefill_tps"]), why.get("rates"))
    card["decode_text"] = _or_why(tps_text(card["decode_tps"]), why.get("rates"))
    card["kv_usage_text"] = UNKNOWN if card["kv_usage_pct"] is None \
        else f"{card['kv_usage_pct']} %"
    card["kv_usage_text"] = _or_why(card["kv_usage_text"], why.get("kv_usage"))
    card["ttft_text"] = _or_why(UNKNOWN if card["ttft_p95_s"] is None
                                else f"{card['ttft_p95_s']} s", why.get("ttft"))
    card["requests_unknown"] = why.get("requests")
    card["startup_unparsed_text"] = _unparsed_text(card)
    return card


def _sleep_text(engine: Engine) -> str | None:
    """A vLLM engine asleep, in words: its phase, what it still holds and gave back, and what
    vLLM itself measured as freed (its log's "Sleep mode freed … GiB"); None when awake."""
    if engine.phase not in SLEEPING_PHASES:
        return None
    startup = engine.startup or {}
    held = held_while_asleep(engine.phase, None, None, engine.config or {},
                             startup.get("version"))
    parts = [PHASE_WORDS[engine.phase]]
    if held is not None:
        parts += [note if note.startswith(_PART_WORDS[part]) else f"{_PART_WORDS[part]}: {note}"
                  for part, note in held.notes.items()]
    if startup.get("asleep") and startup.get("sleep_freed_gib") is not None:
        parts.append(f"vLLM logged {startup['sleep_freed_gib']} GiB freed as it fell asleep")
    return "; ".join(parts)


_PART_WORDS = {"weights": "weights", "kv_pool": "KV pool", "actual": "what its process"}


def _unparsed_text(card: dict) -> str | None:
    """The startup lines of a known kind whose figures did not parse, in words."""
    lines = card["startup_unparsed"]
    if not lines:
        return None
    told = "; ".join(
        f"“{line.get('message', '')}” ({FACT_WORDS.get(line.get('fact'), line.get('fact'))} "
        "left unknown)" for line in lines)
    count = len(lines)
    return (f"{card['kind_title']} printed {count} startup line{'' if count == 1 else 's'} "
            f"SparkOps recognised but could not read: {told}")


def _or_why(text: str, reason: str | None) -> str:
    """``text``, or "unknown — <reason>" when it is unknown and the kind says why."""
    return f"{UNKNOWN} — {reason}" if text == UNKNOWN and reason else text


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
