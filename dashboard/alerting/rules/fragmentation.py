"""Fragmentation: the huge-page-sized free blocks are gone, or compaction keeps failing, while
MemAvailable still looks fine; only a reboot gives the blocks back.

After about a week of serving, GB10 operators saw ~118 GiB MemAvailable with almost no large
free blocks in ``/proc/buddyinfo`` and millions of failed compactions; weight loads crawled or
the NVIDIA driver failed with NV_ERR_NO_MEMORY, and compacting by hand did not recover the
blocks: a reboot did (FujitsuPolycom/sparkring#173). The rule reads the fragmentation samples of
the node's latest collection (``collectors.fragmentation``) and recommends a reboot in the
node's next restart window: a window of the node itself, since a reboot stops every engine on
it (an engine's own window does not cover its neighbours).

When MemAvailable is low, scarce large blocks mean memory is running short, which the headroom
floor watches; the rule then cannot tell fragmentation apart and gives no value (an open alert
stays as it is: fragmentation does not heal while memory is full).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from collectors.hostmemory import latest_collection
from collectors.models import Engine, Metric, Node
from dashboard.alerting.conditions import Condition
from dashboard.alerting.rules.base import Rule, ThresholdSpec
from dashboard.restarts.models import RestartWindow
from dashboard.restarts.windows import WindowOccurrence, current_or_next
from sparkops.timetext import clock_text, span_text
from sparkops.units import fixed_gib_text, gib, size_text

METRICS = (Metric.BUDDY_FREE, Metric.FREE_IN_HUGE_BLOCKS, Metric.LARGEST_FREE_BLOCK,
           Metric.COMPACT_STALLS_PER_MIN, Metric.COMPACT_FAILS_PER_MIN, Metric.MEM_AVAILABLE,
           Metric.MEM_TOTAL)


def huge_free_floor_gib(thresholds: dict[str, Any], buddy_free_bytes: float) -> float:
    """Free memory in huge-page-sized blocks below this is exhausted: the smaller of the
    absolute floor and a share of all free memory (a box with little free memory at all is
    not judged by a floor it could never reach)."""
    return min(thresholds["huge_free_gib"],
               thresholds["huge_free_percent"] / 100 * gib(buddy_free_bytes))


def next_reboot_window(node: Node, now: datetime) -> WindowOccurrence | None:
    """The node's restart window open now or opening next (node windows only, enabled ones;
    one that cannot be read is passed over). One query, one bounded expansion per window."""
    best: WindowOccurrence | None = None
    for window in RestartWindow.objects.filter(node=node, engine__isnull=True, enabled=True):
        try:
            found = current_or_next(window, now)
        except ValueError:
            continue
        if found is not None and (best is None or found.start < best.start):
            best = found
    return best


def reboot_advice(node: Node, now: datetime) -> str:
    """Where a reboot of ``node`` fits, in words (UTC: the text is stored and mailed)."""
    found = next_reboot_window(node, now)
    if found is None:
        return (f"no restart window is set for {node.name}: add one (Restarts → Windows) and "
                "reboot the host in it")
    name = found.window.name if found.window is not None else "restart window"
    if found.contains(now):
        return (f"reboot the host in its restart window {name}, open now until "
                f"{clock_text(found.end, UTC)}")
    return (f"reboot the host in its next restart window, {name}: "
            f"{span_text(found.start, found.end, UTC)}")


def evaluate(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
             now: datetime) -> list[Condition]:
    """One condition for the node: free memory in huge-page-sized blocks (GiB) against the
    floor, forced below it while compaction keeps failing; None while it cannot be judged."""
    latest = latest_collection(node, now, settings.SPARKOPS_COLLECT_INTERVAL, METRICS)
    samples = latest.samples

    def value_of(metric: Metric) -> float | None:
        sample = samples.get(metric)
        return None if sample is None else sample.value

    def why(metric: Metric) -> str:
        sample = samples.get(metric)
        return sample.note if sample is not None and sample.note else \
            f"no {metric.label} sample in the latest collection"

    huge, free = value_of(Metric.FREE_IN_HUGE_BLOCKS), value_of(Metric.BUDDY_FREE)
    fails, available = value_of(Metric.COMPACT_FAILS_PER_MIN), value_of(Metric.MEM_AVAILABLE)
    total = value_of(Metric.MEM_TOTAL) or node.mem_total_bytes
    floor = huge_free_floor_gib(t, free) if free is not None else t["huge_free_gib"]
    details: dict[str, Any] = {
        "buddy_free_bytes": free, "huge_free_bytes": huge,
        "largest_free_block_bytes": value_of(Metric.LARGEST_FREE_BLOCK),
        "compact_stalls_per_min": value_of(Metric.COMPACT_STALLS_PER_MIN),
        "compact_fails_per_min": fails, "mem_available_bytes": available,
        "huge_free_floor_gib": floor,
    }

    def condition(value: float | None, summary: str) -> list[Condition]:
        return [Condition(
            rule=RULE.name, node_id=node.pk, engine_id=None, value=value, threshold=floor,
            clear=floor + t["hysteresis_gib"], direction="below", severity="warning",
            summary=f"{node.name}: {summary}", details=details)]

    if latest.collection is None or latest.stale or not latest.ok:
        return condition(None, "fragmentation unknown — no current collection of this node")
    if huge is None or free is None:
        missing = Metric.FREE_IN_HUGE_BLOCKS if huge is None else Metric.BUDDY_FREE
        return condition(None, f"fragmentation unknown — {why(missing)}")
    if available is None or not total:
        return condition(None, "fragmentation not judged — MemAvailable or MemTotal unknown")
    fine_from = t["available_fine_percent"] / 100 * total
    if available < fine_from:
        return condition(None, f"fragmentation not judged — MemAvailable "
                               f"{fixed_gib_text(available)} is below "
                               f"{t['available_fine_percent']:g} % of MemTotal, so scarce large "
                               "blocks mean memory is short (the headroom floor's concern)")
    failing = fails is not None and fails >= t["compact_fails_per_min"]
    value = gib(huge)
    if failing:
        value = min(value, floor - 0.001)
    fails_text = "unknown" if fails is None else f"{fails:.0f}/min"
    found = (f"{size_text(huge)} of {size_text(free)} free memory is in huge-page-sized blocks "
             f"(largest free block {size_text(value_of(Metric.LARGEST_FREE_BLOCK))}), "
             f"compaction failures {fails_text}")
    if value >= floor:
        return condition(value, f"{found}: large blocks are there")
    details["reboot_advice"] = advice = reboot_advice(node, now)
    return condition(value, (
        f"{found}, while MemAvailable is {fixed_gib_text(available)}: memory is fragmented; "
        "large allocations (weight loads, the NVIDIA driver's) may crawl or fail with "
        f"NV_ERR_NO_MEMORY until a reboot; {advice}"))


RULE = Rule(
    name="fragmentation",
    title="Memory fragmented",
    description=(
        "The free memory in huge-page-sized blocks (2 MiB on 4 KiB pages, 512 MiB on 64 KiB; "
        "from /proc/buddyinfo) is below the floor, or compaction keeps failing (/proc/vmstat), "
        "while MemAvailable still looks fine. Weight loads then crawl or the NVIDIA driver "
        "fails with NV_ERR_NO_MEMORY, and only a reboot restores the blocks "
        "(FujitsuPolycom/sparkring#173): the alert names the node's next restart window. "
        "The floor is min(huge_free_gib, huge_free_percent of the free memory)."
    ),
    for_seconds=600,
    evaluate=evaluate,
    repeat_seconds=24 * 3600,
    thresholds=(
        ThresholdSpec("huge_free_gib", "Floor", 2.0, "GiB",
                      "Free memory in huge-page-sized blocks below this counts as exhausted. "
                      "A launch check for a four-GB10 model (sparkring PR #202) asks for "
                      "6.25 GiB in 32 MiB blocks.", maximum=1024.0),
        ThresholdSpec("huge_free_percent", "Floor on small free memory", 10.0,
                      "% of free memory",
                      "The floor is the smaller of the absolute floor and this share of all "
                      "free memory.", maximum=100.0),
        ThresholdSpec("compact_fails_per_min", "Compaction failures", 10.0, "per min",
                      "Failed direct compactions this often also count as fragmented. The "
                      "fragmented GB10s of sparkring#173 averaged 80–130 a minute over a week "
                      "(0.8–1.35 M since boot)."),
        ThresholdSpec("available_fine_percent", "MemAvailable looks fine from", 20.0,
                      "% of MemTotal",
                      "Below this share MemAvailable is short itself, and the rule leaves the "
                      "node to the headroom floor.", maximum=100.0),
        ThresholdSpec("hysteresis_gib", "Hysteresis", 0.5, "GiB",
                      "A firing alert resolves only once the huge-page-sized free memory is "
                      "this far above the floor.", maximum=1024.0),
    ),
)
