"""Read a host or engine series for a chart from the finest tier that stays small.

A chart over ``span`` reads the finest source of ``collectors.retention.TIERS`` (raw 5 s samples,
then minute, ten-minute and hourly roll-ups) that has at most ``MAX_ROWS`` buckets in the span:
raw up to about 2 hours, minutes up to a day, ten minutes up to 10 days, hours beyond. Roll-up
points carry their bucket's min and max, so the downsampler keeps every dip; when the chart's
own buckets are wider than the tier's, the database groups the rows into them (lowest min,
highest max), so only what the chart draws leaves it.

A tier is complete up to the node's roll-up watermark (``Node.rolled_up_until``), floored to its
bucket: the rest of the range is read from the minute tier up to the watermark and from raw
samples after it, so every chart reaches the latest collection whatever its resolution. With
no roll-up yet, a chart reads raw samples.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from django.db import connections
from django.db.models import BigIntegerField, CharField, F, Func, Max, Min, QuerySet
from django.db.models.functions import Cast

from collectors.models import (
    Engine,
    EngineRollup,
    EngineSample,
    GpuRollup,
    GpuSample,
    Node,
    Rollup,
    Sample,
)
from collectors.retention import MINUTE, TIERS, floor_to
from dashboard.downsample import SeriesPoint

MAX_ROWS = 1500  # per series per chart: the finest source with at most this many buckets wins


def resolution_for(span: timedelta, interval: float) -> int:
    """Seconds per bucket of the source a chart over ``span`` reads, with collections every
    ``interval`` seconds; 0 for raw samples."""
    seconds = span.total_seconds()
    if seconds / interval <= MAX_ROWS:
        return 0
    for tier in TIERS:
        if seconds / tier.resolution <= MAX_ROWS:
            return tier.resolution
    return TIERS[-1].resolution


def source_label(resolution: int) -> str:
    """How the JSON names a source: "raw" or the tier's bucket ("1 min", "10 min", "1 h")."""
    return "raw" if resolution == 0 else next(t.label for t in TIERS if t.resolution == resolution)


def chart_bucket_seconds(span: timedelta, max_points: int) -> float:
    """The width of the downsampler's buckets for a chart of ``max_points`` over ``span``
    (``dashboard.downsample``: a bucket emits at most three points)."""
    return span.total_seconds() / max(max_points // 3, 1)


def host_points(node: Node, metrics: Iterable[int], start: datetime, resolution: int,
                bucket_seconds: float = 0) -> dict[int, list[SeriesPoint]]:
    """Host-memory series from ``start`` to now at ``resolution`` (0: raw), by metric; roll-up
    rows grouped into buckets of ``bucket_seconds`` in the database when that is coarser."""
    found = _points(Sample.objects.filter(node_id=node.pk),
                    Rollup.objects.filter(node_id=node.pk), ("metric",), list(metrics), start,
                    None, resolution, node.rolled_up_until, bucket_seconds)
    return {metric: found.get((metric,), []) for metric in metrics}


def engine_points(engines: Iterable[Engine], metrics: Iterable[int], start: datetime,
                  end: datetime | None, resolution: int, bucket_seconds: float = 0
                  ) -> dict[tuple[int, int], list[SeriesPoint]]:
    """Series of one node's ``engines`` in [start, end] (``end`` None: to now) at
    ``resolution`` (0: raw), by (engine id, metric); grouped like :func:`host_points`."""
    engines, metrics = list(engines), list(metrics)
    if not engines:
        return {}
    ids = [engine.pk for engine in engines]
    found = _points(EngineSample.objects.filter(engine_id__in=ids),
                    EngineRollup.objects.filter(engine_id__in=ids), ("engine_id", "metric"),
                    metrics, start, end, resolution, engines[0].node.rolled_up_until,
                    bucket_seconds)
    return {(pk, metric): found.get((pk, metric), []) for pk in ids for metric in metrics}


def gpu_points(node: Node, metrics: Iterable[int], start: datetime, resolution: int,
               bucket_seconds: float = 0) -> dict[tuple[int, int], list[SeriesPoint]]:
    """The node's GPU series from ``start`` to now at ``resolution`` (0: raw), by (device
    index, metric), for every device with rows in range; grouped like :func:`host_points`."""
    return _points(GpuSample.objects.filter(node_id=node.pk),
                   GpuRollup.objects.filter(node_id=node.pk), ("device_index", "metric"),
                   list(metrics), start, None, resolution, node.rolled_up_until, bucket_seconds)


def _points(samples: QuerySet, rollups: QuerySet, keys: tuple[str, ...], metrics: list[int],
            start: datetime, end: datetime | None, resolution: int,
            rolled_up_until: datetime | None, bucket_seconds: float
            ) -> dict[tuple, list[SeriesPoint]]:
    """Series by ``keys`` (e.g. (engine id, metric)), one query per source for all of them:
    the chosen tier up to its last complete bucket, the minute tier up to the roll-up watermark,
    raw samples after it."""
    points: dict[tuple, list[SeriesPoint]] = {}
    pieces: list[tuple[int, datetime]] = []  # (resolution, covered until), oldest first
    if resolution and rolled_up_until is not None:
        pieces.append((resolution, floor_to(rolled_up_until, resolution)))
        if resolution != MINUTE.resolution:
            pieces.append((MINUTE.resolution, rolled_up_until))
    since = start
    width = int(bucket_seconds)
    for seconds, until in pieces:
        if until <= since:
            continue
        rows = rollups.filter(resolution=seconds, metric__in=metrics, start__gte=since,
                              start__lt=until if end is None else min(until, end))
        found = (_grouped(rows, keys, width) if width >= 2 * seconds else
                 _fetch(rows.order_by(*keys, "start"), "start", *keys, "min", "max"))
        for at, *key, low, high in found:
            points.setdefault(tuple(key), []).append(SeriesPoint(at, low, high))
        since = until
    rows = samples.filter(metric__in=metrics, at__gte=since)
    if end is not None:
        rows = rows.filter(at__lte=end)
    for at, *key, value in _fetch(rows.order_by(*keys, "at"), "at", *keys, "value"):
        points.setdefault(tuple(key), []).append(SeriesPoint(at, value, value))
    return points


class EpochBucket(Func):
    """The start, in whole seconds since the epoch, of the ``seconds``-wide bucket a timestamp
    falls in (SQLite and PostgreSQL)."""

    output_field = BigIntegerField()

    def __init__(self, expression: str, seconds: int) -> None:
        super().__init__(F(expression))
        self.seconds = int(seconds)

    def _bucket(self, compiler, connection, epoch: str) -> tuple[str, list]:
        sql, params = compiler.compile(self.source_expressions[0])
        return f"(({epoch.format(sql)} / {self.seconds}) * {self.seconds})", params

    def as_sqlite(self, compiler, connection, **extra):
        return self._bucket(compiler, connection, "CAST(strftime('%%s', {}) AS INTEGER)")

    def as_postgresql(self, compiler, connection, **extra):
        return self._bucket(compiler, connection,
                            "CAST(floor(date_part('epoch', {})) AS BIGINT)")


def _grouped(rows: QuerySet, keys: tuple[str, ...], width: int) -> list[tuple]:
    """Roll-up rows merged into ``width``-second buckets by the database: (bucket start,
    *keys, lowest min, highest max), so a chart receives its own resolution, not the tier's."""
    grouped = rows.annotate(bucket=EpochBucket("start", width)).values(*keys, "bucket") \
        .annotate(low=Min("min"), high=Max("max")).order_by(*keys, "bucket") \
        .values_list("bucket", *keys, "low", "high")
    return [(datetime.fromtimestamp(row[0], UTC), *row[1:]) for row in grouped]


def _fetch(rows: QuerySet, time_field: str, *fields: str) -> list[tuple]:
    """``rows.values_list(time_field, *fields)``, with the time parsed fast.

    A chart reads tens of thousands of rows, and Django turns each stored timestamp into an
    aware datetime in Python (SQLite's text; PostgreSQL's through a time-zone-aware loader),
    which costs more than the query itself. Here the time is selected as text and parsed by
    ``datetime.fromisoformat``: SQLite stores naive UTC, PostgreSQL sends its offset.
    """
    connection = connections[rows.db]
    suffix = "+00:00" if connection.vendor == "sqlite" else ""
    sql, params = rows.annotate(time_text=Cast(time_field, CharField())) \
        .values_list("time_text", *fields).query.sql_with_params()
    parse = datetime.fromisoformat
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [(parse(row[0] + suffix), *row[1:]) for row in cursor.fetchall()]
