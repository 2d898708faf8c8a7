"""Reduce a time series to a bounded number of points without losing its extremes.

Each input point carries a low and a high value (equal for raw samples; min and max for a
per-minute roll-up). The range is cut into equal time buckets and each bucket keeps the point of
its lowest low and the point of its highest high, in time order (the "min-max" family of
downsamplers, as used by M4). A single-sample dip therefore survives any zoom level, which a mean
or a stride would hide. ``None`` values are gaps and are kept (one per bucket) so the chart breaks
its line there instead of bridging an outage.

Times are whole milliseconds since the epoch (UTC), as the database gives them
(``dashboard.series``) and as the charts take them (Plotly reads them on a date axis): a chart
handles tens of thousands of points per request, and integers cost a fraction of datetimes.

Cost: one pass, O(n) time and O(buckets) memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def epoch_ms(moment: datetime) -> int:
    """An aware ``moment`` in whole milliseconds since the epoch, half a millisecond rounded up,
    as the database computes it (``dashboard.series.EpochMillis``)."""
    return ((moment - EPOCH) // _MICROSECOND + 500) // 1000


def from_epoch_ms(at: int) -> datetime:
    """The aware UTC datetime of ``at`` milliseconds since the epoch."""
    return EPOCH + timedelta(milliseconds=at)


class SeriesPoint(NamedTuple):
    """One point of a series: a raw sample (low == high) or a roll-up bucket (min, max), ``at``
    in milliseconds since the epoch. A named tuple: charts build tens of thousands of them per
    request."""

    at: int
    low: float | None
    high: float | None


Output = list[tuple[int, float | None]]


def downsample(points: Sequence[SeriesPoint], max_points: int) -> Output:
    """Return at most ``max_points`` (time, value) pairs keeping each bucket's min and max.

    ``points`` must be sorted by time. When the input already fits (counting both ends of
    roll-up points), it is returned unreduced.
    """
    if max_points < 3:
        raise ValueError("max_points must be at least 3")
    spread = sum(1 for _, low, high in points if low != high)
    if len(points) + spread <= max_points:
        if not spread:
            return [(at, low) for at, low, _ in points]
        return _expand(points)
    buckets = max_points // 3  # each bucket emits at most a low, a high and a gap
    start, end = points[0][0], points[-1][0]
    width = (end - start) / buckets
    kept: Output = []
    current_index = -1
    low: tuple[int, float] | None = None
    high: tuple[int, float] | None = None
    gap: int | None = None

    def flush() -> None:
        chosen: Output = []
        if low is not None:
            chosen.append(low)
        if high is not None and high != low:
            chosen.append(high)
        if gap is not None:
            chosen.append((gap, None))
        chosen.sort(key=lambda pair: pair[0])
        kept.extend(chosen)

    last_index = buckets - 1
    for at, point_low, point_high in points:
        index = min(int((at - start) / width), last_index) if width else 0
        if index != current_index:
            if current_index >= 0:
                flush()
            current_index, low, high, gap = index, None, None, None
        if point_low is None or point_high is None:
            if gap is None:
                gap = at
            continue
        if low is None or point_low < low[1]:
            low = (at, point_low)
        if high is None or point_high > high[1]:
            high = (at, point_high)
    flush()
    return kept


def _expand(points: Sequence[SeriesPoint]) -> Output:
    out: Output = []
    for at, low, high in points:
        out.append((at, low))
        if high != low:
            out.append((at, high))
    return out


def break_long_gaps(series: Output, max_step_seconds: float) -> Output:
    """Insert a ``None`` between consecutive points further apart than ``max_step_seconds``.

    Missing rows (the collector was not running) must show as a gap, not a straight line.
    """
    limit = max_step_seconds * 1000
    out: Output = []
    previous: int | None = None  # the time of the last point, when it was known
    for pair in series:
        at, value = pair
        if value is None:
            previous = None
        else:
            if previous is not None and at - previous > limit:
                out.append((previous + (at - previous) // 2, None))
            previous = at
        out.append(pair)
    return out
