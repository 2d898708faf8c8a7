"""Overcommit: the engines' reservations add up to more than the node holds.

``--kv-cache-memory-bytes`` skips vLLM's own memory pre-check, so pinned engines that together
reserve more than MemTotal go straight to an out-of-memory failure when they start.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from collectors.models import Engine, Node
from dashboard.alerting.conditions import Condition
from dashboard.alerting.rules.base import Rule, ThresholdSpec
from sparkops.units import fixed_gib_text, gib


def evaluate(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
             now: datetime) -> list[Condition]:
    """The engines' reservations add up to more than the node holds.

    A pinned engine reserves weights + KV pool + graphs; an unpinned one needs
    ``--gpu-memory-utilization`` × MemTotal free when it starts; an Ollama server holds its
    loaded models. Unknown parts make the sum a lower bound: over the total is certain, under
    it is unknown.
    """
    total = ledger.get("mem_total") or node.mem_total_bytes
    if not total:
        return []
    known, unknown = _reserved(ledger, engines, total)
    excess = gib(known - total)
    value = excess if (excess > t["margin_gib"] or not unknown) else None
    return [Condition(
        rule=RULE.name, node_id=node.pk, engine_id=None, value=value,
        threshold=t["margin_gib"], clear=t["margin_gib"] - t["hysteresis_gib"],
        direction="above", severity="warning",
        summary=(f"{node.name}: engines reserve {fixed_gib_text(known)} of "
                 f"{fixed_gib_text(total)}"
                 + (f" (unknown: {', '.join(unknown)})" if unknown else "")),
        details={"reserved_bytes": known, "mem_total_bytes": total, "unknown": unknown},
    )]


# The parts of a reservation, as the ledger's engine shares name them.
_PARTS = (("weights", "weights"), ("kv_pool", "KV pool"), ("cuda_graphs", "CUDA graphs"))


def _reserved(ledger: dict, engines: list[Engine], total: int) -> tuple[int, list[str]]:
    """Bytes the ledger's engines are known to reserve, and those not wholly known, each with
    what is missing ("qwen (its CUDA graphs)"): their known parts still count, so the sum stays
    a lower bound. An engine that loads whole models on demand (Ollama) reserves what its
    loaded models hold now."""
    by_id = {e.pk: e for e in engines}
    known, unknown = 0, []
    for share in ledger.get("engines", []):
        engine = by_id.get(share["engine_id"])
        if engine is None:
            continue
        utilization = (engine.config or {}).get("gpu_memory_utilization")
        pinned = (engine.config or {}).get("kv_cache_memory_bytes") is not None
        if share.get("reserved") is not None:
            known += share["reserved"]
        elif share.get("loaded_models") is not None:
            known += share["loaded_models"]
        elif utilization is not None and not pinned:
            known += int(utilization * total)
        else:
            known += sum(share.get(key) or 0 for key, _ in _PARTS)
            missing = [words for key, words in _PARTS if share.get(key) is None]
            unknown.append(f"{engine.name} (its {' and '.join(missing)})")
    return known, unknown


RULE = Rule(
    name="overcommit",
    title="Overcommit",
    description=(
        "What the engines reserve (weights, KV pools and CUDA graphs when pinned; "
        "--gpu-memory-utilization × MemTotal otherwise) exceeds MemTotal plus the margin. "
        "--kv-cache-memory-bytes skips vLLM's own memory pre-check, so an over-commit "
        "goes straight to OOM."
    ),
    for_seconds=0,
    evaluate=evaluate,
    thresholds=(
        ThresholdSpec("margin_gib", "Margin", 0.0, "GiB",
                      "Room that must remain unreserved.", maximum=1024.0),
        ThresholdSpec("hysteresis_gib", "Hysteresis", 0.5, "GiB",
                      "A firing alert resolves only once reservations are this far "
                      "below the limit.", maximum=1024.0),
    ),
)
