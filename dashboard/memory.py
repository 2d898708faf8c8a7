"""What the overview shows about a node's host memory: the current figures and the chart data.

Plain functions over the collectors' tables, shared by the HTML view and the JSON endpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from collectors.hostmemory import LatestCollection, latest_collection
from collectors.models import Collection, Metric, Node
from collectors.procfs import NO_LIMIT_NOTE
from collectors.readings import Sample
from collectors.sampling import stale_after
from dashboard.downsample import SeriesPoint, break_long_gaps, downsample
from sparkops.units import UNKNOWN, fixed_gib_text, gib

RANGES: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}


@dataclass(frozen=True)
class Figure:
    """One headline number, with what it means. ``value`` is None when unknown (never 0)."""

    key: str
    metric: Metric
    label: str
    help: str
    unit: str  # "GiB" or "%"


NO_SWAP = "no swap"  # how "Swap in use" reads where SwapTotal is 0
NO_LIMIT = "no limit"  # how the budget's room reads where the budget has no limit

FIGURES = [
    Figure("mem_available", Metric.MEM_AVAILABLE, "MemAvailable",
           "What the kernel can hand out without swapping, counting reclaimable page cache.",
           "GiB"),
    Figure("mem_available_min", Metric.MEM_AVAILABLE_MIN, "Lowest MemAvailable in the interval",
           "The dip a transient prefill buffer makes between two collections.", "GiB"),
    Figure("mem_free", Metric.MEM_FREE, "MemFree (≈ CUDA free on GB10)",
           "Truly unused memory. An engine starting now sees this as free, not MemAvailable.",
           "GiB"),
    # Shown only for a node whose engines run in a memory budget (see _budget_figure).
    Figure("budget_room_min", Metric.MEMORY_BUDGET_ROOM_MIN, "Room in the memory budget",
           "The budget's limit less what it holds (less its inactive page cache), lowest in the "
           "interval.", "GiB"),
    Figure("page_cache_reclaimable", Metric.PAGE_CACHE_RECLAIMABLE, "Reclaimable page cache",
           "Cached − Shmem + Buffers + SReclaimable: what dropping caches could give back.", "GiB"),
    Figure("swap_used", Metric.SWAP_USED, "Swap in use",
           "On GB10 swap use means memory ran short; running out wedges the host.", "GiB"),
    Figure("psi_some_avg10", Metric.PSI_SOME_AVG10, "Memory pressure (some, avg10)",
           "Share of the last 10 s in which some task stalled waiting for memory.", "%"),
]


def _scaled(figure: Figure, value: float | None) -> float | None:
    if value is None:
        return None
    return gib(value, 3) if figure.unit == "GiB" else round(value, 2)


def _display(figure: Figure, value: float | None) -> str:
    """The one formatting of a figure, shared by the page and its live updates."""
    if value is None:
        return UNKNOWN
    return fixed_gib_text(value) if figure.unit == "GiB" else f"{value:.2f} %"


def current_headroom(node: Node, now: datetime, interval: float) -> dict:
    """The latest collection's figures, whether it succeeded, and whether collection is stale.

    A stale collection's figures are still shown, under the ``stale`` warning: the last thing
    known about the node is what its operator needs to see. Cost: three indexed queries.
    """
    reading = latest_collection(node, now, interval,
                                [figure.metric for figure in FIGURES]
                                + [Metric.SWAP_TOTAL, Metric.MEMORY_BUDGET_LIMIT])
    latest = reading.collection
    last_failure = Collection.objects.filter(node=node, ok=False).order_by("-at").first()
    payload: dict = {
        "node": node.name,
        "mem_total_gib": gib(node.mem_total_bytes, 2) if node.mem_total_bytes else None,
        "interval_seconds": interval,
        "collected_at": latest.at.isoformat() if latest else None,
        "age_seconds": round(reading.age_seconds, 1) if reading.age_seconds is not None
        else None,
        "last_ok": reading.ok,
        "error": reading.error,
        "last_failure": (
            {"at": last_failure.at.isoformat(), "error": last_failure.error}
            if last_failure else None
        ),
        "stale": reading.stale,
        "figures": [],
    }
    no_swap = _no_swap(reading.samples.get(Metric.SWAP_TOTAL))
    for figure in FIGURES:
        sample = reading.samples.get(figure.metric)
        if figure.metric == Metric.MEMORY_BUDGET_ROOM_MIN:
            if sample is not None:  # no budget watched: no figure at all
                payload["figures"].append(_budget_figure(figure, sample, reading, node))
            continue
        value = sample.value if sample else None
        if sample is None:
            reason = reading.error if reading.ok is False else "no collection yet"
        else:
            reason = sample.note or ""
        display = _display(figure, value)
        if figure.metric == Metric.SWAP_USED and no_swap and value is not None:
            # Nothing can be in use where there is no swap: a 0 would read as "swap is fine".
            value, display, reason = None, NO_SWAP, "SwapTotal is 0: this machine has no swap."
        payload["figures"].append({
            "key": figure.key,
            "label": figure.label,
            "help": figure.help,
            "unit": figure.unit,
            "value": _scaled(figure, value),
            "display": display,
            "unknown_reason": reason if value is None else None,
        })
    return payload


def _budget_figure(figure: Figure, room: Sample, reading: LatestCollection, node: Node) -> dict:
    """The budget's lowest room, its help saying where the budget is, its limit and whether it
    bounds the headroom; "no limit" (not a number) for an unlimited budget."""
    limit = reading.samples.get(Metric.MEMORY_BUDGET_LIMIT)
    unlimited = limit is not None and limit.value is None and limit.note.startswith(NO_LIMIT_NOTE)
    cgroup = ((node.ledger or {}).get("budget") or {}).get("cgroup") or "(cgroup not recorded)"
    limit_text = NO_LIMIT if unlimited else _display(figure, limit.value if limit else None)
    where = f"Within the memory budget {cgroup} (limit {limit_text}): {figure.help}"
    entry = {"key": figure.key, "label": figure.label, "unit": figure.unit,
             "value": _scaled(figure, room.value), "display": _display(figure, room.value),
             "help": where, "unknown_reason": None}
    if room.value is None:
        entry["unknown_reason"] = room.note or "not read"
        if unlimited:
            entry["display"] = NO_LIMIT
            entry["unknown_reason"] = (f"{limit.note}: the budget has no room of its own, so "
                                       "MemAvailable bounds the headroom.")
        return entry
    host = reading.samples.get(Metric.MEM_AVAILABLE_MIN)
    host_value = host.value if host is not None else None
    if host_value is None or room.value <= host_value:
        entry["help"] += (" It bounds the headroom: the lowest MemAvailable is "
                          f"{_display(figure, host_value)}.")
    else:
        entry["help"] += (" The lowest MemAvailable, "
                          f"{_display(figure, host_value)}, is smaller and bounds the headroom.")
    return entry


def _no_swap(swap_total: Sample | None) -> bool:
    """Whether the latest collection's SwapTotal sample says the machine has no swap."""
    return swap_total is not None and swap_total.value == 0


def gap_step_seconds(span: timedelta, max_points: int, interval: float, resolution: int
                     ) -> float:
    """The longest step a line may bridge before it is broken into a gap.

    Three missed collections (raw) or three missed buckets (roll-ups), and never less than two
    downsampling buckets, so a reduced series is not chopped up by its own buckets.
    """
    bucket = span.total_seconds() / max(max_points // 3, 1)
    missed = stale_after(interval) if resolution == 0 else 3 * resolution
    return max(missed, 2 * bucket)


def collection_failures(node: Node, start: datetime, end: datetime) -> list[tuple[datetime, str]]:
    """Failed collections of ``node`` in [start, end], oldest first: (when, why)."""
    return list(
        Collection.objects.filter(node=node, ok=False, at__gte=start, at__lte=end)
        .order_by("at").values_list("at", "error")
    )


def reduce_series(points: list[SeriesPoint], failed_at: list[int], max_points: int,
                  step_seconds: float) -> list[tuple[int, float | None]]:
    """Failed collections (``failed_at``, epoch milliseconds) merged in as gaps, min-max
    downsampled, long silences broken into gaps."""
    merged = _merge_failures(points, failed_at)
    reduced = downsample(merged, max_points) if merged else []
    return break_long_gaps(reduced, step_seconds)


def _merge_failures(points: list[SeriesPoint], failed_at: list[int]) -> list[SeriesPoint]:
    if not failed_at:
        return points
    gaps = [SeriesPoint(at, None, None) for at in failed_at]
    return sorted(points + gaps, key=lambda point: point.at)
