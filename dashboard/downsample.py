"""Reduce a time series to a bounded number of points without losing its extremes.

Each input point carries a low and a high value (equal for raw samples; min and max for a
per-minute roll-up). The range is cut into equal time buckets and each bucket keeps the point of
its lowest low and the point of its highest high, in time order (the "min-max" family of
downsamplers, as used by M4). A single-sample dip therefore survives any zoom level, which a mean
or a stride would hide. ``None`` values are gaps and are kept (one per bucket) so the chart breaks
its line there instead of bridging an outage.

Cost: one pass, O(n) time and O(buckets) memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple


class SeriesPoint(NamedTuple):
    """One point of a series: a raw sample (low == high) or a roll-up bucket (min, max).
    A named tuple: charts build tens of thousands of them per request."""

    at: datetime
    low: float | None
    high: float | None


Output = list[tuple[datetime, float | None]]


def downsample(points: Sequence[SeriesPoint], max_points: int) -> Output:
    """Return at most ``max_points`` (time, value) pairs keeping each bucket's min and max.

    ``points`` must be sorted by time. When the input already fits (counting both ends of
    roll-up points), it is returned unreduced.
    """
    if max_points < 3:
        raise ValueError("max_points must be at least 3")
    if _expanded_size(points) <= max_points:
        return _expand(points)
    buckets = max_points // 3  # each bucket emits at most a low, a high and a gap
    start, end = points[0].at, points[-1].at
    width = (end - start) / buckets
    kept: list[list[tuple[datetime, float | None]]] = []
    current_index = -1
    low: tuple[datetime, float] | None = None
    high: tuple[datetime, float] | None = None
    gap: datetime | None = None

    def flush() -> None:
        chosen: list[tuple[datetime, float | None]] = []
        if low is not None:
            chosen.append(low)
        if high is not None and high != low:
            chosen.append(high)
        if gap is not None:
            chosen.append((gap, None))
        chosen.sort(key=lambda pair: pair[0])
        kept.append(chosen)

    for point in points:
        index = min(int((point.at - start) / width), buckets - 1) if width else 0
        if index != current_index:
            if current_index >= 0:
                flush()
            current_index, low, high, gap = index, None, None, None
        if point.low is None or point.high is None:
            gap = gap or point.at
            continue
        if low is None or point.low < low[1]:
            low = (point.at, point.low)
        if high is None or point.high > high[1]:
            high = (point.at, point.high)
    flush()
    return [pair for bucket in kept for pair in bucket]


def _expanded_size(points: Sequence[SeriesPoint]) -> int:
    return sum(1 if p.low == p.high else 2 for p in points)


def _expand(points: Sequence[SeriesPoint]) -> Output:
    out: Output = []
    for p in points:
        out.append((p.at, p.low))
        if p.high != p.low:
            out.append((p.at, p.high))
    return out


def break_long_gaps(series: Output, max_step_seconds: float) -> Output:
    """Insert a ``None`` between consecutive points further apart than ``max_step_seconds``.

    Missing rows (the collector was not running) must show as a gap, not a straight line.
    """
    out: Output = []
    for pair in series:
        if out and out[-1][1] is not None and pair[1] is not None \
                and (pair[0] - out[-1][0]).total_seconds() > max_step_seconds:
            out.append((out[-1][0] + (pair[0] - out[-1][0]) / 2, None))
        out.append(pair)
    return out
