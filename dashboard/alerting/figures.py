"""An alert's figures for people: labelled values in units, never Python reprs.

The rules store their figures in ``Alert.details`` under keys that say their unit by suffix
(``*_bytes``, ``*_gib``, ``*_seconds``, ``*_tps``, ``*_mib_per_min``); this module writes them
as the pages and notices show them, and writes an alert's value and threshold in its rule's
unit (``Rule.value_unit``). A figure that is None is "unknown" (or the phrase a key declares),
never 0. Cost: none (no query).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sparkops.units import UNKNOWN, bytes_text, gib_text, tps_text

# Label, and what None means, of the keys the rules write. Other keys get a label from their
# name ("max_num_seqs" → "Max num seqs").
_LABELS: dict[str, tuple[str, str]] = {
    "engine": ("Engine", UNKNOWN),
    "headroom_bytes": ("Headroom", UNKNOWN),
    "margin_gib": ("Margin", UNKNOWN),
    "prefill_need_bytes": ("Prefill need", UNKNOWN),
    "prefill_need_source": ("Prefill need from", UNKNOWN),
    "prefill_estimate_bytes": ("Prefill need, estimated", "not estimated"),
    "prefill_observed_bytes": ("Prefill need, observed", "not observed yet"),
    "causes": ("Memory that grew", "none in the look-back window"),
    "mem_available_bytes": ("MemAvailable", UNKNOWN),
    "floor_gib": ("Floor", UNKNOWN),
    "swap_used_bytes": ("Swap in use", UNKNOWN),
    "swap_growth_mib_per_min": ("Swap growth", UNKNOWN),
    "reserved_bytes": ("Reserved by engines", UNKNOWN),
    "mem_total_bytes": ("MemTotal", UNKNOWN),
    "unknown": ("Engines whose reservation is unknown", "none"),
    "decode_tps": ("Decode, recent best", UNKNOWN),
    "baseline_decode_tps": ("Decode, usual", UNKNOWN),
    "prefill_tps": ("Prefill", UNKNOWN),
    "waiting_seconds": ("Requests waiting for", UNKNOWN),
    "max_num_seqs": ("Slots (max_num_seqs)", "vLLM default"),
    "restart_id": ("Latest restart", UNKNOWN),
    "restart_count": ("Restarts in this alert", UNKNOWN),
    "restarts": ("Restarts", "none"),
    "restart_ids": ("Restart ids", "none"),
    "restart_text": ("Latest restart, what happened", UNKNOWN),
    "status": ("Restart status", UNKNOWN),
    "outcome": ("Outcome", "none recorded"),
    "container_state": ("Container", UNKNOWN),
    "reason": ("Reason", "none"),
    "phase": ("Phase", UNKNOWN),
}
# Shown elsewhere on the page (the Cause line).
_HIDDEN = {"cause"}


def figure_rows(details: dict[str, Any]) -> list[tuple[str, str]]:
    """``details`` as (label, text) rows in the order the rule wrote them, the cause left out."""
    rows = []
    for key, value in details.items():
        if key in _HIDDEN:
            continue
        label, missing = _LABELS.get(key, (key.replace("_", " ").capitalize(), UNKNOWN))
        rows.append((label, figure_text(key, value, missing)))
    return rows


def figure_text(key: str, value: Any, missing: str = UNKNOWN) -> str:
    """One figure in its unit (told by ``key``'s suffix); ``missing`` for None or empty."""
    if value is None or value == "" or value == [] or value == {}:
        return missing
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return _number_text(key, value)
    if isinstance(value, list):
        return "; ".join(_item_text(item) for item in value)
    if isinstance(value, dict):
        return ", ".join(f"{k.replace('_', ' ')} {figure_text(k, v)}" for k, v in value.items()
                         if v not in (None, "", [], {}))
    if key.endswith("_at"):
        return _time_text(str(value))
    return str(value)


def value_text(rule: str, value: float | None) -> str:
    """An alert's value in its rule's unit."""
    if value is None:
        return UNKNOWN
    unit = _unit(rule)
    if unit == "restarts":
        count = round(value)
        return f"{count} restart" + ("" if count == 1 else "s")
    if unit == "down":
        return "down" if value >= 0.5 else "up"
    if unit == "fraction":
        return f"{value:.0%} of usual"
    if unit == "s":
        return f"{value:.0f} s"
    return gib_text(value)


def threshold_text(rule: str, threshold: float, clear: float | None, direction: str) -> str:
    """Where an alert of ``rule`` fires and clears, in the rule's unit."""
    unit = _unit(rule)
    if unit == "restarts":
        return "fires on a restart; clears once none is recent"
    if unit == "down":
        return "fires while down; clears when up"
    bad = "below" if direction == "below" else "above"
    text = f"fires {bad} {value_text(rule, threshold)}"
    return text if clear is None else f"{text}; clears at {value_text(rule, clear)}"


def _unit(rule: str) -> str:
    # Imported here: the rules import the models' neighbours, and this module is read by the
    # models themselves.
    from dashboard.alerting.rules import RULES

    found = RULES.get(rule)
    return found.value_unit if found is not None else "GiB"


def _number_text(key: str, value: float) -> str:
    if key.endswith("_bytes"):
        return bytes_text(value)
    if key.endswith("_gib"):
        return gib_text(value)
    if key.endswith("_seconds"):
        return f"{value:.0f} s"
    if key.endswith("_tps"):
        return tps_text(value)
    if key.endswith("_mib_per_min"):
        return f"{value:.0f} MiB/min"
    if key.endswith("_id") or isinstance(value, int):
        return f"#{value}" if key.endswith("_id") else f"{value:d}"
    return f"{value:g}"


def _item_text(item: Any) -> str:
    if isinstance(item, dict) and item.get("text"):
        return str(item["text"])
    return figure_text("", item)


def _time_text(value: str) -> str:
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    return moment.strftime("%Y-%m-%d %H:%M:%S %Z").strip()
