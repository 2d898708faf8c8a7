"""The roofline figure of the engine page: ceiling, measurement, ratio, verdict, explanations
and the texts the page shows. Reads the engine's row and its samples only: the model's
config.json is what the node's collector stored on the engine (``Engine.model_config``)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from collectors.models import Engine
from dashboard.roofline.measure import (
    Measured,
    busy_neighbours,
    peak_pressure,
    single_stream_decode,
)
from dashboard.roofline.params import (
    ACTIVE_PARAMS_LABEL,
    BYTES_PER_PARAM_LABEL,
    active_params,
    bytes_per_param,
    decode_ceiling_tps,
    kv_bytes_per_context_token,
)
from sparkops.units import UNKNOWN, tps_text

# Below this share of the ceiling the page explains what may hold the engine back.
LOW_RATIO = 0.4
# Above this the inputs overstate the bytes per token (or speculative decoding is on).
ABOVE_RATIO = 1.05
PSI_PRESSURE_PERCENT = 5.0
NOT_MEASURED = "not measured yet (needs a moment with exactly one request)"
NOT_READ = "not read yet: the node's collector reads it while the container runs"


def stored_model_config(engine: Engine) -> tuple[dict[str, Any] | None, str]:
    """The model's config.json as the node's collector stored it on the engine, and where it was
    found (or why not)."""
    stored = engine.model_config or {}
    config = stored.get("config")
    return (config if isinstance(config, dict) else None), stored.get("source") or NOT_READ


def _finding_codes(engine: Engine) -> set[str]:
    return {f.get("code") for f in engine.findings or [] if isinstance(f, dict)}


def explain(engine: Engine, ratio: float | None, measured: Measured, bandwidth_gbps: float
            ) -> list[str]:
    """Plain reasons for a ratio below :data:`LOW_RATIO` (or above :data:`ABOVE_RATIO`)."""
    if ratio is None:
        return []
    if ratio > ABOVE_RATIO:
        return ["Measured faster than the ceiling: the inputs overstate the bytes read per token "
                "(a mixture-of-experts model counted as dense, or layers narrower than assumed), "
                "or speculative decoding produces several tokens per read. Set "
                f"{ACTIVE_PARAMS_LABEL} or {BYTES_PER_PARAM_LABEL} on the container."]
    if ratio >= LOW_RATIO:
        return []
    reasons = []
    codes = _finding_codes(engine)
    if "moe-backend-unset" in codes:
        reasons.append("Fallback kernel: --moe-backend is not set, so vLLM may pick slower MoE "
                       "kernels on this GPU without saying so (finding moe-backend-unset).")
    if "enforce-eager" in codes or (engine.config or {}).get("enforce_eager"):
        reasons.append("Eager mode: --enforce-eager turns CUDA graphs off, so every decode step "
                       "pays kernel-launch overhead (finding enforce-eager).")
    pressure = peak_pressure(engine, measured)
    if pressure is not None and pressure >= PSI_PRESSURE_PERCENT:
        reasons.append(f"Memory pressure: PSI (some, avg10) reached {pressure:.0f} % while this "
                       "was measured; tasks stalled waiting for memory.")
    neighbours = busy_neighbours(engine, measured.moments)
    if neighbours:
        busy = ", ".join(f"{name} ({count} of {measured.samples})"
                         for name, count in neighbours.items())
        reasons.append(f"A busy neighbour: {busy} generated at the same moments, sharing the "
                       f"node's {bandwidth_gbps:.0f} GB/s.")
    if not reasons:
        reasons.append("No known cause found (no fallback-kernel or eager-mode finding, no memory "
                       "pressure, no neighbour generating at the same time). Models with few "
                       "active parameters rarely get close: per-token work other than reading "
                       "weights (attention, sampling, scheduling) weighs more.")
    return reasons


# --- the whole figure ----------------------------------------------------------------------------

def engine_roofline(engine: Engine, now: datetime, *, bandwidth_gbps: float,
                    interval: float) -> dict:
    """Everything the engine page shows about the roofline, as JSON-ready data.

    The model's config.json is the one stored on ``engine`` (:func:`stored_model_config`); a
    few queries of the engine's samples. Keys: ``ceiling_tps``, ``measured_tps``, ``ratio``
    (None when unknown), their inputs, ``verdict`` ("unknown", "low", "fair", "good",
    "above"), ``explanations``, ``config_note`` and ``missing``.
    """
    model_config, config_note = stored_model_config(engine)
    active = active_params(engine, model_config)
    width = bytes_per_param(engine, model_config)
    per_token = active.value * width.value if active.value and width.value else None
    ceiling = decode_ceiling_tps(bandwidth_gbps, per_token)
    measured = single_stream_decode(engine, now, interval)
    ratio = measured.tps / ceiling if ceiling and measured.tps else None
    kv_per_context = kv_bytes_per_context_token(model_config, (engine.config or {})
                                                .get("kv_cache_dtype"))
    missing = [text for text in (active.missing if active.value is None else "",
                                 width.missing if width.value is None else "") if text]
    # A kind that keeps no token counters (Ollama, trtllm-serve without Prometheus, …) will
    # never give a single-stream moment: say why instead of "not measured yet".
    no_rates = ((engine.metrics or {}).get("unknown") or {}).get("rates")
    not_measured = f"not measurable: {no_rates}" if no_rates else NOT_MEASURED
    if measured.tps is None:
        missing.append(not_measured)
    return _with_texts({
        "bandwidth_gbps": bandwidth_gbps,
        "active_params": asdict(active),
        "bytes_per_param": asdict(width),
        "bytes_per_token": per_token,
        "ceiling_tps": ceiling,
        "measured_tps": measured.tps,
        "measured_samples": measured.samples,
        "measured_from": measured.first_at.isoformat() if measured.first_at else None,
        "measured_to": measured.last_at.isoformat() if measured.last_at else None,
        "ratio": ratio,
        "verdict": _verdict(ratio),
        "explanations": explain(engine, ratio, measured, bandwidth_gbps),
        "kv_bytes_per_context_token": kv_per_context,
        "kv_share_at_8k": (8192 * kv_per_context / per_token) if kv_per_context and per_token
        else None,
        "config_note": config_note,
        "missing": missing,
        "not_measured_text": not_measured,
    })


def _with_texts(figure: dict) -> dict:
    """The figures formatted once for the page (``*_text``; numbers stay numbers for JSON)."""
    active, width = figure["active_params"]["value"], figure["bytes_per_param"]["value"]
    figure["active_text"] = UNKNOWN if active is None else f"{active / 1e9:.1f} B parameters"
    figure["bytes_per_param_text"] = UNKNOWN if width is None else f"{width:g} bytes"
    per_token = figure["bytes_per_token"]
    figure["bytes_per_token_text"] = UNKNOWN if per_token is None else f"{per_token / 1e9:.2f} GB"
    figure["ceiling_text"] = tps_text(figure["ceiling_tps"])
    figure["measured_text"] = tps_text(figure["measured_tps"]) \
        if figure["measured_tps"] is not None else figure["not_measured_text"]
    ratio = figure["ratio"]
    figure["ratio_text"] = UNKNOWN if ratio is None else f"{ratio:.2f}"
    figure["share_text"] = "" if ratio is None else f"{ratio:.0%} of the ceiling"
    figure["bar_pct"] = None if ratio is None else round(min(ratio, 1.0) * 100, 1)
    share = figure["kv_share_at_8k"]
    figure["kv_text"] = None if share is None else (
        f"KV reads are not in the ceiling: each token of context adds "
        f"{figure['kv_bytes_per_context_token'] / 1024:.0f} KiB per generated token, "
        f"+{share:.0%} at 8k tokens of context.")
    return figure


def _verdict(ratio: float | None) -> str:
    if ratio is None:
        return "unknown"
    if ratio > ABOVE_RATIO:
        return "above"
    if ratio < LOW_RATIO:
        return "low"
    return "fair" if ratio < 0.7 else "good"
