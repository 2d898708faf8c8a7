"""Read a host or engine series for a chart from the finest tier that stays small.

A chart over ``span`` reads the finest source of ``collectors.retention.TIERS`` (raw 5 s samples,
then minute, ten-minute and hourly roll-ups) that has at most ``MAX_ROWS`` buckets in the span:
raw up to about 2 hours, minutes up to a day, ten minutes up to 10 days, hours beyond. Roll-up
points carry their bucket's min and max, so the downsampler keeps every dip.

A tier ends at the roll-up watermark (or at its last complete bucket); the rest of the range, up
to now, is read from the next finer tier and finally from raw samples, so every chart reaches
the latest collection whatever its resolution.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from collectors.models import EngineRollup, EngineSample, Rollup, Sample
from collectors.retention import TIERS
from dashboard.downsample import SeriesPoint

RAW_INTERVAL = 5.0  # seconds; the default collection interval, for choosing a source
MAX_ROWS = 1500  # per series per chart: the finest source with at most this many buckets wins


def resolution_for(span: timedelta) -> int:
    """Seconds per bucket of the source a chart over ``span`` reads; 0 for raw samples."""
    seconds = span.total_seconds()
    if seconds / RAW_INTERVAL <= MAX_ROWS:
        return 0
    for tier in TIERS:
        if seconds / tier.resolution <= MAX_ROWS:
            return tier.resolution
    return TIERS[-1].resolution


def source_label(resolution: int) -> str:
    """How the JSON names a source: "raw" or the tier's bucket ("1 min", "10 min", "1 h")."""
    return "raw" if resolution == 0 else next(t.label for t in TIERS if t.resolution == resolution)


def host_points(node_id: int, metric: int, start: datetime, resolution: int
                ) -> list[SeriesPoint]:
    """A host-memory series from ``start`` to now at ``resolution`` (0: raw)."""
    return _points(Sample.objects.filter(node_id=node_id, metric=metric),
                   Rollup.objects.filter(node_id=node_id, metric=metric), start, None, resolution)


def engine_points(engine_id: int, metric: int, start: datetime, end: datetime | None,
                  resolution: int) -> list[SeriesPoint]:
    """An engine series in [start, end] (``end`` None: to now) at ``resolution`` (0: raw)."""
    return _points(EngineSample.objects.filter(engine_id=engine_id, metric=metric),
                   EngineRollup.objects.filter(engine_id=engine_id, metric=metric),
                   start, end, resolution)


def _points(samples, rollups, start: datetime, end: datetime | None, resolution: int
            ) -> list[SeriesPoint]:
    finer = [tier.resolution for tier in TIERS if tier.resolution < resolution]
    points: list[SeriesPoint] = []
    since = start
    # The chosen tier, then the tail it does not cover yet from the minute tier, then raw.
    for seconds in ([resolution] + finer[:1] if resolution else []):
        rows = rollups.filter(resolution=seconds, start__gte=since)
        if end is not None:
            rows = rows.filter(start__lte=end)
        found = [SeriesPoint(at, lo, hi) for at, lo, hi
                 in rows.order_by("start").values_list("start", "min", "max")]
        points += found
        if found:
            since = found[-1].at + timedelta(seconds=seconds)
    raw = samples.filter(at__gte=since)
    if end is not None:
        raw = raw.filter(at__lte=end)
    points += [SeriesPoint(at, value, value)
               for at, value in raw.order_by("at").values_list("at", "value")]
    return points
