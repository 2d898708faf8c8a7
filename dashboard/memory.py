"""What the overview shows about a node's host memory: the current figures and the chart data.

Plain functions over the collectors' tables, shared by the HTML view and the JSON endpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from collectors.models import Collection, Metric, Node, Sample
from dashboard.downsample import SeriesPoint, break_long_gaps, downsample
from dashboard.series import chart_bucket_seconds, host_points, resolution_for, source_label

GIB = 1024**3

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


FIGURES = [
    Figure("mem_available", Metric.MEM_AVAILABLE, "MemAvailable",
           "What the kernel can hand out without swapping, counting reclaimable page cache.",
           "GiB"),
    Figure("mem_available_min", Metric.MEM_AVAILABLE_MIN, "Lowest MemAvailable in the interval",
           "The dip a transient prefill buffer makes between two collections.", "GiB"),
    Figure("mem_free", Metric.MEM_FREE, "MemFree (≈ CUDA free on GB10)",
           "Truly unused memory. An engine starting now sees this as free, not MemAvailable.",
           "GiB"),
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
    return round(value / GIB, 3) if figure.unit == "GiB" else round(value, 2)


def _display(figure: Figure, value: float | None) -> str:
    """The one formatting of a figure, shared by the page and its live updates."""
    if value is None:
        return "unknown"
    if figure.unit == "GiB":
        return f"{value / GIB:.2f} GiB"
    return f"{value:.2f} %"


def current_headroom(node: Node, now: datetime, interval: float) -> dict:
    """The latest collection's figures, whether it succeeded, and whether collection is stale."""
    latest = Collection.objects.filter(node=node).order_by("-at").first()
    last_failure = Collection.objects.filter(node=node, ok=False).order_by("-at").first()
    payload: dict = {
        "node": node.name,
        "mem_total_gib": round(node.mem_total_bytes / GIB, 2) if node.mem_total_bytes else None,
        "interval_seconds": interval,
        "collected_at": latest.at.isoformat() if latest else None,
        "age_seconds": round((now - latest.at).total_seconds(), 1) if latest else None,
        "last_ok": latest.ok if latest else None,
        "error": latest.error if latest and not latest.ok else "",
        "last_failure": (
            {"at": last_failure.at.isoformat(), "error": last_failure.error}
            if last_failure else None
        ),
        "figures": [],
    }
    # Three intervals without a row means the worker or beat is not running.
    payload["stale"] = latest is None or (now - latest.at).total_seconds() > 3 * interval + 5
    samples = _latest_samples(node, latest) if latest and latest.ok else {}
    for figure in FIGURES:
        sample = samples.get(figure.metric)
        value = sample.value if sample else None
        if sample is None:
            reason = latest.error if latest and not latest.ok else "no collection yet"
        else:
            reason = sample.note or ""
        payload["figures"].append({
            "key": figure.key,
            "label": figure.label,
            "help": figure.help,
            "unit": figure.unit,
            "value": _scaled(figure, value),
            "display": _display(figure, value),
            "unknown_reason": reason if value is None else None,
        })
    return payload


def _latest_samples(node: Node, collection: Collection) -> dict[int, Sample]:
    # The interval minimum is stored at the instant it was seen, inside the window; naming the
    # metrics lets the database read one short (node, metric, at) index range for each.
    rows = Sample.objects.filter(
        node=node, metric__in=[figure.metric for figure in FIGURES],
        at__gte=collection.window_started_at, at__lte=collection.at,
    ).order_by("at")
    return {row.metric: row for row in rows}


def gap_step_seconds(span: timedelta, max_points: int, interval: float, resolution: int
                     ) -> float:
    """The longest step a line may bridge before it is broken into a gap.

    Three missed collections (raw) or three missed buckets (roll-ups), and never less than two
    downsampling buckets, so a reduced series is not chopped up by its own buckets.
    """
    bucket = span.total_seconds() / max(max_points // 3, 1)
    missed = 3 * interval + 5 if resolution == 0 else 3 * resolution
    return max(missed, 2 * bucket)


def collection_failures(node: Node, start: datetime, end: datetime) -> list[tuple[datetime, str]]:
    """Failed collections of ``node`` in [start, end], oldest first: (when, why)."""
    return list(
        Collection.objects.filter(node=node, ok=False, at__gte=start, at__lte=end)
        .order_by("at").values_list("at", "error")
    )


def reduce_series(points: list[SeriesPoint], failures: list[tuple[datetime, str]],
                  max_points: int, step_seconds: float) -> list[tuple[datetime, float | None]]:
    """Failures merged in as gaps, min-max downsampled, long silences broken into gaps."""
    merged = _merge_failures(points, failures)
    reduced = downsample(merged, max_points) if merged else []
    return break_long_gaps(reduced, step_seconds)


def chart_series(node: Node, range_key: str, now: datetime, max_points: int, interval: float
                 ) -> dict:
    """Series for the overview chart over ``range_key``, each at most ``max_points`` long."""
    span = RANGES[range_key]
    start = now - span
    resolution = resolution_for(span, interval)
    failures = collection_failures(node, start, now)
    step = gap_step_seconds(span, max_points, interval, resolution)
    points = host_points(node, [figure.metric for figure in FIGURES], start, resolution,
                         chart_bucket_seconds(span, max_points))
    series = []
    for figure in FIGURES:
        reduced = reduce_series(points[figure.metric], failures, max_points, step)
        series.append({
            "key": figure.key,
            "label": figure.label,
            "unit": figure.unit,
            "x": [at.isoformat() for at, _ in reduced],
            "y": [_scaled(figure, value) for _, value in reduced],
        })
    return {
        "node": node.name,
        "range": range_key,
        "start": start.isoformat(),
        "end": now.isoformat(),
        "source": source_label(resolution),
        "max_points": max_points,
        "series": series,
        "failures": [{"at": at.isoformat(), "error": error} for at, error in failures],
    }


def _merge_failures(points: list[SeriesPoint], failures: list[tuple[datetime, str]]
                    ) -> list[SeriesPoint]:
    if not failures:
        return points
    gaps = [SeriesPoint(at, None, None) for at, _ in failures]
    return sorted(points + gaps, key=lambda point: point.at)
