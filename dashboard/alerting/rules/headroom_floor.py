"""Headroom floor: MemAvailable below a floor, or swap in use growing.

On GB10 the GPU allocates from the same memory as the host, and running out wedges the host
(NV_ERR_NO_MEMORY) instead of raising a CUDA OOM; the floor leaves room to act first.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from collectors.models import Engine, Metric, Node
from collectors.readings import HOST
from dashboard.alerting.conditions import Condition
from dashboard.alerting.rules.base import Rule, ThresholdSpec
from sparkops.prepared import PreparedRead
from sparkops.units import MIB, fixed_gib_text, gib


def floor_gib(thresholds: Mapping[str, float], mem_total_bytes: int | None) -> float:
    """The MemAvailable floor for a machine: min(floor_gib, floor_percent of MemTotal).

    With MemTotal unknown the absolute floor applies (never a share of a guessed total).
    """
    floor = thresholds["floor_gib"]
    if not mem_total_bytes:
        return floor
    return min(floor, thresholds["floor_percent"] / 100 * gib(mem_total_bytes))


def evaluate(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
             now: datetime) -> list[Condition]:
    """MemAvailable below the floor: on GB10 running out wedges the host instead of an OOM."""
    floor = floor_gib(t, ledger.get("mem_total") or node.mem_total_bytes)
    available = ledger.get("mem_available")
    growth = _swap_growth_mib_per_min(node, ledger, now)
    swapping = growth is not None and growth > t["swap_growth_mib_per_min"]
    # Growing swap counts as below the floor whatever MemAvailable says: it is how running short
    # shows before the host wedges.
    value = floor - 0.001 if swapping else gib(available)
    reason = (f"swap in use grows {growth:.0f} MiB/min" if swapping
              else f"MemAvailable {fixed_gib_text(available)} is below the floor of "
                   f"{floor:.2f} GiB")
    return [Condition(
        rule=RULE.name, node_id=node.pk, engine_id=None, value=value,
        threshold=floor, clear=floor + t["hysteresis_gib"], direction="below",
        severity="critical",
        summary=(f"{node.name}: {reason} (swap in use {fixed_gib_text(ledger.get('swap_used'))});"
                 " the host may wedge"),
        details={"mem_available_bytes": available, "floor_gib": floor,
                 "swap_used_bytes": ledger.get("swap_used"),
                 "swap_growth_mib_per_min": growth},
    )]


# The newest swap-in-use figure between two times (a prepared read: every round reads it).
_SWAP_USED_BETWEEN = PreparedRead(lambda node_id, since, until: HOST.holding(Metric.SWAP_USED)
                                  .filter(node_id=node_id, at__lte=until, at__gte=since)
                                  .order_by("-at").values_list("at", "value")[:1])


def _swap_growth_mib_per_min(node: Node, ledger: dict, now: datetime) -> float | None:
    """Swap-in-use growth over about the last minute, from the host samples (one query)."""
    current = ledger.get("swap_used")
    found = _SWAP_USED_BETWEEN(node.pk, now - timedelta(minutes=5), now - timedelta(seconds=50))
    earlier = found[0] if found else None
    if current is None or earlier is None:
        return None
    minutes = max((now - earlier[0]).total_seconds() / 60, 1 / 60)
    return (current - earlier[1]) / MIB / minutes


RULE = Rule(
    name="headroom-floor",
    title="Headroom floor",
    description=(
        "MemAvailable is below the floor, or swap in use is growing. On GB10 running out "
        "wedges the host (NV_ERR_NO_MEMORY) instead of raising a CUDA OOM. The floor is "
        "min(floor_gib, floor_percent of MemTotal): 7.9 GiB on a 121.7 GiB GB10, 8 GiB "
        "from 123 GiB up, and less on smaller machines, where 8 GiB would be a large "
        "share of all memory."
    ),
    for_seconds=30,
    evaluate=evaluate,
    thresholds=(
        ThresholdSpec("floor_gib", "Floor", 8.0, "GiB",
                      "Absolute floor for MemAvailable.", maximum=1024.0),
        ThresholdSpec("floor_percent", "Floor on small machines", 6.5, "% of MemTotal",
                      "The floor is the smaller of the absolute floor and this share "
                      "of MemTotal.", maximum=100.0),
        ThresholdSpec("swap_growth_mib_per_min", "Swap growth", 256.0, "MiB/min",
                      "Swap in use growing faster than this also counts as below the "
                      "floor."),
        ThresholdSpec("hysteresis_gib", "Hysteresis", 1.0, "GiB",
                      "A firing alert resolves only once MemAvailable is this far above "
                      "the floor.", maximum=1024.0),
    ),
)
