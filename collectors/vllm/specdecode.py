"""Speculative decoding of a vLLM engine: how it was set up, and how well its drafts fare.

Set up with ``--speculative-config`` (``-sc``), a JSON object of vLLM's ``SpeculativeConfig``
(vllm/config/speculative.py of 0.33: ``method`` such as ``eagle``, ``eagle3``, ``mtp``, ``ngram``
or ``draft_model``; ``model``, the drafter; ``num_speculative_tokens``, the tokens drafted per
step), or the same keys as dotted flags (``--speculative-config.method eagle``: the
``--json-arg.key value`` form of vLLM's FlexibleArgumentParser, vllm/utils/argparse_utils.py);
releases 0.6-0.7 had ``--speculative-model`` and ``--num-speculative-tokens`` instead.

How well it fares comes from the engine's counters over the last interval
(``collectors.vllm.rates``): the acceptance rate (accepted / drafted tokens) and the tokens one
step yields (1 + accepted / drafts, the bonus token included), as vLLM's own
``SpecDecoding metrics`` line (vllm/v1/spec_decode/metrics.py ``SpecDecodingLogging``) and its
PromQL in ``SpecDecodingProm``'s docstring compute them. An engine without speculative decoding
is "not speculative", never 0 %; one that made no draft in the interval has no acceptance to
show. Pure functions over the stored ``Engine.config``, snapshot and rates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparkops.units import UNKNOWN

__all__ = ["SpeculativeSettings", "speculative_settings", "spec_decode_summary"]

NOT_SPECULATIVE = "not speculative"
_COUNTERS = ("spec_decode_drafts_total", "spec_decode_draft_tokens_total",
             "spec_decode_accepted_tokens_total")


@dataclass(frozen=True)
class SpeculativeSettings:
    """The launch's speculative decoding; each None when not given (vLLM then derives it)."""

    method: str | None
    model: str | None
    num_speculative_tokens: int | None


def speculative_settings(config: Mapping[str, Any]) -> SpeculativeSettings | None:
    """The speculative decoding ``Engine.config`` (``collectors.vllm.flags``) asks for, or None
    when its launch has none."""
    flags = config.get("all_flags") or {}
    values: dict[str, Any] = {}
    json_config = config.get("speculative_config_json")
    if isinstance(json_config, Mapping):
        values.update(json_config)
    elif isinstance(config.get("speculative_config"), str):
        values.update(_loose_json(config["speculative_config"]))
    prefix = "speculative-config."
    for name, value in flags.items():
        if name.startswith(prefix) and isinstance(value, str):
            values[name[len(prefix):].replace("-", "_")] = value
    # 0.6-0.7: --speculative-model and --num-speculative-tokens (vllm/engine/arg_utils.py).
    if isinstance(flags.get("speculative-model"), str):
        values.setdefault("model", flags["speculative-model"])
    if isinstance(flags.get("num-speculative-tokens"), str):
        values.setdefault("num_speculative_tokens", flags["num-speculative-tokens"])
    if not values and config.get("speculative_config") is None:
        return None
    return SpeculativeSettings(
        method=_text(values.get("method")),
        model=_text(values.get("model")),
        num_speculative_tokens=_whole(values.get("num_speculative_tokens")),
    )


def spec_decode_summary(config: Mapping[str, Any], snapshot: Mapping[str, Any],
                        rates: Mapping[str, Any]) -> dict[str, Any]:
    """What the engine card and page show of speculative decoding: ``speculative``, the
    figures (``acceptance_pct``, ``tokens_per_step``, ``position_acceptance_pct``; None when
    unknown), the settings, and ``text`` in words ("acceptance 74.3 %, 3.2 tokens per step,
    method eagle, 4 speculative tokens", or "not speculative")."""
    settings = speculative_settings(config)
    counted = any(snapshot.get(name) is not None for name in _COUNTERS)
    if settings is None and not counted:
        return {"speculative": False, "acceptance_pct": None, "tokens_per_step": None,
                "position_acceptance_pct": None, "method": None,
                "num_speculative_tokens": None, "acceptance_source": None,
                "text": NOT_SPECULATIVE}
    acceptance = rates.get("spec_decode_acceptance_rate")
    source = "interval" if acceptance is not None else None
    if acceptance is None and snapshot.get("spec_decode_draft_acceptance_rate") is not None:
        acceptance, source = snapshot["spec_decode_draft_acceptance_rate"], "since start"
    per_step = rates.get("spec_decode_mean_acceptance_length")
    positions = rates.get("spec_decode_position_acceptance")
    per_position = snapshot.get("spec_decode_accepted_per_position_total")
    tokens = (settings.num_speculative_tokens if settings else None) \
        or (len(per_position) if per_position else None)
    summary = {
        "speculative": True,
        "acceptance_pct": None if acceptance is None else round(acceptance * 100, 1),
        "acceptance_source": source,
        "tokens_per_step": None if per_step is None else round(per_step, 1),
        "position_acceptance_pct": None if positions is None
        else [round(value * 100, 1) for value in positions],
        "method": settings.method if settings else None,
        "draft_model": settings.model if settings else None,
        "num_speculative_tokens": tokens,
    }
    summary["text"] = _words(summary)
    return summary


def _words(summary: Mapping[str, Any]) -> str:
    parts = []
    if summary["acceptance_pct"] is None:
        parts.append(f"acceptance {UNKNOWN} (no draft in the last interval)")
    elif summary["acceptance_source"] == "since start":
        parts.append(f"acceptance {summary['acceptance_pct']} % since start (vLLM's own gauge)")
    else:
        parts.append(f"acceptance {summary['acceptance_pct']} %")
    if summary["tokens_per_step"] is not None:
        parts.append(f"{summary['tokens_per_step']} tokens per step")
    if summary["method"]:
        parts.append(f"method {summary['method']}")
    elif summary["draft_model"]:
        parts.append(f"draft model {summary['draft_model']}")
    else:
        parts.append(f"method {UNKNOWN} (not in its flags)")
    if summary["num_speculative_tokens"] is not None:
        count = summary["num_speculative_tokens"]
        parts.append(f"{count} speculative token{'' if count == 1 else 's'}")
    return ", ".join(parts)


def _loose_json(text: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text)
    except ValueError:
        return {}
    return dict(parsed) if isinstance(parsed, dict) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.isdecimal():
        return int(value) or None
    return None
